"""A study's measurements as a replay table (`infertune export-replay`).

Re-tuning offline with another SLO, another budget or another sampler is the main use: the
table is what the ``replay:`` backend reads (backends/replay.py), so
``infertune tune SPEC --backend replay:TABLE`` answers every configuration the study measured
exactly as it was measured, without a GPU.

The source is a report (``report.json``, also what ``infertune report NAME`` fetches from a
cluster), an output folder (its ``report.json``, else its study journal), or a study journal.
One row per measured configuration: its repeats combined as the search combined them (the
typical run, ``search.evidence.combine``), an out-of-memory in any repeat as ``oom``. A
configuration whose every trial failed with ``error`` is an ``error`` row carrying the reason
and phase of its last failure: a structure that does not run (a kernel missing for a
quantization, a TP size whose start fails) fails the same way when replayed, with the same
signature. Left out, and counted: failed trials of a configuration that also ran (its row says
what it does), transient failures (a server not ready in time, an evicted pod, a lost
connection: they say nothing about the configuration, and its next run may well succeed; a
configuration that failed only so is left out, and replaying it is a failed trial "not in
table" anyway), invalid ones (measurements that cannot be true: search/evidence.py, judge),
those that failed otherwise (an error mixed with invalid runs) and interrupted ones (nothing
measured).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
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
from infertune_tuner.search.evidence import combine, executed_trials, is_transient
from infertune_tuner.study_folder import REPORT_JSON

KEPT = ("ok", "oom")  # measurement statuses a replay table holds as measured
TRANSIENT = "transient error"  # how left-out transient failures are counted


@dataclass
class Export:
    """What a source holds: one combined measurement per configuration, and what was left out."""

    source: Path
    rows: dict[TrialConfig, Measurement] = field(default_factory=dict)
    left_out: Counter[str] = field(default_factory=Counter)  # status -> trials

    def add(
        self, cfg: TrialConfig, runs: list[Measurement], typical: Measurement | None = None
    ) -> None:
        """One configuration's trials, in order; `typical`: their typical run where the source
        states it (a report's `measured`), else they are combined here."""
        kept = [m for m in runs if m.status in KEPT]
        lasting = [m for m in runs if m.status == "error" and not is_transient(m)]
        left = [m for m in runs if m.status not in KEPT]
        if typical is not None and typical.status in KEPT:
            self.rows[cfg] = typical
        elif kept:
            self.rows[cfg] = combine(kept)
        elif lasting and all(m.status == "error" for m in runs):
            last = lasting[-1]  # the row replays the last failure that says something
            self.rows[cfg] = Measurement.failed("error", last.reason or "", last.phase)
            left = [m for m in runs if is_transient(m)]
        self.left_out.update(
            TRANSIENT if m.status == "error" and is_transient(m) else m.status for m in left
        )

    def add_all(self, runs: dict[TrialConfig, list[Measurement]]) -> None:
        for cfg, ms in runs.items():
            self.add(cfg, ms)

    @property
    def measured(self) -> bool:
        """Whether any configuration ran (a table of failures alone replays nothing)."""
        return any(m.status in KEPT for m in self.rows.values())

    def summary(self) -> str:
        count = Counter(m.status for m in self.rows.values())
        left = ", ".join(f"{n} {status}" for status, n in sorted((+self.left_out).items()))
        return (
            f"{len(self.rows)} configurations ({count['ok']} measured, {count['oom']} out of "
            f"memory, {count['error']} failed) from {self.source}"
            + (f"; left out trials: {left}" if left else "")
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
    reason = row.reason if isinstance(row, Trial) and row.reason else row.state
    phase = row.phase if isinstance(row, Trial) else None
    return Measurement.failed(status, reason, phase)  # type: ignore[arg-type]


def from_report(report: Report, source: Path) -> Export:
    out = Export(source)
    out.left_out["interrupted"] += sum(1 for t in report.trials if t.state == "interrupted")
    trials = {t.number: t for t in report.trials if t.executed}
    if report.measured:  # each configuration's typical run, as the search combined it
        for c in report.measured:
            typical = _measurement(c)
            ms = [_measurement(trials[n]) for n in c.trials if n in trials]
            out.add(c.config.to_config(), ms or [typical], typical)
        return out
    runs: dict[TrialConfig, list[Measurement]] = {}  # a report written before `measured`
    for t in trials.values():
        runs.setdefault(t.config.to_config(), []).append(_measurement(t))
    out.add_all(runs)
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
    out.add_all(runs)
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


def export(source: Path, table: Path) -> tuple[Export, list[Path]]:
    """Write the replay table of `source` to `table` (a study over several GPU pools: one table
    per pool, `TABLE.PRODUCT.csv`, what `--backend replay:PRODUCT=TABLE,...` reads); returns
    what was exported and the tables written."""
    found = load(source)
    if not found.measured:
        raise InputError(f"{source}: no trial measured anything; there is nothing to replay")
    products = sorted({cfg.gpu for cfg in found.rows})
    if products == [""]:
        write_table(table, found.rows)
        return found, [table]
    written = []
    for product in products:
        path = table.with_name(f"{table.stem}.{product}{table.suffix}")
        rows = {replace(c, gpu=""): m for c, m in found.rows.items() if c.gpu == product}
        write_table(path, rows)
        written.append(path)
    return found, written
