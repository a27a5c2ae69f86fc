"""Architecture rules that keep the spine intact (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    """The tuner never imports Kopf, kubernetes or the operator; in the operator only its kube
    folder imports the client and only its engine imports Kopf; its folders keep their layers."""
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


# Imported only inside a guard that works without them (say so where they are imported).
OPTIONAL_IMPORTS = {
    "huggingface_hub",  # runtime/weights.py: the tuner image ships it
    "torch",  # triton_model/torch_body.py: only `--backend triton:torch`, on a GPU machine
    # triton_model/model.py: runs inside Triton's Python-backend stub, which provides it
    "triton_python_backend_utils",
    # runtime/llmapi_trial_model.py: a trial's model.py, beside the image's LLM-API model
    "helpers",
    "llmapi_model",
}


def _requirement_closure(dist: str) -> set[str]:
    """Distributions `pip install <dist>` brings in (no extras of its own), normalised names;
    an extra a requirement asks for (``tritonclient[grpc]``) brings in that extra's."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(canonicalize_name(dist), "")]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            child = canonicalize_name(req.name)
            todo += [(child, "")] + [(child, e) for e in req.extras]
    return {name for name, _ in seen}


def test_every_runtime_import_is_a_base_dependency() -> None:
    """`pip install -e .` (the README's first command) installs what the code imports."""
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    imported: set[str] = set()
    for root in ("operator/src", "tuner/src"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.add(node.module.split(".")[0])
    third_party = {
        m
        for m in imported - set(sys.stdlib_module_names) - OPTIONAL_IMPORTS
        if not m.startswith("infertune")
    }
    closure = _requirement_closure("infertune")
    providers = metadata.packages_distributions()
    missing = {
        m for m in third_party if not {canonicalize_name(d) for d in providers.get(m, [])} & closure
    }
    assert not missing, f"imported but not installed by `pip install -e .`: {sorted(missing)}"
