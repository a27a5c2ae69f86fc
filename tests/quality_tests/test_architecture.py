"""Architecture rules that keep the spine intact (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    """The tuner never imports Kopf, kubernetes or the operator; only k8s.py imports the client."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    result = subprocess.run([exe], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower() or "0 broken" in result.stdout


def test_tuner_runs_without_kopf_or_kubernetes_loaded() -> None:
    code = (
        "import sys; from infertune_tuner.run import tune; import infertune_tuner.search; "
        "print(any(m.split('.')[0] in ('kopf', 'kubernetes') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


MAX_MODULE_LINES = 400


def test_no_source_module_over_400_lines() -> None:
    """Modules stay small enough to hold one concern (split by concern when one grows)."""
    too_long = {
        str(path.relative_to(REPO)): n
        for root in ("operator/src", "tuner/src")
        for path in (REPO / root).rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"
