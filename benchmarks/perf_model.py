"""Configurations the performance model evaluates per second, in-process (target >= 10,000/s).

Each evaluation is a full `predict()`: memory fit, step timings, TTFT/ITL/E2E percentiles and
throughput, cycling through every model x GPU x quantization x TP x batch the catalogs allow.

    python benchmarks/perf_model.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import itertools
import time

from infertune_tuner.catalog.gpus import GPUS
from infertune_tuner.catalog.llms import MODELS
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.perfmodel import predict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    work = Workload(1024, 512)
    cases = [
        (m, g, TrialConfig(tp, b, q, kv))
        for m, g in itertools.product(MODELS.values(), GPUS.values())
        for tp in (1, 2, 4, 8)
        if m.valid_tp(tp)
        for b in (1, 8, 32, 128)
        for q in sorted(g.quantizations)
        for kv in sorted(g.kv_dtypes)
    ]
    n = 0
    start = time.perf_counter()
    deadline = start + args.seconds
    while time.perf_counter() < deadline:
        for m, g, c in cases[:500]:
            predict(m, g, c, work)
        n += 500
        cases = cases[500:] + cases[:500]
    elapsed = time.perf_counter() - start
    print(f"{len(cases)} distinct configurations; {n} predictions in {elapsed:.2f} s: "
          f"{n / elapsed:,.0f} configs/s (target >= 10,000/s)")  # fmt: skip


if __name__ == "__main__":
    main()
