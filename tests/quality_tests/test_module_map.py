"""docs/architecture.md holds the one module map: it names every module of both packages, in
the folder it lives in, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"infertune_operator": REPO / "operator/src", "infertune_tuner": REPO / "tuner/src"}


def _mapped() -> dict[str, set[str]]:
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    table = text.split("## Module map", 1)[1]
    out: dict[str, set[str]] = {}
    for folder, modules in re.findall(r"^\| `([\w/]+/)` \| ([^|]+) \|", table, flags=re.M):
        assert folder not in out, f"{folder} has two rows"
        out[folder] = set(re.findall(r"`(\w+)`", modules))
    return out


def _on_disk() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for package, root in ROOTS.items():
        for path in (root / package).rglob("*.py"):
            if path.name != "__init__.py":
                folder = path.parent.relative_to(root).as_posix() + "/"
                out.setdefault(folder, set()).add(path.stem)
    return out


def test_the_module_map_names_every_module_where_it_lives_and_nothing_else() -> None:
    mapped, disk = _mapped(), _on_disk()
    assert mapped.keys() == disk.keys()
    for folder, modules in disk.items():
        assert mapped[folder] == modules, folder


def test_the_operator_package_top_holds_a_dozen_modules_at_most() -> None:
    assert len(list((ROOTS["infertune_operator"] / "infertune_operator").glob("*.py"))) <= 12
