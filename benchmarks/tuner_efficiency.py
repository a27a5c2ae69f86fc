"""How well each sampler finds the best SLO-feasible configuration, and at what cost.

Scenarios mix GPUs, models, workloads and SLOs over spaces of ~100-300 configurations. Each runs
against a simulated GPU pool whose "truth" is perturbed away from the prior (every efficiency
factor x one "software stack" factor in [0.7, 1.5], then each jittered by up to +-35 %, the runtime
memory reserve shifted by up to +-0.75 GiB), so the
model-guided search cannot win merely because prior and truth are the same function.

The true optimum of a run is the best SLO-feasible tok/s/GPU over *every* configuration of the
space measured on that same pool. Prints, per sampler: share of runs reaching >= 98 % of it,
median and p90 executed trials, and executed configs the memory model could have ruled out.

    python benchmarks/tuner_efficiency.py [--seeds 3] [--budget 40] [--samplers auto,tpe,random,grid]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from infertune_tuner.backends.simulated import SimulatedBackend
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
from infertune_tuner.space import build_space
from infertune_tuner.strategy import Known

B11 = [1, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
B12 = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]


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


def true_optimum(request: TuningRequest, backend: SimulatedBackend) -> float:
    from infertune_tuner import slo as slo_mod

    model, gpu = request.resolve_model(), request.resolve_gpu()
    best = 0.0
    for cfg in build_space(request, model, gpu).configs:
        m = backend.run(cfg)
        checks = slo_mod.check(request, m)
        if checks and all(c.ok for c in checks):
            best = max(best, m.output_tokens_per_s_per_gpu or 0.0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--samplers", default="auto,tpe,random,grid")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    samplers = args.samplers.split(",")
    results: dict[str, list[tuple[bool, int, int]]] = {s: [] for s in samplers}
    started = time.perf_counter()
    sizes = []
    for sc in SCENARIOS:
        for seed in range(args.seeds):
            base = request_for(sc, "auto", seed, args.budget)
            truth = SimulatedBackend.perturbed(base, seed=seed)
            optimum = true_optimum(base, truth)
            space = build_space(base, base.resolve_model(), base.resolve_gpu())
            priors = prior_predictions(base, space)
            sizes.append(len(space))
            for sampler in samplers:
                req = request_for(sc, sampler, seed, args.budget)
                executed: list = []

                def hook(cfg, m, checks, known: Known, executed=executed) -> None:  # type: ignore[no-untyped-def]
                    executed.append(cfg)

                with tempfile.TemporaryDirectory() as tmp:
                    report = tune(req, backend=SimulatedBackend.perturbed(req, seed=seed),
                                  out_dir=Path(tmp), on_trial=hook)  # fmt: skip
                got = report.best.metrics.output_tokens_per_s_per_gpu if report.best else 0.0
                reached = (optimum == 0.0 and got == 0.0) or (optimum > 0 and got >= 0.98 * optimum)
                ruled_out = sum(1 for c in executed if not priors[c].fits)
                results[sampler].append((reached, report.executed_trials, ruled_out))
                if args.verbose:
                    print(f"{sc[0]:28} seed {seed} {sampler:6} trials {report.executed_trials:3} "
                          f"best {got:7.0f} optimum {optimum:7.0f} {'ok' if reached else 'MISS'}",
                          file=sys.stderr)  # fmt: skip
    runs = len(SCENARIOS) * args.seeds
    print(f"{len(SCENARIOS)} scenarios x {args.seeds} seeds = {runs} runs per sampler; "
          f"space sizes {min(sizes)}-{max(sizes)} (median {statistics.median(sizes):.0f}); "
          f"budget {args.budget}; {time.perf_counter() - started:.0f} s")  # fmt: skip
    print(f"{'sampler':8} {'>=98% of optimum':>17} {'median trials':>14} {'p90 trials':>11} "
          f"{'ruled-out executed':>19}")  # fmt: skip
    for s, rows in results.items():
        share = sum(r[0] for r in rows) / len(rows)
        trials = sorted(r[1] for r in rows)
        p90 = trials[min(len(trials) - 1, int(0.9 * len(trials)))]
        print(f"{s:8} {share:>16.0%} {statistics.median(trials):>14.1f} {p90:>11} "
              f"{sum(r[2] for r in rows):>19}")  # fmt: skip


if __name__ == "__main__":
    main()
