"""A study's measurements as a replay table (`infertune export-replay`).

Re-tuning offline with another SLO, another budget or another sampler is the main use: the
table is what the ``replay:`` backend reads (backends/replay.py), so
``infertune tune SPEC --backend replay:TABLE`` answers every configuration the study measured
exactly as it was measured, without a GPU.

The source is a report (``report.json``, also what ``infertune report NAME`` fetches from a
cluster), an output folder (its ``report.json``, else its study journal), or a study journal.
One row per measured configuration: its repeats combined as the search combined them (the
typical run, ``search.evidence.combine``), an out-of-memory in any repeat as ``oom``. Left out,
and counted: failed trials (an error says nothing about the configuration; replaying a
configuration that is not in the table is a failed trial anyway), invalid ones (measurements
that cannot be true: search/evidence.py, judge) and interrupted ones (nothing measured).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from pydantic import ValidationError

from infertune_tuner.backends.replay import write_table
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.journal import JOURNAL, journal_storage
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.result import MeasuredConfig, Report, Trial
from infertune_tuner.search.evidence import combine, executed_trials
from infertune_tuner.study_folder import REPORT_JSON

KEPT = ("ok", "oom")  # measurement statuses a replay table holds


@dataclass
class Export:
    """What a source holds: one combined measurement per configuration, and what was left out."""

    source: Path
    rows: dict[TrialConfig, Measurement] = field(default_factory=dict)
    left_out: Counter[str] = field(default_factory=Counter)  # status -> trials

    def add(self, runs: dict[TrialConfig, list[Measurement]]) -> None:
        for cfg, ms in runs.items():
            kept = [m for m in ms if m.status in KEPT]
            self.left_out.update(m.status for m in ms if m.status not in KEPT)
            if kept:
                self.rows[cfg] = combine(kept)
        self.left_out = +self.left_out  # drop zero counts

    def summary(self) -> str:
        oom = sum(1 for m in self.rows.values() if m.status == "oom")
        left = ", ".join(f"{n} {status}" for status, n in sorted(self.left_out.items()))
        return (
            f"{len(self.rows)} configurations ({len(self.rows) - oom} measured, {oom} out of "
            f"memory) from {self.source}" + (f"; left out trials: {left}" if left else "")
        )


def _measurement(row: Trial | MeasuredConfig) -> Measurement:
    """A report row back as the measurement it showed."""
    if row.state == "complete" and row.metrics is not None:
        m = row.metrics
        return Measurement.ok(
            {x.key: Percentiles(**m.percentiles(x.key).model_dump()) for x in LATENCY_METRICS},
            output_tokens_per_s_per_gpu=m.output_tokens_per_s_per_gpu,
            concurrency=row.concurrency if isinstance(row, MeasuredConfig) else None,
        )
    status = {"oom": "oom", "invalid": "invalid"}.get(row.state, "error")
    return Measurement.failed(status, row.state)  # type: ignore[arg-type]


def from_report(report: Report, source: Path) -> Export:
    out = Export(source)
    out.left_out["interrupted"] += sum(1 for t in report.trials if t.state == "interrupted")
    if report.measured:  # each configuration's typical run, as the search combined it
        out.add({c.config.to_config(): [_measurement(c)] * len(c.trials) for c in report.measured})
        return out
    runs: dict[TrialConfig, list[Measurement]] = {}  # a report written before `measured`
    for t in report.trials:
        if t.executed:
            runs.setdefault(t.config.to_config(), []).append(_measurement(t))
    out.add(runs)
    return out


def from_journal(path: Path) -> Export:
    """The measurements of the one study in a journal (``study.journal`` of an output folder)."""
    storage = journal_storage(path.parent)
    studies = storage.get_all_studies()
    if not studies:
        raise InputError(f"{path}: holds no study")
    if len(studies) > 1:
        names = ", ".join(s.study_name for s in studies)
        raise InputError(
            f"{path}: holds {len(studies)} studies ({names}); export the report.json of the one "
            "you mean"
        )
    study = optuna.load_study(study_name=studies[0].study_name, storage=storage)
    out = Export(path)
    runs: dict[TrialConfig, list[Measurement]] = {}
    for e in executed_trials(study):
        runs.setdefault(e.config, []).append(e.measurement)
    out.add(runs)
    return out


def read_report(path: Path) -> Report:
    try:
        return Report.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, ValidationError) as exc:
        raise InputError(f"{path}: not an infertune report: {str(exc).splitlines()[0]}") from None


def load(source: Path) -> Export:
    """The measurements of a report.json, an output folder or a study journal."""
    if source.is_dir():
        if (source / REPORT_JSON).is_file():
            return from_report(read_report(source / REPORT_JSON), source / REPORT_JSON)
        if (source / JOURNAL).is_file():
            return from_journal(source / JOURNAL)
        raise InputError(f"{source}: holds neither {REPORT_JSON} nor {JOURNAL}")
    if not source.exists():
        raise InputError(f"{source}: no such file or folder")
    if source.name == JOURNAL and source.is_file():
        return from_journal(source)
    return from_report(read_report(source), source)


def export(source: Path, table: Path) -> Export:
    """Write the replay table of `source` to `table`; returns what was exported."""
    found = load(source)
    if not found.rows:
        raise InputError(f"{source}: no trial measured anything; there is nothing to replay")
    write_table(table, found.rows)
    return found
