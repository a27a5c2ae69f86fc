"""Tune: request -> search space -> memory pruning -> Optuna search -> report.

`tune()` is what both `infertune tune` (locally) and the operator's tuner Job call. It prints
nothing: whoever runs it watches through its hooks (`on_start`, `on_phase`, `on_trial`; the
CLI's progress bar is one).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna

from infertune_tuner import __version__, defaults, pools
from infertune_tuner.backends import make_backend
from infertune_tuner.backends.base import BenchmarkBackend, OnPhase
from infertune_tuner.backends.per_pool import PerPool, replay_parts
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.interrupt import by_ctrl_c, exit_behind, settle
from infertune_tuner.journal import lock_study, storage_fault
from infertune_tuner.packing import GpuSet, slots
from infertune_tuner.perfmodel.latency import Prediction, predict
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Report
from infertune_tuner.search.driver import (
    OnTrial,
    Search,
    SearchOutcome,
    failure_scope,
    study_name,
)
from infertune_tuner.search.evidence import executed_trials
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.posterior import Prior
from infertune_tuner.search.sampler import PlannerFactory, make_sampler
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace, search_space
from infertune_tuner.stop import INTERRUPTED
from infertune_tuner.storage import ClaimLock, open_storage
from infertune_tuner.study_folder import Identity, record_identity, refuse_another_study
from infertune_tuner.study_report import build_report

log = logging.getLogger(__name__)
REPORTED = "reported_at"  # study attribute: the executed trials when the report was written


@dataclass(frozen=True)
class StudyStart:
    """What `on_start` learns before the first trial: the study and what it already holds."""

    study: str
    resumed_trials: int  # executed trials an earlier run left in the study (it resumes them)
    max_trials: int
    notes: tuple[str, ...] = ()  # repairs made to the study's storage before it opened


def prior_predictions(request: TuningRequest, space: SearchSpace) -> dict[TrialConfig, Prediction]:
    model, work = request.resolve_model(), request.work
    # Keyed by the configuration searched; predicted as the server runs it (space.effective),
    # on the GPU of its pool.
    return {
        c: predict(model, pools.gpu_of(request, c), space.effective(c), work) for c in space.configs
    }


def tune(
    request: TuningRequest,
    *,
    backend: str | BenchmarkBackend = defaults.LOCAL_BACKEND,
    out_dir: Path,
    server_command: str | None = None,
    backend_factory: Callable[[int], BenchmarkBackend] | None = None,
    on_start: Callable[[StudyStart], None] | None = None,
    on_phase: OnPhase | None = None,
    on_trial: OnTrial | None = None,
    gpus: int | None = None,
    settings: SearchSettings | None = None,
    planner_factory: PlannerFactory = Planner,
    retry_failed: bool = False,
    pool: str | None = None,
) -> Report | None:
    """Run (or resume) the study for `request` and return the report (not yet written).

    On a shared (RDB) storage this process is one worker of the study among any others given
    the same request: it returns the report only when it is the worker that sees the study end
    (no trial running anywhere, and no report yet for what the study holds), else None.

    Args:
        request: What to tune.
        backend: A backend name (``simulated``, ``replay:PATH``, ``triton`` ...) or an instance.
        out_dir: Where the study journal (and the triton backend's trial folders) live; a
            re-run with the same folder resumes the study.
        server_command: The triton backend's server command template (tests, simserver).
        backend_factory: Builds the backend of worker ``i`` (overrides ``backend``).
        on_start: Called once the study is open, before the first trial.
        on_phase: Called as a long trial moves on (starting server, loading model, warm-up,
            measuring).
        on_trial: Called after every executed trial with what is known so far.
        gpus: The GPUs this worker holds (triton backend): trials are packed into them, as
            many at once as the smallest TP of the space fits (see packing.py).
        settings: The search's constants (default: `SearchSettings()`, each with its evidence);
            the request's confidence target replaces their stop probability.
        planner_factory: Builds `auto`'s planner from (prior, settings, max_trials=); the
            benchmark's oracle (benchmarks/oracle.py) is the one other.
        retry_failed: Try afresh what failed in earlier runs of the same set-up (by default a
            resumed study keeps the structures that could not run excluded).
        pool: Measure on this one GPU pool of a several-pool request (a tuner Job per pool,
            each a worker of one shared study): the backend measures that pool's
            configurations, the search proposes only them here.

    Returns:
        The report: every trial, the best feasible configuration (or the nearest misses) and
        why the search stopped; None for a worker that leaves the report to another.
    """
    started = time.monotonic()
    model = request.resolve_model()
    backend_name = backend if isinstance(backend, str) else backend.name
    space = search_space(request, model, backend_name)
    mine = _pool_of(request, space, pool)
    priors = prior_predictions(request, space)
    seed = request.tuning.seed if request.tuning.seed is not None else defaults.SEED

    workers = request.tuning.parallelism
    shared = bool(request.tuning.storage)
    # Workers of a shared study may share an output folder: their trial folders must not clash.
    tag = f"{uuid.uuid4().hex[:8]}-" if shared else ""
    gpu_set = GpuSet(gpus) if gpus and backend_name == "triton" else None
    if gpu_set is not None:
        tps = sorted({c.tp for c in space.configs if not mine or c.gpu == mine})
        workers = slots(gpu_set.gpus, tuple(tps))
    if backend_factory is None:
        if isinstance(backend, str):
            spec = backend

            def backend_factory(i: int) -> BenchmarkBackend:
                built = make_backend(
                    spec, pools.single(request, mine) if mine else request, seed=seed,
                    server_command=server_command, workdir=out_dir / f"worker-{tag}{i}",
                    on_phase=on_phase, gpus=gpu_set,
                )  # fmt: skip
                return PerPool({mine: built}) if mine else built
        else:
            instance = backend
            workers = 1  # one backend instance cannot serve several worker threads

            def backend_factory(i: int) -> BenchmarkBackend:
                return instance

    if backend_name == "triton" and workers > 1 and gpu_set is None:
        # Real trials own the GPUs of their pod: several workers in one process would fight over
        # them. Parallel real tuning = several tuner pods (workers) on one shared RDB study.
        log.warning("triton backend: running 1 worker (parallelism %d needs one pod each)", workers)
        workers = 1
    identity = Identity.of(request, backend_name)
    name = study_name(request, backend_name)
    lock = None if shared else lock_study(out_dir)  # one run per journal; RDB: workers join
    backends: list[BenchmarkBackend] = []
    try:
        storage = open_storage(request.tuning.storage, out_dir)
        # One folder, one study: never start a second one where an earlier report lies.
        refuse_another_study(out_dir, storage, identity, shared=shared)
        backends.extend(backend_factory(i) for i in range(workers))
        search_settings = (settings or SearchSettings()).with_confidence(request.tuning.confidence)
        prior = Prior.build(request, space, priors, search_settings)
        run_id = uuid.uuid4().hex
        setup = setup_fingerprint(backend, server_command)
        # Whose failed trials are evidence, one answer for the sampler and the driver: every
        # worker's on a shared study; else this set-up's (this run's alone with retry_failed).
        scope = failure_scope(run_id, setup, shared=shared, retry_failed=retry_failed)
        sampler = make_sampler(
            prior, search_settings, seed=seed, planner=planner_factory, scope=scope, pool=mine
        )
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", load_if_exists=True,
            sampler=sampler,
        )  # fmt: skip
        record_identity(study, identity)
        deadline = (
            started + request.tuning.timeout_minutes * 60
            if request.tuning.timeout_minutes
            else None
        )
        search = Search(
            prior, search_settings, study, run_id=run_id, on_trial=on_trial,
            deadline=deadline, lock=ClaimLock(storage, name), shared=shared, setup=setup,
            scope=scope, pool=mine,
        )  # fmt: skip
        # From the study's opening on, a Ctrl-C, wherever it lands, ends the search with the
        # report of the trials done (then exit 130).
        try:
            if not shared:  # no other process works on a journal: what still runs was interrupted
                search.recover_interrupted()
            if on_start is not None:
                notes = tuple(lock.notes) if lock else ()
                on_start(
                    StudyStart(
                        study.study_name, len(executed_trials(study)), search.max_trials, notes
                    )
                )
            outcome = search.run(backends)
            settle()  # the search ended by itself: a Ctrl-C now would only cut its report short
        except BaseException as exc:
            settle()  # the search has ended
            if not by_ctrl_c(exc):
                if (stop := exit_behind(exc)) is not None and stop is not exc:
                    raise stop from None  # SIGTERM, whatever Optuna raised while it unwound
                if isinstance(exc, Exception) and (fault := storage_fault(exc)) is not None:
                    raise fault from None  # the disk, not the search: the caller says which file
                raise
            if not shared:
                # A Ctrl-C that also cuts Optuna's own tell short can leave the trial it stopped
                # RUNNING; on a journal only this run could be running it: it ended as
                # interrupted, and the report says so now. Should that write fail too, the next
                # run marks it on resuming, as before.
                try:
                    search.recover_interrupted()
                except Exception as again:  # the report of the trials done matters more
                    log.warning("could not mark the interrupted trial failed: %s", again)
            outcome = SearchOutcome(INTERRUPTED, study)
        if shared and not _last_worker(search):
            return None
        return build_report(
            prior, search_settings, outcome.study, backend=backend_name, stop=outcome.stop,
            duration_s=time.monotonic() - started, run=search.scope, seed=seed,
            run_id=run_id,
        )  # fmt: skip
    except BaseException:
        settle()  # ended before the search could begin: its clean-up must not be cut short
        raise
    finally:
        for b in backends:
            b.close()
        if lock is not None:
            lock.release()


def _pool_of(request: TuningRequest, space: SearchSpace, pool: str | None) -> str:
    """The pool this worker measures on ("" for all), checked against the request's pools."""
    if not pool or (not request.gpu.pools and pool == request.gpu.product):
        return ""  # every pool, or the request's one
    if pool not in pools.products(request):
        listed = ", ".join(pools.products(request)) or "none: the spec names one gpu.product"
        raise InputError(f"--pool {pool}: not a pool of this spec (its pools: {listed})")
    if pool not in space.gpus:
        raise InputError(f"--pool {pool}: nothing of the search space can run there")
    if not request.tuning.storage:
        raise InputError(
            f"--pool {pool}: one pool's worker needs the other pools' workers on the same study: "
            "set spec.tuning.storage (a database every pool's machines reach)"
        )
    return pool


def setup_fingerprint(backend: str | BenchmarkBackend, server_command: str | None) -> str:
    """What the trials ran on, as far as the tuner can tell: the backend, its server command,
    this version of infertune and, for a replay, the table's bytes. Failures of a run on the
    same set-up still count when a study resumes (what could not run stays excluded); a
    changed set-up tries them afresh."""
    name = backend if isinstance(backend, str) else backend.name
    parts = [name, server_command or "", __version__]
    if isinstance(backend, str) and backend.startswith("replay:"):
        for _, path in replay_parts(backend):  # one table, or one per pool: each one's bytes
            table = Path(path)
            parts.append(hashlib.sha256(table.read_bytes()).hexdigest() if table.is_file() else "")
    return "setup-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _last_worker(search: Search) -> bool:
    """Whether this worker writes the report: no trial runs anywhere (a dead worker's trial
    is failed first) and no report was written yet for what the study now holds."""
    with search.lock():
        if search.others_running():
            return False
        executed = len(executed_trials(search.study))
        if search.study.user_attrs.get(REPORTED) == executed:
            return False
        search.study.set_user_attr(REPORTED, executed)
        return True


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write report.json, report.md and report.html into out_dir: all three or none.

    Each is written in full to a file of its own beside it, and only then are the three renamed
    into place (report.json last: once it is there, so are the others): a run stopped while it
    writes, or a full disk, leaves the earlier report, if any, whole, and no report in part."""
    from infertune_tuner.report import render_html, render_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "report.md": render_markdown(report),
        "report.html": render_html(report),
        "report.json": report.to_json() + "\n",
    }
    written: dict[Path, Path] = {}  # where it goes -> where it was written
    try:
        for name, text in texts.items():
            part = out_dir / f".{name}.{uuid.uuid4().hex[:8]}.part"
            written[out_dir / name] = part
            with part.open("x", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for path, part in written.items():
            try:
                part.replace(path)
            except OSError as exc:  # report.json a folder, say: the error names the report's path
                raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        for part in written.values():
            part.unlink(missing_ok=True)  # those not renamed: written in vain
    return [out_dir / "report.json", out_dir / "report.md", out_dir / "report.html"]
