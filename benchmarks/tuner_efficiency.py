"""How well each sampler finds the best SLO-feasible configuration on pools unlike the model.

Scenarios mix GPUs, models, workloads and SLOs (TTFT/ITL/E2E bounds at p50/p95/p99) over spaces
of ~100-300 configurations. Each runs against simulated pools of every world family
(`infertune_tuner.backends.worlds`): generators with their own formulas and memory accounting, each
exaggerating one real effect the roofline prior has no term for (prefill stalls, all-reduce
latency, FP8/INT4 gains that move with batch, a memory frontier elsewhere, CUDA-graph gaps,
noise and outliers), plus `own-model` (the prior with perturbed factors, the old benchmark).

The truth of a configuration is what a typical run of it shows on the pool (`WorldBackend.truth`:
no run noise, a population-sized sample). Measurements carry run-to-run noise (1-4 %, more in the
tails), so whether a configuration whose truth lies within two run-to-run standard deviations of
an SLO bound meets it is something no benchmark resolves in a few runs: such a configuration may
be chosen, and it is not required to be found. So each configuration gets a resolution zone of
max(2 %, 2 x its run-to-run standard deviation) around the bounds (estimated from 5 extra runs
of every configuration near a bound); the optimum a run is scored against is the best true
tok/s/GPU among configurations that meet every bound by more than their zone, and a run
*reaches* it when the chosen configuration truly meets every bound within its zone and its true
tok/s/GPU is >= 98 % of that optimum. The strict score (optimum = best configuration meeting
every bound by any margin; chosen must truly meet every bound within 2 %) is printed beside it. Prints, per sampler and per
family: share of runs reaching it, median and p90 executed trials (confirmations included),
executed configurations the memory model rules out by a wide margin, and for `auto` how well
its stated confidence is calibrated (of the runs that stopped claiming >= 95 %, the share that
reached the optimum).

    python benchmarks/tuner_efficiency.py [--seeds 5] [--budget 40]
        [--samplers auto,tpe,random,grid] [--families admission,...] [--jobs 2] [--verbose]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from infertune_tuner import slo as slo_mod
from infertune_tuner.backends.worlds import FAMILIES, WorldBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import (
    GpuRef,
    ModelRef,
    SearchValues,
    SloBound,
    TuningOptions,
    TuningRequest,
    WorkloadShape,
)  # fmt: skip
from infertune_tuner.run import prior_predictions, tune
from infertune_tuner.search.memory_fit import memory_margin, ruled_out
from infertune_tuner.space import build_space

B11 = [1, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
B12 = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
SLO_TOLERANCE = 0.02  # a chosen configuration may miss a bound by this much in truth
REACH = 0.98


def slo(*bounds: tuple[str, str, float]) -> list[SloBound]:
    return [SloBound(metric=m, percentile=p, max_ms=v) for m, p, v in bounds]  # type: ignore[arg-type]


# name, model, gpu, max gpus, isl, osl, slo, tp, batches, quants, kvs, accuracy allowance
SCENARIOS = [
    ("llama2-70b/H100 e2e", "llama-2-70b", "H100-SXM-80GB", 8, 1024, 512,
     slo(("e2e_ms", "p95", 25600)), [1, 2, 4, 8], B11, ["fp16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama2-70b/A100 e2e", "llama-2-70b", "A100-SXM-80GB", 8, 1024, 512,
     slo(("e2e_ms", "p95", 25600)), [1, 2, 4, 8], [*B11, 24, 40], ["fp16", "bf16", "w4a16_awq"],
     ["auto"], 2.0),
    ("llama3-8b/L4 e2e", "llama-3-8b", "L4-24GB", 2, 512, 256,
     slo(("e2e_ms", "p95", 20000)), [1, 2], B11,
     ["bf16", "fp8", "w4a16_awq", "w4a8_awq"], ["auto", "fp8"], 2.0),
    ("mistral7b/A10 chat", "mistral-7b", "A10-24GB", 4, 2048, 256,
     slo(("ttft_ms", "p95", 1500), ("itl_ms", "p50", 40)), [1, 2, 4], B12,
     ["bf16", "fp16", "w4a16_awq"], ["auto"], 2.0),
    ("llama3-70b/H100 ttft+e2e", "llama-3-70b", "H100-SXM-80GB", 8, 1024, 256,
     slo(("ttft_ms", "p95", 2000), ("e2e_ms", "p95", 15000)), [1, 2, 4, 8], B11,
     ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("mixtral/H100 itl", "mixtral-8x7b", "H100-SXM-80GB", 8, 512, 512,
     slo(("itl_ms", "p95", 60)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("qwen2-72b/H200 e2e99", "qwen2-72b", "H200-SXM-141GB", 8, 2048, 512,
     slo(("e2e_ms", "p99", 30000)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama2-13b/A100-40 itl", "llama-2-13b", "A100-SXM-40GB", 8, 1024, 256,
     slo(("itl_ms", "p50", 30)), [1, 2, 4, 8], B12, ["fp16", "bf16", "w4a16_awq"], ["auto"], 2.0),
    ("qwen2-7b/L40S long", "qwen2-7b", "L40S-48GB", 4, 4096, 512,
     slo(("ttft_ms", "p95", 3000), ("e2e_ms", "p95", 20000)), [1, 2, 4], B12,
     ["bf16", "fp8", "w4a8_awq"], ["auto", "fp8"], 2.0),
    ("llama3-8b/B200 itl99", "llama-3-8b", "B200-SXM-192GB", 8, 1024, 1024,
     slo(("itl_ms", "p99", 25)), [1, 2, 4, 8], B11, ["bf16", "fp8", "nvfp4"], ["auto", "fp8"], 2.0),
    ("llama3-70b/H100-PCIe e2e", "llama-3-70b", "H100-PCIE-80GB", 8, 2048, 256,
     slo(("e2e_ms", "p95", 20000)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama3-70b/GH200 ttft", "llama-3-70b", "GH200-96GB", 4, 1024, 512,
     slo(("ttft_ms", "p99", 1000), ("e2e_ms", "p50", 30000)), [1, 2, 4], B12,
     ["bf16", "fp8", "w4a8_awq"], ["auto", "fp8"], 2.0),
]  # fmt: skip


def request_for(sc: tuple, sampler: str, seed: int, budget: int) -> TuningRequest:  # type: ignore[type-arg]
    name, model, gpu, maxg, isl, osl, bounds, tps, bs, qs, kvs, acc = sc
    return TuningRequest(
        name=name.replace("/", "-").replace(" ", "-").replace("+", "-").lower(),
        model=ModelRef(name=model),
        gpu=GpuRef(product=gpu, max_gpus_per_replica=maxg),
        workload=WorkloadShape(input_tokens=isl, output_tokens=osl),
        slo=bounds,
        search=SearchValues(tensor_parallel=tps, max_batch_size=bs, quantization=qs,
                           kv_cache_dtype=kvs, max_accuracy_loss_percent=acc),
        tuning=TuningOptions(max_trials=budget, seed=seed, sampler=sampler, backend="simulated"),
    )  # fmt: skip


@dataclass
class Truth:
    optimum: float  # best true tok/s/GPU meeting every bound by more than its zone; 0 = none
    strict: float  # best true tok/s/GPU meeting every bound by any margin
    world: WorldBackend
    zone: dict[TrialConfig, float]  # resolution zone per configuration (relative)
    margin: dict[TrialConfig, float]  # true worst relative margin over the bounds (>0 = meets)
    tps: dict[TrialConfig, float]

    def value(self, cfg: TrialConfig | None) -> tuple[float, bool, bool]:
        """True tok/s/GPU of `cfg`, whether it truly meets every bound within its zone, and
        whether it does within the strict 2 %."""
        if cfg is None or cfg not in self.margin:
            return 0.0, False, False
        m = self.margin[cfg]
        return self.tps[cfg], m >= -self.zone[cfg], m >= -SLO_TOLERANCE


NOISE_RUNS = 5


def _margin(request: TuningRequest, m: Measurement) -> float | None:
    checks = slo_mod.check(request, m)
    return -max(slo_mod.constraint_values(checks)) if checks else None


def truth_for(request: TuningRequest, family: str, seed: int) -> Truth:
    world = WorldBackend(request, family, seed=seed)
    noise_probe = WorldBackend(request, family, seed=seed)
    t = Truth(0.0, 0.0, world, {}, {}, {})
    for cfg in build_space(request, request.resolve_model(), request.resolve_gpu()).configs:
        m = world.truth(cfg)
        margin = _margin(request, m)
        if margin is None:
            continue
        t.margin[cfg], t.tps[cfg] = margin, m.output_tokens_per_s_per_gpu or 0.0
        zone = SLO_TOLERANCE
        if abs(margin) < 0.25:
            runs = [noise_probe.run(cfg) for _ in range(NOISE_RUNS)]
            logs = [
                [math.log(max(v, 1e-9)) for v in values]
                for values in zip(*(_bound_values(request, r) for r in runs), strict=True)
            ]
            zone = max(zone, 2 * max(statistics.pstdev(v) for v in logs))
        t.zone[cfg] = zone
        if margin >= 0:
            t.strict = max(t.strict, t.tps[cfg])
        if margin >= zone:
            t.optimum = max(t.optimum, t.tps[cfg])
    return t


def _bound_values(request: TuningRequest, m: Measurement) -> list[float]:
    out = []
    for b in request.slo:
        p = m.percentiles(b.metric)
        out.append(p.get(b.percentile) if p else float("inf"))
    out.append(m.output_tokens_per_s_per_gpu or 0.0)
    return out


@dataclass
class Run:
    family: str
    reached: bool
    strict: bool
    executed: int
    wide_margin_executed: int
    confidence: float | None


def _p90(xs: list[int]) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))]


def _row(label: str, rows: list[Run]) -> str:
    share = sum(r.reached for r in rows) / len(rows)
    strict = sum(r.strict for r in rows) / len(rows)
    trials = [r.executed for r in rows]
    wide = sum(r.wide_margin_executed for r in rows)
    confident = [r for r in rows if r.confidence is not None and r.confidence >= 0.95]
    calib = (
        f"{sum(r.reached for r in confident) / len(confident):>6.0%} of {len(confident):>3}"
        if confident
        else f"{'-':>13}"
    )
    return (
        f"{label:14} {len(rows):>5} {share:>9.0%} {strict:>7.0%} {statistics.median(trials):>8.1f} "
        f"{_p90(trials):>5} {wide:>6} {calib}"
    )


def run_world(
    sc: tuple,
    family: str,
    seed: int,
    samplers: list[str],
    budget: int,  # type: ignore[type-arg]
) -> tuple[int, list[tuple[str, Run, str]]]:
    """Every sampler on one world: (space size, [(sampler, run, verbose line)])."""
    base = request_for(sc, "auto", seed, budget)
    truth = truth_for(base, family, seed)
    space = build_space(base, base.resolve_model(), base.resolve_gpu())
    priors = prior_predictions(base, space)
    gpu_mem = base.resolve_gpu().memory_gib
    margins = {c: memory_margin(priors[c], gpu_mem) for c in space.configs}
    out = []
    for sampler in samplers:
        req = request_for(sc, sampler, seed, budget)
        executed: list[TrialConfig] = []

        def hook(cfg, m, checks, known, executed=executed) -> None:  # type: ignore[no-untyped-def]
            executed.append(cfg)

        with tempfile.TemporaryDirectory() as tmp:
            report = tune(req, backend=WorldBackend(req, family, seed=seed),
                          out_dir=Path(tmp), on_trial=hook)  # fmt: skip
        chosen = report.best.config.to_config() if report.best else None
        got, ok, ok_strict = truth.value(chosen)
        if truth.optimum == 0.0:
            reached = chosen is None or ok
        else:
            reached = ok and got >= REACH * truth.optimum
        if truth.strict == 0.0:
            strict = chosen is None or ok_strict
        else:
            strict = ok_strict and got >= REACH * truth.strict
        wide = sum(1 for c in executed if ruled_out(margins[c]))
        confidence = report.confidence
        line = (f"{sc[0]:26} {family:12} s{seed} {sampler:6} "
                f"trials {report.executed_trials:3} got {got:7.0f}{'' if ok else '!'} "
                f"opt {truth.optimum:7.0f} conf {confidence if confidence is not None else '-'} "
                f"{'ok' if reached else 'MISS'} | {report.stopped_reason[:60]}")  # fmt: skip
        out.append(
            (sampler, Run(family, reached, strict, report.executed_trials, wide, confidence), line)
        )
    return len(space), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--samplers", default="auto,tpe,random,grid")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--scenarios", default="", help="comma-separated scenario indexes")
    ap.add_argument("--jobs", type=int, default=1, help="worlds run in parallel processes")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    samplers = args.samplers.split(",")
    families = args.families.split(",")
    scenarios = (
        [SCENARIOS[int(i)] for i in args.scenarios.split(",")] if args.scenarios else SCENARIOS
    )
    results: dict[str, list[Run]] = defaultdict(list)
    started = time.perf_counter()
    sizes = []
    worlds = [(sc, f, seed) for sc in scenarios for f in families for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_world, *w, samplers, args.budget) for w in worlds]
        for fut in futures:  # in submission order: the same output for any --jobs
            size, rows = fut.result()
            sizes.append(size)
            for sampler, run, line in rows:
                results[sampler].append(run)
                if args.verbose:
                    print(line, file=sys.stderr)
    runs = len(worlds)
    print(f"{len(scenarios)} scenarios x {len(families)} world families x {args.seeds} seeds = "
          f"{runs} runs per sampler; space sizes {min(sizes)}-{max(sizes)} "
          f"(median {statistics.median(sizes):.0f}); budget {args.budget}; "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    head = (f"{'':14} {'runs':>5} {'>=98% opt':>9} {'strict':>7} {'median':>8} {'p90':>5} {'wide':>6} "
            f"{'calibration':>13}")  # fmt: skip
    for sampler, rows in results.items():
        print(f"\n[{sampler}]  trials executed (confirmations included); wide = executed configs "
              "the memory model rules out by a wide margin; calibration = runs that reached the "
              "optimum among those claiming >= 95 % confidence")  # fmt: skip
        print(head)
        print(_row("all", rows))
        for family in families:
            fam_rows = [r for r in rows if r.family == family]
            if fam_rows:
                print(_row(family, fam_rows))


if __name__ == "__main__":
    main()
