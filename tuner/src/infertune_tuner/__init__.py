"""infertune tuner: performance model, search, backends, harness and reports (no Kubernetes)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infertune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
