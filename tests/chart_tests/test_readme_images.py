"""The documents' install flow holds together: the images `scripts/images.sh` pushes, run as
README.md and docs/install.md show it, are the images the chart deploys when installed with the
`helm install` flags those documents show (same registry, same tag: the chart's appVersion).

Renaming `image.registry`, changing how the chart or the script composes the names, dropping the
`--set` from a document or letting its tag drift fails here. Nothing runs Docker: the script is
run with --dry-run, with a `docker` on PATH that records any call.
"""

from __future__ import annotations

import os
import re
import shlex
import string
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

RunHelm = Callable[..., subprocess.CompletedProcess[str]]

# Registry, port and path prefix: a sample that exercises every part of the form.
SAMPLE_REGISTRY = "registry.example.com:5000/ml"
SCRIPT = "scripts/images.sh"
DOCUMENTS = ["README.md", "docs/install.md"]
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def shell_lines(text: str) -> list[str]:
    """Logical lines of the fenced shell code blocks (indented ones too), continuations joined."""
    lines: list[str] = []
    language: str | None = None
    indent = ""
    pending = ""
    for raw in text.splitlines():
        fence = FENCE.match(raw)
        if fence:
            if language is None:
                indent, language = fence.group(1), fence.group(2)
            else:
                language = None
            continue
        if language not in SHELL_LANGUAGES:
            continue
        line = raw[len(indent) :] if raw.startswith(indent) else raw.lstrip()
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def commands(text: str) -> list[list[str]]:
    """The words of each shell line, comments dropped (lines shlex cannot split are skipped)."""
    out: list[list[str]] = []
    for line in shell_lines(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words:
            out.append(words)
    return out


def assignments(cmds: list[list[str]]) -> dict[str, str]:
    """`NAME=value` and `export NAME=value` lines."""
    found: dict[str, str] = {}
    for words in cmds:
        if words[0] == "export":
            words = words[1:]
        if len(words) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            name, _, value = words[0].partition("=")
            found[name] = value
    return found


def expand(word: str, env: dict[str, str], where: str) -> str:
    try:
        return string.Template(word).substitute(env)
    except KeyError as exc:
        raise AssertionError(f"{where}: {word!r} uses ${exc.args[0]}, which it never sets") from exc


def the_command(cmds: list[list[str]], is_it: Callable[[list[str]], bool], what: str) -> list[str]:
    found = [words for words in cmds if is_it(words)]
    assert len(found) == 1, f"expected one {what} command in its code blocks, found {found}"
    return found[0]


def is_images_command(words: list[str]) -> bool:
    return words[0] in (SCRIPT, f"./{SCRIPT}")


def is_helm_install(words: list[str]) -> bool:
    return words[:2] == ["helm", "install"]


def is_registry_install(words: list[str]) -> bool:
    """The install of the images a registry serves (not the kind quick start's local image)."""
    return is_helm_install(words) and any(w.startswith("image.registry=") for w in words)


def app_version(lib: ModuleType) -> str:
    chart = yaml.safe_load((lib.CHART / "Chart.yaml").read_text())
    return str(chart["appVersion"])


@pytest.fixture
def fake_docker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `docker` fails and leaves a trace: --dry-run must never call it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    trace = tmp_path / "docker-was-called"
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(trace))}\nexit 97\n')
    docker.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return env, trace


def run_script(
    lib: ModuleType, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(lib.REPO_ROOT / SCRIPT), *args],
        cwd=lib.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def pushed_images(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """target -> image of each `docker buildx build --target T --tag IMAGE --push .` printed."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    images: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        words = shlex.split(line)
        assert words[:3] == ["docker", "buildx", "build"], f"unexpected command: {line}"
        assert "--push" in words and words[-1] == ".", f"does not push the repository: {line}"
        target = words[words.index("--target") + 1]
        images[target] = words[words.index("--tag") + 1]
    return images


def helm_template(run_helm: RunHelm, lib: ModuleType, install: list[str]) -> list[dict[str, Any]]:
    """`helm install RELEASE CHART FLAGS...` rendered as `helm template RELEASE CHART FLAGS...`."""
    args = [
        str(lib.REPO_ROOT / word) if word.startswith(("charts/", "./charts/")) else word
        for word in install[2:]
    ]
    proc = run_helm("template", *args)
    assert proc.returncode == 0, f"helm template {shlex.join(args)} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def deployed_images(lib: ModuleType, docs: list[dict[str, Any]]) -> dict[str, str]:
    container = lib.operator_container(docs)
    env = lib.env_of(container)
    assert container["image"] == env["INFERTUNE_OPERATOR_IMAGE"]["value"]
    return {
        "operator": env["INFERTUNE_OPERATOR_IMAGE"]["value"],
        "tuner": env["INFERTUNE_TUNER_IMAGE"]["value"],
    }


@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_pushes_the_images_its_helm_install_deploys(
    run_helm: RunHelm,
    lib: ModuleType,
    fake_docker: tuple[dict[str, str], Path],
    document: str,
) -> None:
    cmds = commands((lib.REPO_ROOT / document).read_text())
    images_cmd = the_command(cmds, is_images_command, f"{document}: {SCRIPT}")
    install_cmd = the_command(
        cmds, is_registry_install, f"{document}: helm install --set image.registry"
    )

    # The registry comes from a variable the document sets (so its lines paste as they are);
    # the test gives that variable the sample registry.
    positional = [w for w in images_cmd[1:] if not w.startswith("-")]
    assert positional, f"{document}: {shlex.join(images_cmd)} names no registry"
    names = {a or b for a, b in VARIABLE.findall(positional[0])}
    env = assignments(cmds)
    missing = names - set(env)
    assert not missing, f"{document}: {shlex.join(images_cmd)} uses ${missing}, never set"
    env.update(dict.fromkeys(names, SAMPLE_REGISTRY))

    script_args = [expand(w, env, document) for w in images_cmd[1:]]
    docker_env, trace = fake_docker
    pushed = pushed_images(run_script(lib, docker_env, "--dry-run", *script_args))
    assert not trace.exists(), f"--dry-run called docker: {trace.read_text()}"
    assert set(pushed) == {"operator", "tuner"}, pushed

    version = app_version(lib)
    for target, image in pushed.items():
        assert image.startswith(f"{SAMPLE_REGISTRY}/"), f"{target}: {image} is not in the registry"
        assert image.endswith(f":{version}"), f"{target}: {image} is not tagged {version}"

    install = [expand(w, env, document) for w in install_cmd]
    deployed = deployed_images(lib, helm_template(run_helm, lib, install))
    assert deployed == pushed, (
        f"{document}: `{shlex.join(install)}` deploys {deployed}, "
        f"`{SCRIPT} {shlex.join(script_args)}` pushes {pushed}"
    )


@pytest.mark.parametrize("document", DOCUMENTS)
def test_image_tags_the_document_names_are_the_app_version(lib: ModuleType, document: str) -> None:
    text = (lib.REPO_ROOT / document).read_text()
    tags = set(re.findall(r"infertune-(?:operator|tuner):([\w.$-]+)", text))
    assert tags <= {app_version(lib)}, f"{document} names image tags {tags}"


@pytest.mark.parametrize("tag", [None, "0.2.0-rc1"])
def test_the_install_line_the_script_prints_deploys_what_it_pushed(
    run_helm: RunHelm,
    lib: ModuleType,
    fake_docker: tuple[dict[str, str], Path],
    tag: str | None,
) -> None:
    docker_env, _ = fake_docker
    proc = run_script(lib, docker_env, "--dry-run", SAMPLE_REGISTRY, *([tag] if tag else []))
    pushed = pushed_images(proc)
    assert all(image.endswith(f":{tag or app_version(lib)}") for image in pushed.values()), pushed
    (line,) = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("helm ")]
    install = shlex.split(line)
    assert is_helm_install(install), line
    assert deployed_images(lib, helm_template(run_helm, lib, install)) == pushed


def test_a_trailing_slash_changes_nothing(
    run_helm: RunHelm, lib: ModuleType, fake_docker: tuple[dict[str, str], Path]
) -> None:
    docker_env, _ = fake_docker
    plain = pushed_images(run_script(lib, docker_env, "--dry-run", SAMPLE_REGISTRY))
    slashed = pushed_images(run_script(lib, docker_env, "--dry-run", f"{SAMPLE_REGISTRY}/"))
    assert plain == slashed
    install = ["helm", "install", "infertune", "charts/infertune"]
    docs = helm_template(run_helm, lib, [*install, "--set", f"image.registry={SAMPLE_REGISTRY}/"])
    assert deployed_images(lib, docs) == plain


def test_repositories_win_over_the_registry(run_helm: RunHelm, lib: ModuleType) -> None:
    """Values written before image.registry existed keep their meaning."""
    install = ["helm", "install", "infertune", "charts/infertune"]
    docs = helm_template(
        run_helm,
        lib,
        [
            *install,
            "--set",
            f"image.registry={SAMPLE_REGISTRY}",
            "--set",
            "image.operator.repository=mirror.example.com/infertune/operator",
            "--set",
            "image.tuner.tag=custom",
        ],
    )
    version = app_version(lib)
    assert deployed_images(lib, docs) == {
        "operator": f"mirror.example.com/infertune/operator:{version}",
        "tuner": f"{SAMPLE_REGISTRY}/infertune-tuner:custom",
    }
    env = lib.env_of(lib.operator_container(docs))
    assert not env["INFERTUNE_TRITON_IMAGE"]["value"].startswith(SAMPLE_REGISTRY)


def test_kind_e2e_installs_the_image_it_loads(run_helm: RunHelm, lib: ModuleType) -> None:
    """scripts/kind-e2e.sh builds a local image, loads it into kind and sets no registry."""
    script = (lib.REPO_ROOT / "scripts" / "kind-e2e.sh").read_text()
    (image,) = re.findall(r'^IMAGE="([^"$]+)"$', script, re.MULTILINE)
    sets = re.findall(r"--set\s+([\w.]+=[^\s\\$]+)", script)
    assert any(s.startswith("image.") for s in sets), sets
    flags = [word for s in sets for word in ("--set", s)]
    docs = helm_template(
        run_helm, lib, ["helm", "install", "infertune", "charts/infertune", *flags]
    )
    assert lib.operator_container(docs)["image"] == image


def test_the_schema_refuses_a_registry_url(run_helm: RunHelm, lib: ModuleType) -> None:
    proc = run_helm(
        "template",
        "infertune",
        str(lib.CHART),
        "--set",
        "image.registry=https://registry.example.com/ml",
    )
    assert proc.returncode != 0
    assert "registry" in proc.stderr


def test_script_usage(lib: ModuleType, fake_docker: tuple[dict[str, str], Path]) -> None:
    docker_env, trace = fake_docker
    helped = run_script(lib, docker_env, "--help")
    assert helped.returncode == 0 and "usage: scripts/images.sh" in helped.stdout
    for bad in (
        [],
        ["--dry-run"],
        ["https://registry.example.com"],
        ["registry.example.com", "bad tag"],
    ):
        proc = run_script(lib, docker_env, *bad)
        assert proc.returncode != 0, f"accepted {bad}"
        assert "usage:" in proc.stderr, proc.stderr
    assert not trace.exists()
    # Without --dry-run it does call docker (here the fake, which fails: so does the script).
    proc = run_script(lib, docker_env, SAMPLE_REGISTRY)
    assert proc.returncode != 0 and trace.exists()


def test_the_kind_quick_start_deploys_the_image_it_loads(
    run_helm: RunHelm, lib: ModuleType
) -> None:
    """docs/install.md's kind block builds an image, loads it into kind, and installs the chart
    with no registry: the operator the chart deploys must be that very image."""
    cmds = commands((lib.REPO_ROOT / "docs" / "install.md").read_text())
    build = the_command(cmds, lambda w: w[:2] == ["docker", "build"], "docker build")
    loaded = the_command(cmds, lambda w: w[:3] == ["kind", "load", "docker-image"], "kind load")
    image = build[build.index("-t") + 1]
    assert loaded[3] == image, (build, loaded)
    install = the_command(cmds, lambda w: is_helm_install(w) and not is_registry_install(w),
                          "helm install without a registry")  # fmt: skip
    assert lib.operator_container(helm_template(run_helm, lib, install))["image"] == image


def test_every_document_installs_into_one_namespace(lib: ModuleType) -> None:
    found: dict[str, set[str]] = {}
    for document in [*DOCUMENTS, "charts/infertune/README.md", SCRIPT]:
        text = (lib.REPO_ROOT / document).read_text()
        for flag, namespace in re.findall(r"(--namespace|-n)[ =]([\w-]+)", text):
            if re.search(rf"helm [^\n]*{flag}[ =]{namespace}", text):
                found.setdefault(namespace, set()).add(document)
    assert list(found) == ["infertune-system"], found
