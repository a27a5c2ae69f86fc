"""Static checks of the Dockerfile (no Docker engine here): stages, pinning, non-root operator."""

from __future__ import annotations

import json
import re
import shlex

import pytest


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.partition(" ")
        out.append((word.upper(), rest.strip()))
        logical = ""
    return out


def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, args in _instructions(text):
        if word == "FROM":
            m = re.match(r"^(?:--platform=\S+\s+)?(\S+)\s+AS\s+(\S+)$", args, re.IGNORECASE)
            assert m, f"every stage is named: FROM {args}"
            current = m.group(2)
            stages[current] = [("FROM", m.group(1))]
        else:
            assert current, f"{word} before the first FROM"
            stages[current].append((word, args))
    return stages


@pytest.fixture(scope="module")
def dockerfile(lib) -> str:
    return lib.DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def stages(dockerfile):
    return _stages(dockerfile)


def test_both_stages_exist_as_grep_finds_them(dockerfile):
    found = re.findall(r"^FROM .* AS (operator|tuner)$", dockerfile, re.MULTILINE)
    assert sorted(found) == ["operator", "tuner"]


def test_tuner_stage_is_the_pinned_triton_trtllm_image(dockerfile):
    assert "FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 AS tuner" in dockerfile


def test_base_images_are_pinned(stages):
    for name, instructions in stages.items():
        image = instructions[0][1]
        if image in stages:  # FROM an earlier stage
            continue
        assert ":" in image.split("/")[-1] or "@sha256:" in image, f"{name}: {image} has no tag"
        tag = image.rsplit(":", 1)[-1]
        assert tag not in ("latest", "3", "3.11", "3.11-slim", "slim"), f"{name}: {image} floats"
        if image.startswith("python:"):
            assert re.match(r"^3\.11\.\d+-slim", tag), f"{name}: pin the patch release ({image})"


def _final_user(instructions) -> str | None:
    users = [args for word, args in instructions if word == "USER"]
    return users[-1] if users else None


def test_operator_stage_runs_as_numeric_non_root_user(stages):
    user = _final_user(stages["operator"])
    assert user is not None, "operator stage has no USER"
    uid = user.split(":")[0]
    assert uid == "10001", f"USER {user}: use the numeric UID 10001 (runAsNonRoot checks it)"


def test_operator_stage_installs_from_the_wheel_and_copies_no_source(stages):
    instructions = stages["operator"]
    for word, args in instructions:
        if word in ("COPY", "ADD"):
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            sources = parts[:-1]
            assert "." not in sources and "./" not in sources, f"{word} {args} copies the tree"
            assert "--from=builder" in args, f"{word} {args}: only build outputs, from the builder"
    runs = " ".join(args for word, args in instructions if word == "RUN")
    assert "infertune-" in runs and ".whl" in runs, "install infertune from the wheel"
    assert "pip install -e" not in runs and "pip install ." not in runs


def test_no_stage_copies_the_whole_context(stages):
    for name, instructions in stages.items():
        for word, args in instructions:
            if word in ("COPY", "ADD"):
                parts = [p for p in shlex.split(args) if not p.startswith("--")]
                assert "." not in parts[:-1], f"{name}: {word} {args}"


@pytest.mark.parametrize(
    ("stage", "cmd"),
    [("operator", ["operator", "--all-namespaces"]), ("tuner", None)],
)
def test_entrypoints(stages, stage, cmd):
    instructions = stages[stage]
    entrypoints = [json.loads(a) for w, a in instructions if w == "ENTRYPOINT"]
    assert entrypoints[-1] == ["infertune"]
    if cmd is not None:
        cmds = [json.loads(a) for w, a in instructions if w == "CMD"]
        assert cmds[-1] == cmd


def test_tuner_stage_installs_infertune_and_tritonclient(stages):
    runs = " ".join(args for word, args in stages["tuner"] if word == "RUN")
    assert "infertune-" in runs and ".whl" in runs
    assert "tritonclient[grpc]" in runs


@pytest.mark.parametrize("stage", ["tuner", "operator"])
def test_every_install_is_checked_for_broken_requirements(stages, stage):
    """A RUN that pip-installs also runs `pip check` afterwards, in the same layer: a dependency
    of infertune that breaks one of the image's own (TensorRT-LLM's in the tuner) fails the
    build, not the first trial."""
    installs = [a for w, a in stages[stage] if w == "RUN" and "pip install" in a]
    assert installs
    for args in installs:
        assert "pip check" in args.split("pip install", 1)[1], args


def test_operator_is_the_default_target(stages):
    assert list(stages)[-1] == "operator", "a plain `docker build .` should build the operator"


def test_dockerignore_keeps_local_state_out(lib):
    patterns = {
        line.strip()
        for line in (lib.REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for must in (
        ".git",
        ".venv",
        "venv",
        "**/__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".tools",
        "infertune-out",
        "**/*.egg-info",
        "tests",
    ):
        assert must in patterns, f".dockerignore lacks {must}"
    for needed in ("pyproject.toml", "operator", "tuner", "operator/src", "tuner/src"):
        assert needed not in patterns and f"!{needed}" not in patterns


def test_the_parser_sees_every_instruction(dockerfile):
    words = {w for w, _ in _instructions(dockerfile)}
    assert {"FROM", "RUN", "COPY", "USER", "ENTRYPOINT", "CMD", "WORKDIR"} <= words
