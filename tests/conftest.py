"""Shared fixtures: repository paths and an in-process CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()
