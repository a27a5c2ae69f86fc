"""Multi-pool replay worlds (benchmarks/pool-worlds/) from the public LLM-Inference-Bench results.

Source: argonne-lcf/LLM-Inference-Bench (https://github.com/argonne-lcf/LLM-Inference-Bench),
BSD-3-Clause, Copyright (c) 2024 UChicago Argonne, LLC; file Plots/All_results.csv, the vLLM rows:
16-bit weights, one static batch of equal-length requests per run, input length = output length,
Latency (s, the whole batch) and Throughput (input + output tokens/s) per (GPU, model, length,
number of GPUs = tensor parallel, batch).

Conversion, the one the single-pool vllm-* tables (../shared/tuner-worlds) were made with;
``--verify DIR`` rebuilds each DIR/vllm-*.csv from its spec and compares the bytes:

- e2e = Latency x 1000 ms; p50 = p95 = p99 (one static batch: one latency per run);
- output tok/s/GPU = Throughput / 2 / TP (input = output, so half the tokens are output);
- TTFT = e2e / (2 x output), ITL = (e2e - TTFT) / (output - 1): a neutral split of the E2E
  latency, not a measurement; no SLO here bounds them;
- quantization fp16, kv_cache_dtype auto; values rounded to 3 decimals;
- a (GPU, model, length, TP, batch) measured twice: the later row of the file;
- a cell of the world's grid that the source did not measure on a pool: status error, no metrics.

A world is one catalog model at one length, with one table per GPU product (NAME.PRODUCT.csv),
its InferenceDeployment spec over the priced pools (NAME.json) and, in index.json, the true
cheapest SLO-meeting (pool, configuration) by cost per million output tokens
(price per GPU-hour / (tok/s/GPU x 3600) x 1e6).

SLO rule (the same for every world): E2E p95 <= floor(1.5 x the smallest TP 1, batch 1 E2E latency
among the world's pools): 50 % above the best single-GPU, single-request latency on offer, so a pool
added to a world cannot loosen it, and every pool has configurations that miss it.

Prices: Lambda on-demand per GPU-hour (https://lambda.ai/instances), the lowest listed per-GPU price
of each product, as transcribed on 2026-09-20 in api-evangelist/lambda-labs,
plans/lambda-labs-plans-pricing.yml (commit 1929382e7f9b4777d980aec12b6fc9e04e6718cb).

    python benchmarks/pool_worlds.py /work/.mirror/argonne-lcf+LLM-Inference-Bench/repo \
        --verify ../shared/tuner-worlds
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import subprocess
import sys
from pathlib import Path

SOURCE_FILE = "Plots/All_results.csv"
HARDWARE = {  # catalog product -> the source's Hardware column
    "A100-SXM-40GB": "Nvidia A100 GPU",
    "H100-SXM-80GB": "Nvidia H100 GPU",
    "GH200-96GB": "Nvidia GH200 GPU",
}
MODELS = {  # catalog model -> the source's Model column
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "qwen2-7b": "Qwen/Qwen2-7B",
}
PRICES = {  # USD per GPU-hour, Lambda on-demand (see the docstring)
    "A100-SXM-40GB": 1.99,  # 8x NVIDIA A100 SXM 40 GB
    "H100-SXM-80GB": 3.99,  # 8x NVIDIA H100 SXM
    "GH200-96GB": 2.29,  # 1x NVIDIA GH200 (96 GB)
}
# Pools whose nodes hold one GPU (a GH200 superchip: the only size the price list offers), so a
# replica there runs at TP 1 (the source measured nothing else there).
ONE_GPU = frozenset({"GH200-96GB"})
# (model, length, pools): a catalog model, >= 2 products each measured at TP 1 over the full batch
# grid, and no pool's table the same as a single-pool vllm-* table (those were tuned on).
WORLDS = [
    ("mistral-7b", 256, ["A100-SXM-40GB", "H100-SXM-80GB"]),
    ("llama-2-7b", 512, ["A100-SXM-40GB", "H100-SXM-80GB", "GH200-96GB"]),
    ("llama-2-7b", 2048, ["A100-SXM-40GB", "H100-SXM-80GB", "GH200-96GB"]),
    ("llama-3-8b", 256, ["A100-SXM-40GB", "H100-SXM-80GB", "GH200-96GB"]),
    ("llama-3-8b", 1024, ["A100-SXM-40GB", "H100-SXM-80GB", "GH200-96GB"]),
    ("qwen2-7b", 512, ["H100-SXM-80GB", "GH200-96GB"]),
]
SLO_FACTOR = 1.5
COLUMNS = ["tp", "max_batch_size", "quantization", "kv_cache_dtype", "status",
           *(f"{m}_{p}_ms" for m in ("ttft", "itl", "e2e") for p in ("p50", "p95", "p99")),
           "output_tokens_per_s_per_gpu"]  # fmt: skip


def read_source(snapshot: Path) -> tuple[str, str]:
    """The results file's text and the commit (or "working tree") it was read from."""
    if (snapshot / SOURCE_FILE).is_file():
        return (snapshot / SOURCE_FILE).read_text(), "working tree"
    git = ["git", f"--git-dir={snapshot}"]
    text = subprocess.run([*git, "show", f"HEAD:{SOURCE_FILE}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    return text, commit


def measurements(text: str, product: str, model: str, length: int) -> dict:
    """(tp, batch) -> (latency s, throughput tok/s) of vLLM on `product`; the later row wins."""
    cells = {}
    for r in csv.DictReader(io.StringIO(text)):
        if (r["Framework"], r["Hardware"], r["Model"], r["Input Output Length"]) == (
                "vLLM", HARDWARE[product], MODELS[model], str(length)):  # fmt: skip
            cells[int(r["Num of Hardware"]), int(r["Batch Size"])] = (
                float(r["Latency"]), float(r["Throughput"]))  # fmt: skip
    return cells


def table(cells: dict, output: int, tps: list[int], batches: list[int]) -> list[dict]:
    """Replay rows over the grid tps x batches; unmeasured cells are status error."""
    rows = []
    for tp in tps:
        for b in batches:
            row = {"tp": tp, "max_batch_size": b, "quantization": "fp16",
                   "kv_cache_dtype": "auto", "status": "error"}  # fmt: skip
            if (tp, b) in cells:
                latency_s, throughput = cells[tp, b]
                e2e = latency_s * 1000.0
                ttft = e2e / (2 * output)
                itl = (e2e - ttft) / (output - 1)
                row["status"] = "ok"
                for name, v in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
                    for p in ("p50", "p95", "p99"):
                        row[f"{name}_{p}_ms"] = round(v, 3)
                row["output_tokens_per_s_per_gpu"] = round(throughput / 2 / tp, 3)
            rows.append(row)
    return rows


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, COLUMNS, restval="")  # \r\n line ends, as the vllm-* tables
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def cost(price: float, tps: float) -> float:
    """USD per million output tokens."""
    return price / (tps * 3600.0) * 1e6


def best(candidates: list[tuple[str, dict]]) -> list[tuple[float, str, dict]]:
    """SLO-meeting (pool, row) pairs, cheapest first; ties: fewer GPUs, smaller batch, pool order."""
    order = {p: i for i, (p, _) in enumerate(candidates)}
    ranked = [(cost(PRICES[p], r["output_tokens_per_s_per_gpu"]), p, r) for p, r in candidates]
    return sorted(ranked, key=lambda c: (c[0], c[2]["tp"], c[2]["max_batch_size"], order[c[1]]))


def describe(c: tuple[float, str, dict] | None) -> dict | None:
    if c is None:
        return None
    usd, product, r = c
    keys = ("tp", "max_batch_size", "quantization", "kv_cache_dtype", "e2e_p95_ms",
            "output_tokens_per_s_per_gpu")  # fmt: skip
    return {"product": product, **{k: r[k] for k in keys},
            "usd_per_million_output_tokens": round(usd, 4)}  # fmt: skip


def build_world(text: str, model: str, length: int, products: list[str], out: Path) -> dict:
    name = f"{model}-{length}"
    cells = {p: measurements(text, p, model, length) for p in products}
    tps = sorted({tp for c in cells.values() for tp, _ in c})
    batches = sorted({b for c in cells.values() for _, b in c})
    slo = math.floor(SLO_FACTOR * min(cells[p][1, 1][0] * 1000.0 for p in products))
    tables, feasible, per_pool = {}, [], {}
    for p in products:
        rows = table(cells[p], length, tps, batches)
        tables[p] = f"{name}.{p}.csv"
        (out / tables[p]).write_text(csv_text(rows), newline="")
        ok = [(p, r) for r in rows if r["status"] == "ok" and r["e2e_p95_ms"] <= slo]
        ranked = best(ok)
        per_pool[p] = {"measured": sum(r["status"] == "ok" for r in rows),
                       "meet_slo": len(ok),
                       "best": describe(ranked[0] if ranked else None)}  # fmt: skip
        feasible += ok
    ranked = best(feasible)
    spec = {"apiVersion": "infertune.io/v1alpha1", "kind": "InferenceDeployment",
            "metadata": {"name": name},
            "spec": {"model": {"name": model},
                     "gpu": {"pools": [{"product": p, "pricePerGpuHour": PRICES[p],
                                        **({"maxGpusPerReplica": 1} if p in ONE_GPU else {})}
                                       for p in products], "maxGpusPerReplica": 8},
                     "workload": {"inputTokens": length, "outputTokens": length},
                     "slo": {"e2eLatencyMs": {"p95": slo}},
                     "search": {"tensorParallel": tps, "maxBatchSize": batches,
                                "quantization": ["fp16"], "kvCacheDtype": ["auto"],
                                "maxAccuracyLossPercent": 10},
                     "tuning": {"maxTrials": 40}}}  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(spec, indent=1))
    tie = [describe(c) for c in ranked[1:] if math.isclose(c[0], ranked[0][0], rel_tol=1e-12)]
    return {"world": name, "model": model, "source_model": MODELS[model],
            "inputTokens": length, "outputTokens": length, "spec": f"{name}.json",
            "tables": tables, "pricePerGpuHour": {p: PRICES[p] for p in products},
            "slo": {"e2eLatencyMs": {"p95": slo}}, "grid": {"tp": tps, "max_batch_size": batches},
            "optimum": describe(ranked[0]), "ties": tie,
            "runner_up": describe(ranked[1]) if len(ranked) > 1 else None,
            "per_pool": per_pool}  # fmt: skip


def verify(text: str, tuner_worlds: Path) -> bool:
    """Rebuild each single-pool vllm-*.csv of `tuner_worlds` from its spec; True if all match."""
    same = True
    for spec_path in sorted(tuner_worlds.glob("vllm-*.json")):
        s = json.loads(spec_path.read_text())["spec"]
        n = s["workload"]["outputTokens"]
        cells = measurements(text, s["gpu"]["product"], s["model"]["name"], n)
        rows = table(cells, n, s["search"]["tensorParallel"], s["search"]["maxBatchSize"])
        match = csv_text(rows).encode() == spec_path.with_suffix(".csv").read_bytes()
        print(f"{spec_path.with_suffix('.csv').name}: {'identical' if match else 'DIFFERENT'}")
        same &= match
    return same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot", type=Path, help="the LLM-Inference-Bench git dir or work tree")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "pool-worlds")
    ap.add_argument("--verify", type=Path, metavar="DIR",
                    help="also rebuild DIR/vllm-*.csv (single-pool tables) and compare")  # fmt: skip
    args = ap.parse_args()
    text, commit = read_source(args.snapshot)
    if args.verify and not verify(text, args.verify):
        sys.exit("the conversion does not reproduce the single-pool tables")
    args.out.mkdir(parents=True, exist_ok=True)
    worlds = [build_world(text, m, n, ps, args.out) for m, n, ps in WORLDS]
    index = {"source": {"repository": "argonne-lcf/LLM-Inference-Bench", "license": "BSD-3-Clause",
                        "commit": commit, "file": SOURCE_FILE,
                        "sha256": hashlib.sha256(text.encode()).hexdigest()},
             "prices": {"source": "https://lambda.ai/instances (on-demand, USD per GPU-hour), as "
                                  "transcribed 2026-09-20 in api-evangelist/lambda-labs "
                                  "plans/lambda-labs-plans-pricing.yml",
                        "pricePerGpuHour": PRICES},
             "slo_rule": "E2E p95 <= floor(1.5 x the smallest TP 1, batch 1 E2E among the pools)",
             "cost": "USD per million output tokens = price / (tok/s/GPU x 3600) x 1e6",
             "worlds": worlds}  # fmt: skip
    (args.out / "index.json").write_text(json.dumps(index, indent=1))
    for w in worlds:
        o = w["optimum"]
        print(
            f"{w['world']}: SLO {w['slo']['e2eLatencyMs']['p95']} ms -> {o['product']} "
            f"TP {o['tp']} batch {o['max_batch_size']} ${o['usd_per_million_output_tokens']}/1M"
        )


if __name__ == "__main__":
    main()
