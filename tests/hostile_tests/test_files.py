"""Hostile manifest files: not YAML, not text, keys given twice, bombs; `validate`, `tune` and
`render` all answer with exit 2 and the file (and line:column where there is one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from .corpus import BASE, check, invoke

GOOD = yaml.safe_dump(BASE, sort_keys=False)
DUP_INPUT = GOOD.replace("inputTokens: 512", "inputTokens: 512\n    inputTokens: 10")
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)

# (id, file name, content, fragment)
FILES: list[tuple[str, str, str | bytes, str]] = [
    ("empty", "m.yaml", "", "holds no document"),
    ("comments-only", "m.yaml", "# nothing here\n", "holds no document"),
    ("separator-only", "m.yaml", "---\n---\n", "holds no document"),
    ("a-list", "m.yaml", "- 1\n- 2\n", "document 1 is not a mapping"),
    ("a-scalar", "m.yaml", "hello\n", "document 1 is not a mapping"),
    ("binary", "m.yaml", bytes(range(256)) * 4, "not UTF-8 text"),
    ("latin-1", "m.yaml", "name: caf\xe9\n".encode("latin-1"), "not UTF-8 text"),
    ("unclosed-bracket", "m.yaml", "spec: [1, 2\n", "m.yaml:2:1: not valid YAML"),
    ("tab-indent", "m.yaml", "spec:\n\tmodel: x\n", "m.yaml:2:1: not valid YAML"),
    ("bad-json", "m.json", '{"kind": ', "m.json:1:10: not valid JSON"),
    ("json-duplicate", "m.json", '{"kind": "A", "kind": "B"}', "duplicate key 'kind'"),
    (
        "json-nan",
        "m.json",
        json.dumps(
            {**BASE, "spec": {**BASE["spec"], "slo": {"e2eLatencyMs": {"p95": float("nan")}}}}
        ),
        "spec.slo.e2eLatencyMs.p95",
    ),
    (
        "yaml-duplicate-field",
        "m.yaml",
        DUP_INPUT,
        "m.yaml:13:5: not valid YAML: duplicate key 'inputTokens' (first given at line 12)",
    ),
    ("yaml-duplicate-top", "m.yaml", GOOD + "kind: Other\n", "duplicate key 'kind'"),
    ("yaml-duplicate-spec", "m.yaml", GOOD + "spec: {}\n", "duplicate key 'spec'"),
    (
        "yaml-duplicate-percentile",
        "m.yaml",
        GOOD.replace("p95: 60000", "p95: 60000\n      p95: 1"),
        "duplicate key 'p95'",
    ),
    ("deep-lists", "m.yaml", "[" * 20000 + "]" * 20000, "nested too deeply"),
    ("deep-maps", "m.yaml", "{a: " * 20000 + "1" + "}" * 20000, "nested too deeply"),
    ("deep-json", "m.json", "[" * 20000 + "]" * 20000, "nested too deeply"),
    ("forty-deep", "m.yaml", "[" * 40 + "]" * 40, "nested more than 32 levels deep"),
    ("billion-laughs", "m.yaml", GOOD + LAUGHS, "more than 100000 values"),
    (
        "billion-laughs-metadata",
        "m.yaml",
        LAUGHS + GOOD.replace("name: hostile", "name: hostile\n  bomb: *i"),
        "more than 100000 values",
    ),
    ("two-deployments", "m.yaml", GOOD + "---\n" + GOOD, "2 InferenceDeployment documents"),
    ("other-kinds-only", "m.yaml", "kind: ConfigMap\n---\nkind: Secret\n", "no document of kind"),
    ("unknown-tag", "m.yaml", "spec: !!python/object:os.system {}\n", "not valid YAML"),
]


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


COMMANDS: dict[str, Callable[[Path, Path], list[object]]] = {
    "validate": lambda m, _: ["validate", m],
    "tune": lambda m, out: ["tune", m, "--out", out, "--no-progress"],
    "render": lambda m, _: ["render", m, "--config", "tp=1,max_batch_size=8,quantization=bf16"],
}


@pytest.mark.parametrize(("name", "content", "fragment"), [c[1:] for c in FILES],
                         ids=[c[0] for c in FILES])  # fmt: skip
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_files(tmp_path: Path, command: str, name: str, content: str | bytes,
                   fragment: str) -> None:  # fmt: skip
    path = _write(tmp_path, name, content)
    result = invoke(COMMANDS[command](path, tmp_path / "out"))
    check(result, 2, fragment)
    assert str(path.name) in result.output


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_directory_or_nothing_instead_of_a_manifest(tmp_path: Path, command: str) -> None:
    check(invoke(COMMANDS[command](tmp_path, tmp_path / "out")), 2, "is a directory")
    missing = tmp_path / "missing.yaml"
    check(invoke(COMMANDS[command](missing, tmp_path / "out")), 2, f"{missing}: no such file")
