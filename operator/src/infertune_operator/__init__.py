"""infertune operator: the Kubernetes side (API models, CRD, rendering, Kopf handlers, CLI)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infertune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
