"""Fit the performance model's efficiency factors to the public Llama-2-70B sweep.

One set of factors per GPU generation (Hopper, Ampere) plus shared step/communication costs,
never one per point. Minimises the squared log error of tok/s/GPU and E2E latency over all
published points (scipy Nelder-Mead from several starts, inside the bounds), then prints the factors to paste into
`infertune_tuner/perfmodel/factors.py` and the predicted-vs-published table.

    python benchmarks/calibrate.py [--starts 8]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy.optimize import minimize

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.models import get_model
from infertune_tuner.perfmodel import Efficiency, predict
from infertune_tuner.perfmodel.reference import MODEL, POINTS, WORKLOAD

SHARED = {
    "link": (0.3, 0.9),
    "allreduce_latency_us": (3.0, 30.0),
    "step_overhead_ms": (0.5, 12.0),
    "per_seq_overhead_us": (1.0, 80.0),
}
PER_GEN = {"weight_bw": (0.3, 0.9), "kv_bw": (0.1, 0.9), "gemm": (0.1, 0.8), "prefill": (0.1, 0.8)}
GENERATION = {"H100-SXM-80GB": "hopper", "A100-SXM-80GB": "ampere"}


def factors_from(params: dict[str, float]) -> dict[str, Efficiency]:
    shared = {k: params[k] for k in SHARED}
    return {
        gen: Efficiency(**{k: params[f"{gen}_{k}"] for k in PER_GEN}, **shared)  # type: ignore[arg-type]
        for gen in ("hopper", "ampere")
    }


def loss(effs: dict[str, Efficiency]) -> float:
    model = get_model(MODEL)
    total = 0.0
    preds = []
    for p in POINTS:
        pr = predict(model, get_gpu(p.gpu), p.config, WORKLOAD, effs[GENERATION[p.gpu]])
        total += math.log(pr.output_tokens_per_s_per_gpu / p.tokens_per_s_per_gpu) ** 2
        total += math.log(pr.e2e_ms.p50 / p.e2e_ms) ** 2
        preds.append(pr.output_tokens_per_s_per_gpu)
    # Ranking: penalise every published pair the prediction orders the other way.
    for i, a in enumerate(POINTS):
        for j, b in enumerate(POINTS):
            if a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu and preds[i] <= preds[j]:
                total += 0.05 + math.log(preds[j] / preds[i]) ** 2
    return total


NAMES = list(SHARED) + [f"{g}_{k}" for g in ("hopper", "ampere") for k in PER_GEN]
BOUNDS = [SHARED.get(n) or PER_GEN[n.split("_", 1)[1]] for n in NAMES]


def objective(x: np.ndarray) -> float:
    clipped = [min(max(v, lo), hi) for v, (lo, hi) in zip(x, BOUNDS, strict=True)]
    penalty = sum((v - c) ** 2 for v, c in zip(x, clipped, strict=True))
    return loss(factors_from(dict(zip(NAMES, clipped, strict=True)))) + 10 * penalty


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    best = None
    for _ in range(args.starts):
        x0 = np.array([rng.uniform(lo, hi) for lo, hi in BOUNDS])
        res = minimize(
            objective,
            x0,
            method="Nelder-Mead",
            options={"maxiter": 6000, "xatol": 1e-4, "fatol": 1e-7},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    params = {
        n: round(float(min(max(v, lo), hi)), 4)
        for n, v, (lo, hi) in zip(NAMES, best.x, BOUNDS, strict=True)
    }
    effs = factors_from(params)
    print(f"loss {loss(effs):.4f}")
    for gen, e in effs.items():
        print(gen.upper(), "=", e)
    model = get_model(MODEL)
    for p in POINTS:
        pr = predict(model, get_gpu(p.gpu), p.config, WORKLOAD, effs[GENERATION[p.gpu]])
        print(
            f"{p.gpu:14} {p.config.label():28} tok/s/GPU {pr.output_tokens_per_s_per_gpu:6.0f} vs "
            f"{p.tokens_per_s_per_gpu:4.0f} ({pr.output_tokens_per_s_per_gpu / p.tokens_per_s_per_gpu - 1:+.0%})  "
            f"E2E {pr.e2e_ms.p50:6.0f} vs {p.e2e_ms:6.0f} ms ({pr.e2e_ms.p50 / p.e2e_ms - 1:+.0%})"
        )


if __name__ == "__main__":
    main()
