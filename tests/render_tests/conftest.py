"""The render tests check objects with the chart tests' offline validator (strict Kubernetes JSON
schemas from `kubernetes-validate`, and the official client's models)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

VALIDATOR = Path(__file__).resolve().parents[1] / "chart_tests" / "k8s_validation.py"


def _load() -> ModuleType:
    key = "infertune_chart_tests_k8s_validation"  # the chart tests' conftest uses the same key
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, VALIDATOR)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture(scope="session")
def strictly_valid() -> Any:
    """Asserts that objects pass the strict Kubernetes JSON schemas and the client's models."""
    k8s = _load()

    def check(objects: list[dict[str, Any]]) -> None:
        problems: list[str] = []
        for doc in objects:
            strict = k8s.strict_schema_errors(doc)
            assert strict is not None, "kubernetes-validate is a dev dependency: install it"
            problems += strict + k8s.structural_errors(doc)
        assert not problems, "\n".join(problems)

    return check
