"""infertune operator: the Kubernetes side, in folders by concern.

``api`` (the InferenceDeployment types, the CRD, manifests), ``kube`` (the Kubernetes client
boundary), ``objects`` (the objects it creates), ``policy`` (its decisions), ``observe`` (what
the serving pods see), ``reports`` (the tuning report on the cluster), ``engine`` (Kopf and the
reconcile loop), ``jobs`` (what runs inside its Jobs); ``naming`` and ``settings`` beside them,
and ``cli``, the `infertune` command line. pyproject.toml's import contracts keep the layers.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infertune")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
