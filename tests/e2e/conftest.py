"""kind end-to-end fixtures. scripts/kind-e2e.sh creates the cluster, builds and loads the operator
image, installs the chart and runs `pytest tests/e2e -m e2e`.

Without Docker (a reachable daemon), kind, or the kube context kind-<cluster>, everything here is
skipped with the reason. Under scripts/kind-e2e.sh (INFERTUNE_E2E_REQUIRED=1) those are failures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = os.environ.get("KIND_CLUSTER_NAME", "infertune-e2e")
CONTEXT = f"kind-{CLUSTER}"
OPERATOR_NAMESPACE = os.environ.get("INFERTUNE_E2E_OPERATOR_NAMESPACE", "infertune-system")
OPERATOR_DEPLOYMENT = os.environ.get("INFERTUNE_E2E_OPERATOR_DEPLOYMENT", "infertune")


def _load_kube_tools():
    key = "infertune_chart_tests_kube_tools"  # the same module object conftest in chart_tests uses
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            key, REPO_ROOT / "tests" / "chart_tests" / "kube_tools.py"
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def _unavailable(reason: str) -> None:
    if os.environ.get("INFERTUNE_E2E_REQUIRED", "") == "1":
        pytest.fail(f"kind e2e cannot run: {reason}", pytrace=False)
    pytest.skip(f"kind e2e: {reason} (scripts/kind-e2e.sh sets everything up)")


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def preflight() -> Path:
    """The kubectl to use, or skip saying what is missing."""
    if shutil.which("kind") is None:
        _unavailable("`kind` is not on PATH")
    if shutil.which("docker") is None:
        _unavailable("`docker` is not on PATH")
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _unavailable("`docker info` timed out: no Docker daemon reachable")
    if info.returncode != 0:
        _unavailable(f"docker cannot reach a daemon ({_first_line(info.stderr)})")
    tools = _load_kube_tools()
    try:
        kubectl = tools.find_tool("kubectl")
    except tools.ToolNotFound as exc:
        _unavailable(str(exc))
    contexts = subprocess.run(
        [str(kubectl), "config", "get-contexts", "-o", "name"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if CONTEXT not in contexts.stdout.split():
        _unavailable(f"no kube context {CONTEXT}")
    return kubectl


@dataclass
class Kube:
    """kubectl against the kind cluster only, through a private minified kubeconfig."""

    kubectl: Path
    kubeconfig: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.kubectl), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def infertune(
        self, *args: str, cwd: Path | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """`infertune ARGS` from this Python environment, against the kind cluster."""
        return subprocess.run(
            [sys.executable, "-m", "infertune_operator.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )

    def diagnostics(self, namespace: str) -> str:
        parts = []
        for args in (
            (
                "get",
                "infd,jobs,deployments,services,configmaps,pods",
                "-n",
                namespace,
                "-o",
                "wide",
            ),
            ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
            ("logs", "-n", OPERATOR_NAMESPACE, f"deployment/{OPERATOR_DEPLOYMENT}", "--tail=80"),
        ):
            proc = self.run(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return "\n".join(parts)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Kube:
    kubectl = preflight()
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    view = subprocess.run(
        [str(kubectl), "config", "view", "--minify", "--flatten", "--context", CONTEXT],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    kubeconfig.write_text(view.stdout)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    kube = Kube(kubectl=kubectl, kubeconfig=kubeconfig, env=env)
    ready = kube.run(
        "rollout",
        "status",
        "-n",
        OPERATOR_NAMESPACE,
        f"deployment/{OPERATOR_DEPLOYMENT}",
        "--timeout=120s",
        check=False,
    )
    if ready.returncode != 0:
        pytest.fail(
            f"the infertune operator is not running in {OPERATOR_NAMESPACE} "
            f"(helm install it first; scripts/kind-e2e.sh does):\n{ready.stderr}",
            pytrace=False,
        )
    return kube


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    name = f"infertune-e2e-{os.urandom(3).hex()}"
    kube.run("create", "namespace", name)
    try:
        yield name
    finally:
        kube.run("delete", "namespace", name, "--wait=false", check=False)
