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
