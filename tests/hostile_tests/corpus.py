"""The hostile-input corpus: what every case checks, and the manifest the cases start from.

A case is an input (a manifest edit, flags, a file) and what the CLI must answer: an exit code
and a fragment of the message that names the offending field, option or path. Every case also
checks that no traceback reached the user and that no exception escaped the command.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from click.testing import Result
from typer.testing import CliRunner

from infertune_operator.cli import app

BASE: dict[str, Any] = {
    "apiVersion": "infertune.io/v1alpha1",
    "kind": "InferenceDeployment",
    "metadata": {"name": "hostile"},
    "spec": {
        "model": {"name": "llama-3-8b"},
        "gpu": {"product": "H100-SXM-80GB", "maxGpusPerReplica": 8},
        "workload": {"inputTokens": 512, "outputTokens": 128},
        "slo": {"e2eLatencyMs": {"p95": 60000}},
        "search": {
            "tensorParallel": [1, 2],
            "maxBatchSize": [8, 32],
            "quantization": ["bf16", "fp8"],
            "kvCacheDtype": ["auto"],
        },
        "tuning": {"maxTrials": 3, "seed": 1, "backend": "simulated", "sampler": "random"},
    },
}

Edit = Callable[[dict[str, Any]], None]


def put(path: str, value: Any) -> Edit:
    """Set ``spec.workload.inputTokens``-style ``path`` (creating mappings on the way)."""

    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def drop(path: str) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        del node[last]

    return edit


def rename(path: str, new_key: str) -> Edit:
    """Give the field at ``path`` another key (snake_case instead of camelCase)."""

    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        node[new_key] = node.pop(last)

    return edit


def both(*edits: Edit) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


def manifest(tmp_path: Path, *edits: Edit, name: str = "manifest.yaml") -> Path:
    doc = copy.deepcopy(BASE)
    for e in edits:
        e(doc)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def invoke(args: list[str], **kwargs: Any) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def check(result: Result, code: int, fragment: str) -> None:
    """The exit code, the message fragment, and no traceback or escaped exception."""
    out = result.output
    assert "Traceback" not in out, out
    escaped = result.exception
    assert escaped is None or isinstance(escaped, SystemExit), repr(escaped)
    assert result.exit_code == code, f"exit {result.exit_code}, expected {code}:\n{out}"
    assert fragment in out, f"{fragment!r} not in:\n{out}"
    if code == 2:
        assert "error" in out.lower() or "invalid" in out, out
