"""The API resources the operator reads and writes: their URL paths, and label matching (pure).

``client`` calls the API with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from infertune_operator.kube.errors import KubeError


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if sub:
            base += f"/{sub}"
        return base


INFERENCEDEPLOYMENTS = Resource("infertune.io", "v1alpha1", "inferencedeployments")
JOBS = Resource("batch", "v1", "jobs")
CONFIGMAPS = Resource("", "v1", "configmaps")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
SERVICES = Resource("", "v1", "services")
PODS = Resource("", "v1", "pods")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")

BY_KIND: dict[str, Resource] = {
    "InferenceDeployment": INFERENCEDEPLOYMENTS,
    "Job": JOBS,
    "ConfigMap": CONFIGMAPS,
    "Deployment": DEPLOYMENTS,
    "Service": SERVICES,
    "Pod": PODS,
    "ServiceAccount": SERVICEACCOUNTS,
    "RoleBinding": ROLEBINDINGS,
}


def resource_of(body: Mapping[str, Any]) -> Resource:
    kind = str(body.get("kind", ""))
    try:
        return BY_KIND[kind]
    except KeyError:
        raise KubeError(f"unsupported kind {kind!r}") from None


def labels_match(body: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = body.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
