"""One output folder, one study: a run that would start another study where one lives refuses.

Re-running `infertune tune` with the same output folder resumes the study that lives there.
A run whose study is another one (another seed, backend, sampler, SLO, search space: whatever
`search.driver.study_name` tells apart) would add a second study to the folder's journal and
replace its report. It refuses instead (exit 2), listing what differs and how to keep both.

Why refuse rather than keep both side by side: the folder is what a user names, opens and
shares (`report.html` in it is *the* report of that folder); two studies in one folder would
need a rule for which report is the folder's, and a re-run with one flag changed by mistake
would quietly fork the study instead of resuming it. One folder per study keeps the mapping a
user can see, and every earlier report stays where it was (docs/troubleshooting.md).

Each study records what identifies it (the request and the backend) as its user attribute
`identity`, so that a refusal can say what differs; an older study without it is described by
the folder's report.json, or not at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from pydantic import ValidationError

from infertune_tuner.errors import InputError
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.schema import to_camel
from infertune_tuner.search.driver import study_name
from infertune_tuner.storage import mask_url

IDENTITY_ATTR = "identity"
REPORT_JSON = "report.json"


@dataclass(frozen=True)
class Identity:
    """What a study is of: the request (as the report shows it) and the backend."""

    request: dict[str, Any]
    backend: str

    @classmethod
    def of(cls, request: TuningRequest, backend: str) -> Identity:
        dumped = request.dump()
        if request.tuning.storage:  # never the database password
            dumped["tuning"]["storage"] = mask_url(request.tuning.storage)
        return cls(dumped, backend)

    @classmethod
    def from_attr(cls, value: Any) -> Identity | None:
        if isinstance(value, dict) and isinstance(value.get("request"), dict):
            return cls(value["request"], str(value.get("backend", "")))
        return None

    def as_attr(self) -> dict[str, Any]:
        return {"request": self.request, "backend": self.backend}

    def study(self) -> str | None:
        """The study name this identity maps to (None: the request no longer parses)."""
        try:
            return study_name(TuningRequest.model_validate(self.request), self.backend)
        except ValidationError:
            return None


@dataclass(frozen=True)
class Difference:
    field: str  # `tuning.seed`, `backend`, `slo`
    before: str
    now: str


def record_identity(study: optuna.Study, identity: Identity) -> None:
    if IDENTITY_ATTR not in study.user_attrs:
        study.set_user_attr(IDENTITY_ATTR, identity.as_attr())


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"tuning": {"seed": 7}}`` -> ``{"tuning.seed": 7}`` (lists are leaves)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


# What a user typed for a request field: the manifest's path, and the flag that overrides it.
_FLAGS = {"tuning.seed": "--seed", "tuning.sampler": "--sampler", "tuning.backend": "--backend"}
_SPEC_PATHS = {"name": "metadata.name", "namespace": "metadata.namespace", "slo": "spec.slo",
               "min_output_tokens_per_s_per_gpu": "spec.slo.minOutputTokensPerSecondPerGpu"}  # fmt: skip


def _where(path: str) -> str:
    """``tuning.seed`` -> ``spec.tuning.seed (--seed)``."""
    spec = _SPEC_PATHS.get(path) or "spec." + ".".join(map(to_camel, path.split(".")))
    return f"{spec} ({_FLAGS[path]})" if path in _FLAGS else spec


def _show(path: str, value: Any) -> str:
    if path == "slo" and isinstance(value, list):
        try:
            return ", ".join(SloBound.model_validate(b).label() for b in value)
        except ValidationError:
            pass
    return value if isinstance(value, str) else json.dumps(value)


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def differences(earlier: Identity, now: Identity) -> list[Difference]:
    """The fields whose change makes `now` another study than `earlier` (each one is tried
    alone against `study_name`, the one place that decides what makes a study)."""
    before, after = _leaves(earlier.request), _leaves(now.request)
    changed = [
        path
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
        and _matters(
            earlier, Identity(_set(earlier.request, path, after.get(path)), earlier.backend)
        )
    ]
    out = [Difference(_where(p), _show(p, before.get(p)), _show(p, after.get(p))) for p in changed]
    shown = {(d.before, d.now) for d in out}
    if earlier.backend != now.backend and (earlier.backend, now.backend) not in shown:
        out.append(Difference("backend (--backend)", earlier.backend, now.backend))
    return out


def _matters(earlier: Identity, changed: Identity) -> bool:
    a, b = earlier.study(), changed.study()
    return a is None or b is None or a != b


def _report_identity(out_dir: Path) -> Identity | None:
    """The identity of the study whose report lies in `out_dir` (None: none, or unreadable)."""
    try:
        data = json.loads((out_dir / REPORT_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
        return None
    return Identity(data["request"], str(data.get("backend", "")))


def other_study(
    out_dir: Path, storage: BaseStorage, name: str, *, shared: bool
) -> Identity | str | None:
    """What else lives in `out_dir` that a run of study `name` would replace: the identity of
    another study (or its name, when it recorded none); None when nothing would be lost."""
    report = _report_identity(out_dir)
    if report is not None and report.study() not in (None, name):
        return report
    if shared:  # the study lives in a database shared by many requests: only the report counts
        return None
    studies = storage.get_all_studies()
    if any(s.study_name == name for s in studies):
        return None  # a re-run: it resumes its own study
    others = [s for s in studies if s.study_name != name]  # in the order they were created
    if not others:
        return None
    last = others[-1]
    return Identity.from_attr(last.user_attrs.get(IDENTITY_ATTR)) or report or last.study_name


def _suggest(out_dir: Path, diffs: list[Difference]) -> Path:
    """A folder beside `out_dir` named for the first difference (``-seed9``, ``-replay``)."""
    tag = "2"
    if diffs and "--seed" in diffs[0].field:
        tag = f"seed{diffs[0].now}"
    elif diffs and "--backend" in diffs[0].field:  # replay:/a/table.csv -> replay
        now = diffs[0].now
        tag = "replay" if now.startswith("replay:") else re.sub(r"[^A-Za-z0-9]+", "-", now)
    candidate, n = out_dir.with_name(f"{out_dir.name}-{tag}"), 2
    while candidate.exists():
        n += 1
        candidate = out_dir.with_name(f"{out_dir.name}-{tag}-{n}")
    return candidate


def refuse_another_study(
    out_dir: Path, storage: BaseStorage, identity: Identity, *, shared: bool
) -> None:
    """Raise InputError (exit 2) when this run would start a second study in `out_dir`."""
    name = identity.study()
    assert name is not None  # the request this run was given always parses
    other = other_study(out_dir, storage, name, shared=shared)
    if other is None:
        return
    diffs = differences(other, identity) if isinstance(other, Identity) else []
    what = [f"  - {d.field}: {d.before} before, {d.now} now" for d in diffs] or [
        f"  - the earlier study ({other if isinstance(other, str) else 'of another request'}) "
        "was made with other settings"
    ]
    raise InputError(
        "\n".join([
            f"{out_dir} holds the study of an earlier run, and this run differs from it (it would "
            "start a second study there and replace the earlier report):",
            *what,
            f"To keep both, give this run its own folder: --out {_suggest(out_dir, diffs)}. To "
            f"resume the earlier study, run it with its settings; to start afresh in {out_dir}, "
            "move or delete that folder first.",
        ])
    )  # fmt: skip
