"""Shared data and helpers of the chart tests (loaded by conftest.py, handed out as `lib`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "infertune"
TOP_LEVEL_CRD = REPO_ROOT / "crds" / "inferencedeployments.infertune.io.yaml"
CHART_CRD = CHART / "crds" / TOP_LEVEL_CRD.name
SETTINGS_PY = REPO_ROOT / "operator" / "src" / "infertune_operator" / "settings.py"
DOCKERFILE = REPO_ROOT / "Dockerfile"
RELEASE_NAMESPACE = "infertune-system"
OPERATOR_UID = 10001

# Non-default values exercising every branch of the templates.
CUSTOM_VALUES: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "image": {
        "operator": {"repository": "registry.example.com/infertune/operator", "tag": "0.1.0-rc1"},
        "tuner": {"repository": "registry.example.com/infertune/tuner", "tag": "0.1.0-rc1"},
        "triton": {
            "repository": "registry.example.com/nvidia/tritonserver",
            "tag": "26.07-trtllm-python-py3",
        },
        "pullPolicy": "Always",
    },
    "imagePullSecrets": [{"name": "regcred"}],
    "tuner": {
        "defaultBackend": "simulated",
        "defaultMaxTrials": 12,
        "backoffLimit": 0,
        "serviceAccountName": "tuner-sa",
        "storage": {"existingSecret": "optuna-db", "existingSecretKey": "dsn"},
    },
    "modelStorage": {"pvc": "models"},
    "serviceAccount": {"annotations": {"example.com/role": "infertune"}},
    "extraArgs": ["--verbose"],
    "resources": {
        "requests": {"cpu": "200m", "memory": "512Mi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    },
    "podAnnotations": {"prometheus.io/scrape": "false"},
    "podLabels": {"team": "ml-platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"}
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                        ]
                    }
                ]
            }
        }
    },
}

STORAGE_URL_VALUES: dict[str, Any] = {
    "tuner": {"storage": {"url": "postgresql://optuna@optuna-db.infertune-system:5432/optuna"}}
}

# name -> (release name, values)
VALUE_SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("infertune", {}),
    "custom": ("tune", CUSTOM_VALUES),
    "storage-url": ("infertune", STORAGE_URL_VALUES),
}


Rule = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")

# What the operator may do in the namespaces it watches (brief of issue 7; see _helpers.tpl).
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    ("infertune.io", "inferencedeployments"): {"get", "list", "watch", "patch", "update"},
    ("infertune.io", "inferencedeployments/status"): {"get", "patch", "update"},
    ("infertune.io", "inferencedeployments/finalizers"): {"update"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "update"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "update"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/log"): {"get"},
    ("", "pods/proxy"): {"get"},  # the serving pods' metrics (observe.podProxy, on by default)
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    ("", "serviceaccounts"): {"get", "create"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create"},
}
CLUSTER_RULES: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"get", "list", "watch"},
}
TUNER_RULES: dict[tuple[str, str], set[str]] = {
    ("", "configmaps"): {"get", "create", "patch", "update"},
    ("infertune.io", "inferencedeployments"): {"get"},  # a stale tuner never writes its report
}


def expected_rules(
    table: dict[tuple[str, str], set[str]], bind_clusterrole: str | None = None
) -> set[Rule]:
    out = {(g, r, v, "") for (g, r), verbs in table.items() for v in verbs}
    if bind_clusterrole:
        out.add(("rbac.authorization.k8s.io", "clusterroles", "bind", bind_clusterrole))
    return out


def flatten_rules(role: dict[str, Any]) -> set[Rule]:
    """A Role/ClusterRole's rules as (group, resource, verb, resourceName) tuples."""
    out: set[Rule] = set()
    for rule in role.get("rules") or []:
        names = rule.get("resourceNames") or [""]
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                for v in rule.get("verbs") or []:
                    for n in names:
                        out.add((g, r, v, n))
    return out


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "operator"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or []}


def settings_env_names() -> set[str]:
    """Every INFERTUNE_* variable operator/settings.py reads."""
    return set(re.findall(r'"(INFERTUNE_[A-Z_]+)"', SETTINGS_PY.read_text()))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(name: str, kube_tools: ModuleType) -> Path:
    """The tool's path; without one, skip locally but fail in CI (CI=true)."""
    try:
        path: Path = kube_tools.find_tool(name)
    except kube_tools.ToolNotFound as exc:
        if in_ci():
            pytest.fail(f"CI=true but {exc}", pytrace=False)
        pytest.skip(f"{exc} (these tests fail instead of skipping when CI=true)")
    return path
