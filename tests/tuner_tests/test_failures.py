"""Failures are evidence (search/failures.py): a structure whose trials fail with one signature
is not tried further, an isolated failure sets aside its configuration only, a transient failure
is re-run before it counts, and a resumed study keeps what could not run excluded."""

from __future__ import annotations

from pathlib import Path

from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.report.markdown import render_markdown
from infertune_tuner.report.view import failure_line, never_ran_note
from infertune_tuner.run import tune
from infertune_tuner.search.failures import FailureModel
from infertune_tuner.search.planner import stop_reason
from infertune_tuner.search.posterior import Exclusion
from infertune_tuner.stop import StopKind

from .helpers import Core, request

NO_KERNELS = (
    "the server exited before it was ready (exit code 1)\n"
    "[TensorRT-LLM][ERROR] Assertion failed: Unsupported quantization mode for FP8 on SM90 "
    "(fp8Gemm.cpp:231)"
)
NCCL = "NCCL error in: /src/nccl/init.cc:1234, unhandled system error"
TIMEOUT = "the server was not ready after 1800 s"


def _ok(core: Core, cfg: TrialConfig) -> Measurement:
    return SimulatedBackend(core.request, seed=0).run(cfg)


def _fail(reason: str = NO_KERNELS, phase: str = "loading model") -> Measurement:
    return Measurement.failed("error", reason, phase)  # type: ignore[arg-type]


def _core() -> Core:
    return Core(request(quants=["fp16", "fp8"], max_trials=40))


def _ran(core: Core) -> dict[TrialConfig, tuple[Measurement, ...]]:
    """fp16 runs at every TP and both KV cache dtypes (the structures fp16 shares ran)."""
    return {
        TrialConfig(tp, bs, "fp16", kv): (_ok(core, TrialConfig(tp, bs, "fp16", kv)),)
        for tp, bs in ((1, 8), (2, 32), (4, 64), (8, 128))
        for kv in ("auto", "fp8")
    }


def _excluded(core: Core, runs: dict[TrialConfig, tuple[Measurement, ...]]) -> set[TrialConfig]:
    ev = core.evidence(runs)
    return {c for c, r in core.assess(ev).verdicts.items() if r and r.exclusion == Exclusion.FAILED}


def test_without_failures_every_configuration_runs() -> None:
    core = _core()
    model = FailureModel.learn(core.evidence(_ran(core)), core.prior.space, core.settings)
    assert set(model.p_runs.values()) == {1.0}
    assert model.draws is None and not model.excluded


def test_two_failures_of_one_signature_exclude_what_they_share_and_nothing_else() -> None:
    core = _core()
    runs = _ran(core)
    # All they share is fp8 weights (TP, batch and KV cache differ): fp8 cannot run.
    runs[TrialConfig(1, 1, "fp8", "auto")] = (_fail(),)
    runs[TrialConfig(4, 64, "fp8", "fp8")] = (_fail(),)
    ev = core.evidence(runs)
    rulings = core.assess(ev).verdicts
    untried_fp8 = {c for c in core.prior.universe if c.quantization == "fp8" and c not in runs}
    assert all(rulings[c] is not None for c in untried_fp8)
    excluded = {c for c, r in rulings.items() if r and r.exclusion == Exclusion.FAILED}
    assert excluded <= untried_fp8 and len(excluded) > len(untried_fp8) / 2
    ruling = rulings[sorted(excluded)[0]]
    assert ruling is not None and "Unsupported quantization mode" in ruling.text()


def test_an_isolated_failure_excludes_nothing() -> None:
    core = _core()
    runs = _ran(core)
    runs[TrialConfig(2, 32, "fp8", "auto")] = (_fail(),)
    runs[TrialConfig(2, 64, "fp8", "auto")] = (_ok(core, TrialConfig(2, 64, "fp8", "auto")),)
    assert not _excluded(core, runs)
    model = FailureModel.learn(core.evidence(runs), core.prior.space, core.settings)
    # A neighbour of the failure that shares structures with what ran stays likely to run.
    assert model.p_runs[TrialConfig(2, 16, "fp8", "auto")] > 0.5


def test_failures_with_different_signatures_are_not_one_structure() -> None:
    core = _core()
    runs = _ran(core)
    runs[TrialConfig(2, 32, "fp8", "auto")] = (_fail(),)
    runs[TrialConfig(4, 64, "fp8", "fp8")] = (_fail(NCCL, "starting server"),)
    assert not _excluded(core, runs)


def test_a_structure_something_ran_in_is_not_excluded_as_a_whole() -> None:
    core = _core()
    runs = _ran(core)
    runs[TrialConfig(1, 8, "fp8", "auto")] = (_ok(core, TrialConfig(1, 8, "fp8", "auto")),)
    runs[TrialConfig(2, 32, "fp8", "auto")] = (_fail(),)
    runs[TrialConfig(4, 64, "fp8", "auto")] = (_fail(),)
    excluded = _excluded(core, runs)
    # fp8 at TP1 ran: what the failures share is fp8 at TP > 1, not fp8.
    assert excluded and all(c.tp > 1 and c.quantization == "fp8" for c in excluded)
    assert TrialConfig(1, 64, "fp8", "auto") not in excluded


def test_a_transient_failure_is_re_run_before_it_counts() -> None:
    core = _core()
    cfg = TrialConfig(2, 32, "fp8", "auto")
    once = core.evidence({**_ran(core), cfg: (_fail(TIMEOUT),)})
    assert cfg not in once.measured and cfg in once.retry
    assert core.ruling(cfg, once) is None  # a candidate again
    assert once.executed == len(_ran(core)) + 1  # it cost its trial
    twice = core.evidence({**_ran(core), cfg: (_fail(TIMEOUT), _fail(TIMEOUT))})
    assert cfg in twice.failures  # failed again: it counts
    then_ok = core.evidence({**_ran(core), cfg: (_fail(TIMEOUT), _ok(core, cfg))})
    assert then_ok.measured[cfg].status == "ok" and then_ok.counts[cfg] == 1


def test_failures_of_one_structure_do_not_abort_but_failures_across_structures_do() -> None:
    core = _core()
    one = {TrialConfig(tp, 32, "fp8", "auto"): (_fail(),) for tp in (1, 2, 4)}
    kw = {"space": core.prior.space, "max_trials": 40, "settings": core.settings}
    assert stop_reason(core.evidence(one), wants_trial=True, **kw) is None  # type: ignore[arg-type]
    across = {
        TrialConfig(1, 8, "fp16", "auto"): (_fail(),),
        TrialConfig(2, 32, "fp8", "fp8"): (_fail(),),
        TrialConfig(4, 1, "fp16", "fp8"): (_fail(),),
    }
    why = stop_reason(core.evidence(across), wants_trial=True, **kw)  # type: ignore[arg-type]
    assert why is not None and why.kind == StopKind.ABORTED


class NoFp8Kernels:
    """A simulated pool where fp8 weights do not load; counts what it ran."""

    name = "simulated"
    speedup = 1.0

    def __init__(self, req) -> None:  # type: ignore[no-untyped-def]
        self.inner = SimulatedBackend(req, seed=0)
        self.calls: list[TrialConfig] = []

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        self.calls.append(config)
        if config.quantization == "fp8":
            return _fail()
        return self.inner.run(config, repeat=repeat)

    def close(self) -> None:
        self.inner.close()


def test_a_study_says_what_could_not_run_and_a_resumed_one_keeps_it_excluded(
    tmp_path: Path,
) -> None:
    req = request(quants=["fp16", "fp8"], max_trials=30)
    pool = NoFp8Kernels(req)
    report = tune(req, backend=pool, out_dir=tmp_path)
    assert report is not None and report.best is not None
    assert report.best.config.quantization == "fp16"
    failed = sum(1 for c in pool.calls if c.quantization == "fp8")
    assert 1 <= failed <= 3
    (row,) = [f for f in report.could_not_run if f.kind == "structure"]
    assert row.structure == "fp8" and row.never_ran == ["quantization=fp8"] and row.excluded > 0
    line = failure_line(row)
    assert line in render_markdown(report)
    assert "Unsupported quantization mode" in line
    assert never_ran_note(report) == f"could not run: {line}"

    # Resumed with a larger budget on the same set-up: fp8 stays excluded.
    more = req.model_copy(update={"tuning": req.tuning.model_copy(update={"max_trials": 40})})
    again = NoFp8Kernels(more)
    tune(more, backend=again, out_dir=tmp_path)
    assert not any(c.quantization == "fp8" for c in again.calls)
    # After fixing what the tuner cannot see, --retry-failed tries it afresh.
    fixed = NoFp8Kernels(more)
    fixed.run = fixed.inner.run  # type: ignore[method-assign]
    retried = tune(more, backend=fixed, out_dir=tmp_path, retry_failed=True)
    assert retried is not None and retried.best is not None
    assert retried.best.config.quantization == "fp8"


def test_a_transient_failure_is_re_run_on_another_free_backend() -> None:
    import queue

    from infertune_tuner.search.driver import _elsewhere

    a, b = object(), object()
    free: queue.Queue[object] = queue.Queue()
    free.put(a)
    free.put(b)
    assert _elsewhere(free, a) is b  # type: ignore[arg-type]
    assert free.get_nowait() is a  # the other one stays free
    free.put(a)
    assert _elsewhere(free, a) is a  # type: ignore[arg-type]  # no other is free: here


class OneTransientFailure:
    """A simulated pool whose `nth` trial fails transiently (a load that timed out)."""

    name = "simulated"
    speedup = 1.0

    def __init__(self, req, nth: int | None) -> None:  # type: ignore[no-untyped-def]
        self.inner = SimulatedBackend(req, seed=0)
        self.nth = nth
        self.calls: list[TrialConfig] = []
        self.failed: TrialConfig | None = None

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        self.calls.append(config)
        if len(self.calls) - 1 == self.nth:
            self.failed = config
            return _fail(TIMEOUT)
        # The study's repeat index counts the failure: measure as if it had not happened.
        return self.inner.run(config, repeat=repeat - int(config == self.failed))

    def close(self) -> None:
        self.inner.close()


def test_a_transient_failure_costs_its_re_run_and_nothing_else(tmp_path: Path) -> None:
    req = request(quants=["fp16", "fp8"], max_trials=40)
    clean = OneTransientFailure(req, None)
    tune(req, backend=clean, out_dir=tmp_path / "clean")
    flaky = OneTransientFailure(req, 2)
    report = tune(req, backend=flaky, out_dir=tmp_path / "flaky")
    assert report is not None
    # The same trials in the same order, the failed one run once more right away.
    assert flaky.calls == [*clean.calls[:3], clean.calls[2], *clean.calls[3:]]
    (row,) = report.could_not_run
    assert row.kind == "transient" and row.trials == [2] and "load timed out" in row.signature
