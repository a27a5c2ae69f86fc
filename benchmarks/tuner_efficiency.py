# ruff: noqa: E402  (BLAS threads are set before numpy is imported)
"""How well each sampler finds the best SLO-feasible configuration on pools unlike the model,
scored honestly: every family with constants chosen on the *other* families.

Worlds (worldset.py): 12 scenarios (7 GPUs, 7 models, TTFT/ITL/E2E bounds at p50/p95/p99, spaces
of ~100-300 configurations) x 8 own world families (simulated pools whose behaviour differs in
form from the performance model: prefill stalls, all-reduce latency, FP8/INT4 gains that move
with batch, a memory frontier elsewhere, CUDA-graph gaps, noise and outliers, and `own-model`),
plus two families nobody here generated: `dev-synthetic` (12 simulated pools of other forms) and
`dev-vllm` (8 tables of real vLLM measurements), replayed with seeded run-to-run noise. Scored
only when named (`--families failing,dev-failing`), never fitted on: the worlds where whole
structures fail to start, `failing` (the scenarios with the `mixed` physics and one failure form
each: a quantization, the largest TP, a pair such as FP8 weights with the FP8 KV cache, batches
above a build-time limit, or a few isolated configurations; worlds/failures.py) and
`dev-failing` (8 development tables whose `error` rows form such structures).

**Leave one family out.** The posterior's hyperprior is the only constant fitted on worlds
(search/hyperprior.py); each family is scored with the hyperprior fitted on the other nine (a
failing family without the family whose physics it has, too: `mixed`, `dev-synthetic`).

The truth of a configuration is what a typical run of it shows (`WorldBackend.truth`: no run
noise, a population-sized sample; a dev table's row). Whether a configuration whose truth lies
within two run-to-run standard deviations of an SLO bound meets it is something no benchmark
resolves in a few runs: such a configuration may be chosen, and it is not required to be found.
So each configuration gets a resolution zone of max(2 %, 2 x its run-to-run standard deviation)
around the bounds (estimated from 5 extra runs of every configuration near a bound); the optimum
a run is scored against is the best true tok/s/GPU among configurations that meet every bound by
more than their zone, and a run *reaches* it when the chosen configuration truly meets every bound
within its zone and its true tok/s/GPU is >= 98 % of that optimum. The strict score (optimum =
best configuration meeting every bound by any margin, the dev set's `index.json`; chosen must
truly meet every bound within 2 %) is printed beside it. Prints, per sampler and per family:
share of runs reaching it, median and p90 executed trials (confirmations included), the median
trial that first measured the optimum, the median run's modelled GPU minutes (what the trials
cost on the simulated pool's clock, `gpu_minutes`), executed configurations the memory model
rules out by a wide margin, and for `auto` how well its stated
confidence is calibrated (of the runs that stopped claiming >= 95 %, the share that reached the
optimum, and that reached it strictly), and whether the chances it acted on came true: over
every trial it chose to explore, cover or probe, the chances recorded with it (result.Chances)
summed against how many truly met the SLO and truly beat the incumbent, overall, by bin of the
stated chance and per family (`chance_outcomes`).

Failures: per family with any, the failed trials of a run (status `error`; an OOM is memory, not
counted), median and total, and where the worlds declare failing structures (Truth.failing: a
failing world's form, the groups of a table whose rows all failed), the failed trials a run spent
inside them (summed over the world's structures), median and p90: what learning from failures
should bring down, beside the share of runs that reached the optimum.

    python benchmarks/tuner_efficiency.py [--seeds 5] [--budget 40] [--jobs 2]
        [--samplers auto,tpe,random,grid] [--families admission,...,dev-vllm,failing,dev-failing]
        [--hyperprior lofo|shipped] [--kernel-luck SD] [--run-noise SD] [--set NAME=VALUE]
        [--oracle find|lookahead] [--transient P] [--verbose] [--csv FILE]

`--oracle MODE` scores `auto` with explorations that know the truth (oracle.py): how many of a
family's trials are the finding, and how many the proof that choosing better barely shortens.

`--kernel-luck SD` and `--run-noise SD` are stress tests of forms nobody fitted or tuned on,
scored with the shipped hyperprior: every configuration of every scored world runs a fixed
factor exp(N(0, SD)) off its neighbours (worldset.KernelLuck), or every run of it a new such
factor off its typical run, on top of the pool's own noise (worldset.RunNoise).

`--transient P` makes every trial of every scored world fail with probability P with a transient
error (a server not ready after 1800 s, a connection reset, a node low on memory, an evicted
pod; worlds/failures.py, Transient), drawn per world, configuration and its run count; a
configuration's run right after such a failure does not fail so (measuring it again succeeds).
"""

from __future__ import annotations

import os

# Worlds run in parallel processes; the posterior's matrices are small: one BLAS thread each.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import itertools
import math
import pickle
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle import MODES, Mode, oracle_factory
from worlds.failures import Transient, inside
from worldset import (
    DEFAULT_FAMILIES,
    FIT_FAMILIES,
    REACH,
    SAME_PHYSICS,
    Truth,
    World,
    truth_of,
    worlds,
    write_csv,
)

from infertune_tuner import slo
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.backends.simulated import pool_seconds
from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.report.view import chosen_by_chance
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Report
from infertune_tuner.run import prior_predictions, tune
from infertune_tuner.search.evidence import is_transient
from infertune_tuner.search.hyperprior import Hyperprior, default_hyperprior, fit_hyperprior
from infertune_tuner.search.planner import Planner
from infertune_tuner.search.posterior import memory_margin
from infertune_tuner.search.sampler import PlannerFactory
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import build_space


@dataclass
class Run:
    family: str
    world: str
    seed: int
    reached: bool
    strict: bool
    executed: int
    wide_margin_executed: int
    confidence: float | None
    share: float  # chosen's true tok/s/GPU / optimum
    # The model was at least 2x off (tok/s/GPU) on some configuration the run measured.
    surprised: bool = False
    # The executed trial (1-based) that first measured a configuration the run would reach the
    # optimum by choosing; None: no such trial. The trials after it were the proof.
    found_at: int | None = None
    # Modelled GPU minutes of the run's trials (gpu_minutes).
    minutes: float = 0.0
    # Per trial `auto` chose to explore, cover or probe: the chances it gave the configuration
    # and what the world's typical run of it truly does (chance_outcomes).
    chances: list[ChanceOutcome] = dataclasses.field(default_factory=list)
    # Per SLO bound of the chosen configuration: the report's P(a fresh run meets it) against
    # fresh runs of it (headroom_outcomes).
    headroom: list[HeadroomOutcome] = dataclasses.field(default_factory=list)
    failed: int = 0  # executed trials that failed with `error`, transient failures left out
    # ... inside the world's failing structures, summed over them (Truth.failing)
    failed_inside: int = 0
    structures: int = 0  # the world's failing structures (0: it declares none)
    transient: int = 0  # executed trials that failed transiently (re-run, not evidence)
    excluded: int = 0  # structures the run's report says could not run (excluded)


@dataclass(frozen=True)
class ChanceOutcome:
    purpose: str  # explore | cover | probe
    p_success: float
    p_beat: float
    success: bool  # the configuration's typical run fits and meets every bound
    beat: bool  # ... and beats the incumbent's typical run by more than 2 %


# The report's P(a fresh run of the chosen configuration meets a bound) (slo.room) is checked
# against this many fresh runs of it, at repeat indexes no search reaches.
FRESH_RUNS = 20
FRESH_REPEAT = 1000


@dataclass(frozen=True)
class HeadroomOutcome:
    stated: float  # the report's P(a fresh run meets the bound)
    realized: float  # the share of FRESH_RUNS fresh runs that met it
    settled: bool  # the report called the room settled (>= two run-to-run SDs)


def headroom_outcomes(
    report: Report, world: World, request: TuningRequest
) -> list[HeadroomOutcome]:
    """Each bound's stated chance that a fresh run of the chosen configuration meets it, against
    FRESH_RUNS fresh runs of it on the world's pool (a run that fails meets nothing)."""
    if report.best is None or not report.best.headroom:
        return []
    cfg = report.best.config.to_config()
    backend = world.backend(request)
    try:
        runs = [
            slo.check(request, backend.run(cfg, repeat=FRESH_REPEAT + i)) for i in range(FRESH_RUNS)
        ]
    finally:
        backend.close()
    return [
        HeadroomOutcome(
            h.p_meets,
            statistics.fmean(any(c.bound == h.bound and c.ok for c in checks) for checks in runs),
            h.settled,
        )
        for h in report.best.headroom
    ]


def _headroom_lines(rows: list[Run]) -> list[str]:
    """Stated against realized P(a fresh run meets the bound), settled and unsettled apart, and
    by bin of the stated chance."""
    outs = [h for r in rows for h in r.headroom]
    if not outs:
        return []
    lines = []
    for label, group in (("settled", [h for h in outs if h.settled]),
                         ("within noise", [h for h in outs if not h.settled])):  # fmt: skip
        if group:
            lines.append(
                f"  {label:13} {len(group):4} bounds (of {len(rows)} runs' winners): stated "
                f"{statistics.fmean(h.stated for h in group):.2f}, realized "
                f"{statistics.fmean(h.realized for h in group):.2f}"
            )
    cells = []
    for lo, hi in itertools.pairwise((0.0, 0.5, 0.8, 0.9, 0.977, 0.999, 1.0001)):
        got = [h for h in outs if lo <= h.stated < hi]
        if got:
            cells.append(f"{statistics.fmean(h.stated for h in got):.3f}->"
                         f"{statistics.fmean(h.realized for h in got):.3f} ({len(got)})")  # fmt: skip
    lines.append("  by bin: " + ", ".join(cells))
    return lines


def chance_outcomes(report: Report, truth: Truth, improvement: float) -> list[ChanceOutcome]:
    """The chances `auto` acted on (the trials the report counts, view.chosen_by_chance), each
    against the truth; a win beats the incumbent by more than `improvement` (the run's
    SearchSettings.improvement)."""
    out = []
    for t in chosen_by_chance(report):
        c = t.chances
        assert c is not None
        cfg = t.config.to_config()
        success = truth.margin.get(cfg, -1.0) >= 0.0
        # The event P(beat) is about: its truth against the incumbent's truth, 2 % up.
        line = 0.0
        if c.incumbent is not None:
            line = truth.tps[c.incumbent.to_config()] * (1 + improvement)
        beat = success and truth.tps.get(cfg, 0.0) > line
        out.append(ChanceOutcome(t.purpose or "explore", c.p_success, c.p_beat, success, beat))
    return out


CHANCE_BINS = (0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 0.95, 1.0001)


def _chance_lines(label: str, rows: list[Run], long_shot: float) -> list[str]:
    """Expected (sum of the chances) against realized (how many came true), for P(meets the SLO)
    and P(beats the best); for `all`, also per bin of the stated chance. An exploration given
    less than `long_shot` (the stop probability in effect) to beat the best is a long shot: no
    single one keeps a run going, but together such chances do, so they are what its proof is
    made of."""
    outs = [o for r in rows for o in r.chances]
    if not outs:
        return []

    def pair(pred: list[float], real: list[bool]) -> str:
        e, k = sum(pred), sum(real)
        return f"{e:8.1f} {k:6d} {k / e if e else float('nan'):6.2f}"

    long = [o for o in outs if o.purpose == "explore" and o.p_beat < long_shot]
    lines = [
        f"{label:14} {len(outs):>6} {pair([o.p_success for o in outs], [o.success for o in outs])}"
        f"   {pair([o.p_beat for o in outs], [o.beat for o in outs])}"
        f"   {len(long):>5} {len(long) / len(rows):>7.1f} {pair([o.p_beat for o in long], [o.beat for o in long])}"
    ]
    if label == "all":
        for purpose, kind in itertools.product(("explore", "cover"), ("p_success", "p_beat")):
            cells = []
            for lo, hi in itertools.pairwise(CHANCE_BINS):
                got = [o for o in outs if o.purpose == purpose and lo <= getattr(o, kind) < hi]
                if got:
                    pred = statistics.fmean(getattr(o, kind) for o in got)
                    real = statistics.fmean(
                        (o.success if kind == "p_success" else o.beat) for o in got
                    )
                    cells.append(f"{pred:.2f}->{real:.2f} ({len(got)})")
            lines.append(f"  {purpose:7} {kind:9} by bin: " + ", ".join(cells))
    return lines


def _p90(xs: list[int]) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))]


def _row(label: str, rows: list[Run]) -> str:
    share = sum(r.reached for r in rows) / len(rows)
    strict = sum(r.strict for r in rows) / len(rows)
    trials = [r.executed for r in rows]
    wide = sum(r.wide_margin_executed for r in rows)
    found = [r.found_at for r in rows if r.found_at is not None]
    found_at = f"{statistics.median(found):>6.1f}" if found else f"{'-':>6}"
    minutes = statistics.median(r.minutes for r in rows)
    confident = [r for r in rows if r.confidence is not None and r.confidence >= 0.95]
    if confident:
        right = sum(r.reached for r in confident) / len(confident)
        right_strict = sum(r.strict for r in confident) / len(confident)
        calib = f"{right:>6.0%} ({right_strict:>4.0%}) of {len(confident):>3}"
    else:
        calib = f"{'-':>20}"
    return (
        f"{label:14} {len(rows):>5} {share:>9.0%} {strict:>7.0%} {statistics.median(trials):>8.1f} "
        f"{_p90(trials):>5} {found_at} {minutes:>7.0f} {wide:>6} {calib}"
    )


def _failure_row(label: str, rows: list[Run]) -> str:
    share = sum(r.reached for r in rows) / len(rows)
    failed = [r.failed for r in rows]
    if any(r.structures for r in rows):
        inside_ = [r.failed_inside for r in rows if r.structures]
        structured = f"{statistics.median(inside_):>8.1f} {_p90(inside_):>5}"
    else:
        structured = f"{'-':>8} {'-':>5}"
    transient = [r.transient for r in rows]
    excluding = sum(1 for r in rows if r.excluded)
    return (
        f"{label:14} {len(rows):>5} {share:>9.0%} {statistics.median(failed):>8.1f} "
        f"{sum(failed):>6} {structured} {statistics.median(transient):>9.1f} "
        f"{sum(transient):>6} {excluding:>9}"
    )


def gpu_minutes(report: Report, priors: dict[TrialConfig, Prediction]) -> float:
    """The GPU time a run's trials would take on the simulated pool's clock (simulated.py): per
    trial a server start, a weight load, a warm-up and the measured requests. A replayed table
    records no durations (its trials count start and load only)."""
    seconds = 0.0
    for t in report.trials:
        if t.executed:
            cfg = t.config.to_config()
            weights = priors[cfg].memory.weights_gib_per_gpu * cfg.tp
            seconds += pool_seconds(weights, t.duration_s or 0.0)
    return seconds / 60


def _reaches(got: float, ok: bool, optimum: float) -> bool:
    """Whether a configuration with true tok/s/GPU `got`, truly meeting every bound (`ok`),
    reaches `optimum` (the zone-aware or the strict one)."""
    return ok and got >= REACH * optimum


def run_world(
    world: World,
    truth: Truth,
    samplers: list[str],
    budget: int,
    hyperprior: Hyperprior,
    overrides: dict[str, Any] | None = None,
    oracle: Mode | None = None,
    transient: float = 0.0,
) -> list[tuple[str, Run, str]]:
    """Every sampler on one world: [(sampler, run, verbose line)]; `overrides` replace
    SearchSettings defaults (--set); `oracle` makes `auto`'s explorations know the truth
    (oracle.py), reported as sampler `auto-oracle-MODE`; `transient`: the probability that a
    trial fails with a transient error (--transient)."""
    base = world.request("auto", budget)
    space = build_space(base, base.resolve_model(), base.resolve_gpu())
    priors = prior_predictions(base, space)
    gpu_mem = base.resolve_gpu().memory_gib
    margins = {c: memory_margin(priors[c], gpu_mem) for c in space.configs}
    settings = SearchSettings(hyperprior=hyperprior, **(overrides or {}))
    out = []
    for sampler in samplers:
        req = world.request(sampler, budget)
        executed: list[TrialConfig] = []
        failed: list[TrialConfig] = []
        transients: list[TrialConfig] = []

        def hook(cfg, m, checks, known, executed=executed, failed=failed,  # type: ignore[no-untyped-def]
                 transients=transients) -> None:  # fmt: skip
            executed.append(cfg)
            if m.status == "error":
                (transients if is_transient(m) else failed).append(cfg)

        factory: PlannerFactory = Planner
        if oracle is not None and sampler == "auto":
            factory = oracle_factory(truth, world.backend(req), oracle)
            sampler = f"auto-oracle-{oracle}"
        backend: BenchmarkBackend = world.backend(req)
        if transient:  # the same draws for every sampler: per world, configuration and run
            backend = Transient(backend, transient, f"{world.family}:{world.name}:{world.seed}")
        with tempfile.TemporaryDirectory() as tmp:
            report = tune(req, backend=backend, out_dir=Path(tmp),
                          on_trial=hook, settings=settings, planner_factory=factory)  # fmt: skip
        assert report is not None
        chosen = report.best.config.to_config() if report.best else None
        got, ok, ok_strict = truth.value(chosen)
        # Where nothing meets the SLO, choosing nothing is right too.
        reached = (chosen is None and truth.optimum == 0.0) or _reaches(got, ok, truth.optimum)
        strict = (chosen is None and truth.strict == 0.0) or _reaches(got, ok_strict, truth.strict)
        wide = sum(1 for c in executed if margins[c] < -settings.wide_margin)
        found_at = next(
            (i for i, c in enumerate(executed, 1) if _reaches(*truth.value(c)[:2], truth.optimum)),
            None,
        )
        confidence = report.confidence
        label = chosen.label() if chosen else "-"
        excluded = sum(1 for f in report.could_not_run if f.kind == "structure")
        purposes = Counter(t.purpose for t in report.trials if t.executed)
        why = "".join(f"{k[0]}{k[2]}{v}" for k, v in sorted(purposes.items()) if k)
        line = (f"{world.name:26} {world.family:13} s{world.seed} {sampler:6} "
                f"trials {report.executed_trials:3} ({why:14}) failed {len(failed):2} "
                f"transient {len(transients)} excluded {excluded} {label:26} got {got:7.0f}{'' if ok else '!'} "
                f"opt {truth.optimum:7.0f} strict {truth.strict:7.0f} "
                f"conf {confidence if confidence is not None else '-'} "
                f"{'ok' if reached else 'MISS'}{'' if strict else '(strict miss)'} | "
                f"{report.stopped_reason[:70]}")  # fmt: skip
        share = got / truth.optimum if truth.optimum else float(reached)
        surprised = any(
            abs(math.log(t.metrics.output_tokens_per_s_per_gpu
                         / t.predicted.output_tokens_per_s_per_gpu)) >= math.log(2)
            for t in report.trials
            if t.executed and t.metrics and t.predicted
            and t.metrics.output_tokens_per_s_per_gpu > 0
        )  # fmt: skip
        run = Run(world.family, world.name, world.seed, reached, strict,
                  report.executed_trials, wide, confidence, share, surprised, found_at,
                  gpu_minutes(report, priors), chance_outcomes(report, truth, settings.improvement),
                  headroom_outcomes(report, world, req) if req.tuning.sampler == "auto" else [],
                  len(failed), sum(inside(truth.failing, c) for c in failed),
                  len(truth.failing), len(transients), excluded)  # fmt: skip
        out.append((sampler, run, line))
    return out


def _lofo(
    family: str, truths: list[Truth], worlds_: list[World], fit_families: list[str]
) -> tuple[str, Hyperprior]:
    """The hyperprior fitted on the fit families' worlds, `family` left out (and the family
    whose physics it has: worldset.SAME_PHYSICS)."""
    out = (family, SAME_PHYSICS.get(family))
    fields = [
        f
        for t, w in zip(truths, worlds_, strict=True)
        if w.family not in out and w.family in fit_families
        for f in t.fields
    ]
    return family, fit_hyperprior(fields, f"leave-one-family-out: all but {family}")


def _setting(text: str) -> tuple[str, float | int | bool]:
    """`NAME=VALUE` for --set: a SearchSettings field and a value of its type."""
    name, sep, value = text.partition("=")
    kinds = {  # a field's type is its annotation's text (settings.py postpones annotations)
        f.name: f.type if isinstance(f.type, str) else f.type.__name__
        for f in dataclasses.fields(SearchSettings)
        if f.name not in ("hyperprior", "run_noise")
    }
    if not sep or name not in kinds:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(kinds))}"
        )
    kind = kinds[name]
    try:
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return name, value.lower() == "true"
        return name, int(value) if kind == "int" else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {name} takes {kind} values") from None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--samplers", default="auto,tpe,random,grid")
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                    help="comma-separated world families (default: all but the failing ones, "
                         "failing and dev-failing, which are scored when named)")  # fmt: skip
    ap.add_argument("--fit-families", default=",".join(FIT_FAMILIES),
                    help="families the leave-one-family-out hyperpriors are fitted on (never "
                         "the held-out real-GPU and failing worlds)")  # fmt: skip
    ap.add_argument("--hyperprior", choices=("lofo", "shipped"), default="lofo")
    ap.add_argument("--scenarios", default="", help="comma-separated scenario indexes")
    ap.add_argument("--jobs", type=int, default=1, help="worlds run in parallel processes")
    ap.add_argument("--kernel-luck", type=float, default=0.0, metavar="SD",
                    help="stress form: every configuration of every scored world runs a fixed "
                         "factor exp(N(0, SD)) off its neighbours (worldset.KernelLuck); scored "
                         "with the shipped hyperprior, which never saw it")  # fmt: skip
    ap.add_argument("--run-noise", type=float, default=0.0, metavar="SD",
                    help="stress form: every run of every configuration runs a new factor "
                         "exp(N(0, SD)) off its typical run, on top of the pool's own noise "
                         "(worldset.RunNoise); scored with the shipped hyperprior")  # fmt: skip
    ap.add_argument("--own-roughness", type=float, default=0.0, metavar="SD",
                    help="give the own families the per-configuration luck exp(N(0, SD)) that "
                         "real pools show (the real-GPU world: 0.04; fit_hyperprior.py prints "
                         "each family's); a world form, so the hyperpriors are fitted with it "
                         "(leave one family out)")  # fmt: skip
    ap.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE",
                    help="score `auto` with a SearchSettings field other than its default "
                         "(repeatable), e.g. --set stop_probability=0.08")  # fmt: skip
    ap.add_argument("--oracle", choices=MODES,
                    help="score `auto` with explorations that know the truth (oracle.py): "
                         "`find` measures the optimum first, `lookahead` also chooses the "
                         "proof's trials by their actual outcome; everything else is `auto`'s")  # fmt: skip
    ap.add_argument("--transient", type=float, default=0.0, metavar="P",
                    help="every trial of every scored world fails with probability P with a "
                         "transient error (server not ready, connection reset, node low on "
                         "memory, pod evicted) that its configuration's next run does not "
                         "repeat (worlds/failures.py, Transient)")  # fmt: skip
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--csv", type=Path, help="write every run's outcome here")
    ap.add_argument("--cache", type=Path,
                    help="keep the worlds' truths and hyperpriors in this file and reuse them "
                         "(they depend on the worlds and the hyperprior fit, not the search)")  # fmt: skip
    args = ap.parse_args()
    samplers = args.samplers.split(",")
    families = args.families.split(",")
    scenarios = [int(i) for i in args.scenarios.split(",")] if args.scenarios else None
    started = time.perf_counter()
    if (args.kernel_luck or args.run_noise) and args.hyperprior != "shipped":
        ap.error("--kernel-luck and --run-noise are forms no hyperprior was fitted on: use "
                 "--hyperprior shipped")  # fmt: skip
    if args.own_roughness and args.kernel_luck:
        ap.error("--own-roughness and --kernel-luck are both per-configuration luck: use one")
    if not 0.0 <= args.transient < 1.0:
        ap.error("--transient is a probability: at least 0, below 1")
    rough = args.own_roughness
    scored = worlds(families, args.seeds, scenarios, args.kernel_luck, args.run_noise, rough)
    fit_families = args.fit_families.split(",") if args.hyperprior == "lofo" else []
    fit_worlds = worlds(fit_families, args.seeds, scenarios, own_roughness=rough)
    fit_only = [w for w in fit_worlds if w not in scored]
    everything = scored + fit_only
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        # The cache holds truths per world and hyperpriors per held-out family (fitted on a
        # given set of worlds): whatever of them this run needs and finds is reused.
        cache: dict[str, dict] = {"truths": {}, "priors": {}}
        if args.cache and args.cache.exists():
            cache = pickle.loads(args.cache.read_bytes())
        todo = [w for w in everything if w not in cache["truths"]]
        cache["truths"].update(zip(todo, pool.map(truth_of, todo, chunksize=2), strict=True))
        truths = [cache["truths"][w] for w in everything]
        fit_key = tuple(sorted((w for w in everything if w.family in fit_families), key=repr))
        if args.hyperprior == "lofo":
            need = [f for f in families if (f, fit_key) not in cache["priors"]]
            n = len(need)
            fitted = pool.map(_lofo, need, [truths] * n, [everything] * n, [fit_families] * n)
            for fam, prior in fitted:
                cache["priors"][(fam, fit_key)] = prior
            priors = {f: cache["priors"][(f, fit_key)] for f in families}
        else:
            priors = {f: default_hyperprior() for f in families}
        if args.cache:
            args.cache.write_bytes(pickle.dumps(cache))
        print(f"truths and hyperpriors: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        futures = [
            pool.submit(
                run_world,
                w,
                t,
                samplers,
                args.budget,
                priors[w.family],
                dict(args.set),
                args.oracle,
                args.transient,
            )
            for w, t in zip(scored, truths[: len(scored)], strict=True)
        ]
        results: dict[str, list[Run]] = defaultdict(list)
        for fut in futures:  # in submission order: the same output for any --jobs
            for sampler, run, line in fut.result():
                results[sampler].append(run)
                if args.verbose:
                    print(line, file=sys.stderr)
    luck = f"; kernel luck sd {args.kernel_luck:g}" if args.kernel_luck else ""
    luck += f"; own families' roughness sd {rough:g}" if rough else ""
    luck += f"; run noise sd {args.run_noise:g}" if args.run_noise else ""
    luck += "".join(f"; {k}={v}" for k, v in args.set)
    luck += f"; oracle: {args.oracle}" if args.oracle else ""
    luck += f"; transient failures p {args.transient:g}" if args.transient else ""
    print(f"{len(scored)} worlds per sampler ({', '.join(families)}; {args.seeds} seeds{luck}); "
          f"hyperprior: {args.hyperprior}; budget {args.budget}; "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    head = (f"{'':14} {'runs':>5} {'>=98% opt':>9} {'strict':>7} {'median':>8} {'p90':>5} "
            f"{'found':>6} {'gpu-min':>7} {'wide':>6} {'calibration (strict)':>20}")  # fmt: skip
    long_shot = float(dict(args.set).get("stop_probability", SearchSettings.stop_probability))
    for sampler, rows in results.items():
        print(f"\n[{sampler}]  trials executed (confirmations included); found = median trial "
              "that first measured a configuration reaching the optimum (the trials after it "
              "were the proof); gpu-min = median modelled GPU minutes of a run's trials (server "
              "starts, weight loads, warm-ups, measurements; replayed tables record no "
              "durations); wide = executed configs the memory model rules out by a wide "
              "margin; calibration = runs that reached the optimum (strictly) among those "
              "claiming >= 95 % confidence")  # fmt: skip
        print(head)
        print(_row("all", rows))
        for family in families:
            fam_rows = [r for r in rows if r.family == family]
            if fam_rows:
                print(_row(family, fam_rows))
        surprised = [r for r in rows if r.surprised]
        if surprised:
            print(_row("model >=2x off", surprised))
            print("  (runs that measured a configuration whose tok/s/GPU was at least 2x off the "
                  "model's prediction, every family)")  # fmt: skip
        failing = [f for f in families if any(r.failed or r.structures or r.transient
                                               for r in rows if r.family == f)]  # fmt: skip
        if failing:
            print(f"\n[{sampler}]  failures: failed = failed trials per run (status error; "
                  "an OOM is memory, not counted), median, and their total; inside = failed "
                  "trials a run spent inside the world's failing structures (summed over them), "
                  "median and p90 ('-': its worlds declare none); transient = transient "
                  "failures per run (re-run, not evidence), median and total; excluding = runs "
                  "whose report excluded a structure that could not run")  # fmt: skip
            print(f"{'':14} {'runs':>5} {'>=98% opt':>9} {'failed':>8} {'total':>6} "
                  f"{'inside':>8} {'p90':>5} {'transient':>9} {'total':>6} "
                  f"{'excluding':>9}")  # fmt: skip
            for family in failing:
                print(_failure_row(family, [r for r in rows if r.family == family]))
        chance_rows = _chance_lines("all", rows, long_shot)
        if chance_rows:
            print(f"\n[{sampler}]  the chances it acted on: every trial chosen to explore, cover "
                  "or probe, the chance the posterior gave it then against what the world's "
                  "typical run of it does; expected = sum of the chances, realized = how many "
                  "came true, ratio = realized / expected (1: honest; above 1 for 'beats': "
                  "the model underrates what it has not measured, and its confidence is too "
                  "high)")  # fmt: skip
            print(f"  long shots: explorations given under {long_shot:.0%} to beat the best "
                  "(the proof the stop rule waits on), how many per run, and their expected "
                  "and realized wins")  # fmt: skip
            print(f"{'':14} {'trials':>6} {'meets SLO: expected realized ratio':>34}   "
                  f"{'beats the best: expected realized ratio':>38}   "
                  f"{'long shots: n per run expected realized ratio':>47}")  # fmt: skip
            print("\n".join(chance_rows))
            for family in families:
                rows_f = [r for r in rows if r.family == family]
                print("\n".join(_chance_lines(family, rows_f, long_shot)))
        if surprised:
            print("\n".join(_chance_lines("model >=2x off", surprised, long_shot)))
        headroom_rows = _headroom_lines(rows)
        if headroom_rows:
            print(f"\n[{sampler}]  the chosen configurations' SLO headroom: the report's P(a fresh "
                  f"run meets the bound) against the share of {FRESH_RUNS} fresh runs of the "
                  "chosen configuration on the world's pool that did; 'within noise' are the "
                  "bounds the report flags (room under two run-to-run SDs)")  # fmt: skip
            print("\n".join(headroom_rows))
    if args.csv:
        write_csv(args.csv, [
            {"sampler": s, **{k: v for k, v in vars(r).items() if k not in ("chances", "headroom")}}
            for s, rows in results.items() for r in rows
        ])  # fmt: skip


if __name__ == "__main__":
    main()
