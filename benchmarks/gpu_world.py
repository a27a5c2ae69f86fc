"""A real-GPU world: every configuration of a grid measured on a real Triton server and GPU.

Each trial is what `infertune tune --backend triton:torch` runs: infertune renders the model
repository (config.pbtxt + model.yaml as for TensorRT-LLM), a real `tritonserver` (the
nvidia-pytriton wheel) loads it with infertune's Python-backend model, whose body is a
Llama-shaped PyTorch model with random weights on the local GPU (triton_model/torch_body.py), and
the load generator drives it over gRPC. The grid's measurements become a replay table (and the
InferenceDeployment that searches it), so the tuner can be judged on a world nobody here wrote:

    python benchmarks/gpu_world.py measure --out DIR          # on a machine with a GPU
    infertune tune DIR/NAME.json --backend replay:DIR/NAME.csv

The table is rewritten after every trial (a run cut short keeps what it measured) and a
resumed run skips what the table already holds. Requests per trial: max(16, 2 x max batch)
after a warm-up of one full batch (the tuner's default warm-up; fewer requests than its 4 x
batch so that a whole grid fits in a short GPU lease; its p95s rest on >= 16 requests x the
output length of inter-token gaps).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from infertune_tuner.backends.replay import load_table, write_table
from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.local_triton import LocalTritonRuntime

# The world's SLO, fixed before anything was measured: an interactive chat service
# (first token within 1 s, at least ~33 tokens/s per user), at p95.
SLO = {"ttftMs": {"p95": 1000}, "itlMs": {"p95": 30}}


def deployment(name: str, model: str, gpu: str, isl: int, osl: int, batches: list[int],
               quants: list[str], kvs: list[str]) -> dict[str, object]:  # fmt: skip
    return {
        "apiVersion": "infertune.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": model},
            "gpu": {"product": gpu, "maxGpusPerReplica": 1},
            "workload": {"inputTokens": isl, "outputTokens": osl},
            "slo": SLO,
            "search": {
                "tensorParallel": [1],
                "maxBatchSize": batches,
                "quantization": quants,
                "kvCacheDtype": kvs,
                "maxAccuracyLossPercent": 10,
            },
            "tuning": {"maxTrials": 40},
        },
    }


def request_of(path: Path) -> TuningRequest:
    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.api.to_request import to_request

    return to_request(load_deployment(path), default_backend="triton:torch")


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    quants, kvs = args.quantizations.split(","), args.kv.split(",")
    doc = deployment(args.name, args.model, args.gpu, args.input_tokens, args.output_tokens,
                     batches, quants, kvs)  # fmt: skip
    spec = out / f"{args.name}.json"
    spec.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    request = request_of(spec)
    table = out / f"{args.name}.csv"
    rows: dict[TrialConfig, Measurement] = load_table(table) if table.exists() else {}
    # Interleaved (each batch size across every precision before the next) so that a run cut
    # short still spans the grid.
    grid = [TrialConfig(1, b, q, k) for b in batches for q in quants for k in kvs]
    runtime = LocalTritonRuntime(body=args.body, time_scale=args.time_scale)
    started = time.monotonic()
    for config in grid:
        if config in rows:
            continue
        backend = TritonBackend(
            request, runtime=runtime, workdir=Path(args.workdir or out / "trials"),
            requests_per_trial=max(16, 2 * config.max_batch_size),
            startup_timeout_s=args.startup_timeout,
        )  # fmt: skip
        t0 = time.monotonic()
        m = backend.run(config)
        rows[config] = m
        write_table(table, rows)
        tps = m.output_tokens_per_s_per_gpu or 0.0
        itl = m.itl_ms.p95 if m.itl_ms else float("nan")
        ttft = m.ttft_ms.p95 if m.ttft_ms else float("nan")
        print(
            f"{config.label():32s} {m.status:5s} {tps:9.1f} tok/s/GPU  ITL p95 {itl:7.2f} ms  "
            f"TTFT p95 {ttft:8.1f} ms  ({time.monotonic() - t0:.0f} s; "
            f"{time.monotonic() - started:.0f} s in all)"
            + ("" if m.status == "ok" else f"  {str(m.reason)[:300]!r}"),
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="measure the grid on this machine's GPU")
    m.add_argument("--out", required=True)
    m.add_argument("--workdir", help="where the trials' repositories and logs go (OUT/trials)")
    m.add_argument("--name", default="h100-torch-llama2-13b")
    m.add_argument("--model", default="llama-2-13b")
    m.add_argument("--gpu", default="H100-SXM-80GB")
    m.add_argument("--input-tokens", type=int, default=256)
    m.add_argument("--output-tokens", type=int, default=64)
    m.add_argument("--batches", default="1,8,32,64,128,192,256")
    m.add_argument("--quantizations", default="bf16,fp8")
    m.add_argument("--kv", default="auto,fp8")
    m.add_argument("--body", default="torch", choices=["torch", "simulated"])
    m.add_argument("--time-scale", type=float, default=1.0, help="simulated body only")
    m.add_argument("--startup-timeout", type=float, default=180.0)
    args = ap.parse_args(argv)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
