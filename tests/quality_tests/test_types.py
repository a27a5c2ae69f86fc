"""The project is mypy-clean: both packages and the benchmark scripts ([tool.mypy] in
pyproject.toml says what is checked and how strictly)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_mypy_finds_no_type_errors(tmp_path: Path) -> None:
    # A cache of its own: a stale shared cache must not hide an error, nor this run write one.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
