"""How accurately does the load generator measure, and what does it cost?

`--server triton` runs the same cases against a real `tritonserver` (the nvidia-pytriton wheel)
serving infertune's rendered repository with the simulated model body (docs/benchmarking.md);
the known timings are the same engine's. Otherwise it starts the simulated Triton server
(`infertune_tuner.harness.simserver`) as a subprocess on
127.0.0.1 (its own process, so on a 2-core machine server and client get a core each) and drives
it with the load generator over real gRPC streaming:

0. single: concurrency 1 (max batch 1, 24 requests): the client's error with nothing queued;
1. accuracy: llama-3-8b on H100-SXM-80GB, tp1, fp8, max batch 64, 512 in / 128 out, closed loop
   at concurrency 64. Measured TTFT, ITL (per request, GenAI-Perf's) and E2E p50 against the
   server's modelled steady state (`engine.modelled_steady_state`: the same engine in virtual
   time behind a client with a 50 us turnaround, warm-up left out as the load generator leaves
   it out). Target: within 5% on all three. The performance model's closed form
   (`perfmodel.predict`, what the tuner's prior and the simulated pool say) is printed beside.
2. overhead: max batch 256 at concurrency 256 (4x the responses per second), after a warm-up of
   one full batch. The client's own
   cost, two ways: the latency it adds (client-measured E2E/TTFT vs the server-reported
   timestamps of the same requests, same CLOCK_MONOTONIC), and its CPU time per output token
   and share of wall time. Target: added latency < 2% of E2E.

Time scale: `--time-scale 0.1` runs the modelled GPU 10x faster. Per-response client and gRPC
costs (~50 us of CPU per token) do not shrink with it, so the relative overhead grows about as
1/scale; the numbers below use 1.0 (real time), which is what a real trial sees.

    python benchmarks/loadgen_accuracy.py [--time-scale 1.0] [--json] [--server simserver|triton]
        [--generators N]

Bounded: about 40 s on 2 cores at time scale 1 (the real server: about 60 s; at time scale 10,
about 4 minutes). docs/benchmarking.md has the numbers of both servers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import get_model
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.engine import modelled_steady_state
from infertune_tuner.harness.loadgen import LoadSpec
from infertune_tuner.harness.runner import TrialPlan, free_port, free_ports, run_trial
from infertune_tuner.harness.stats import BenchResult
from infertune_tuner.perfmodel.latency import predict

MODEL, GPU, QUANT = "llama-3-8b", "H100-SXM-80GB", "fp8"
WORKLOAD = Workload(512, 128)


@dataclass(frozen=True)
class Case:
    name: str
    max_batch: int
    concurrency: int
    requests: int
    warmup: int


CASES = (
    Case("single", max_batch=1, concurrency=1, requests=24, warmup=1),
    Case("accuracy", max_batch=64, concurrency=64, requests=192, warmup=16),
    # Warm-up = one full batch, as the tuner's trials do: the first wave of 256 queues behind its
    # own prefills (TTFT up to ~2 s), and with a shorter warm-up it would be half the measured
    # requests and put the TTFT median on the seam between two clusters.
    Case("overhead", max_batch=256, concurrency=256, requests=512, warmup=256),
)


def triton_argv(case: Case, scale: float, folder: Path, port: int) -> list[str]:
    """A real tritonserver serving the rendered repository with the simulated body."""
    from infertune_tuner.request import TuningRequest
    from infertune_tuner.runtime.base import Ports
    from infertune_tuner.runtime.local_triton import LocalTritonRuntime

    request = TuningRequest.model_validate({
        "name": "loadgen-accuracy", "model": {"name": MODEL}, "gpu": {"product": GPU},
        "workload": {"input_tokens": WORKLOAD.input_tokens,
                     "output_tokens": WORKLOAD.output_tokens},
        "slo": [{"metric": "e2e_ms", "percentile": "p50", "max_ms": 1e9}],
    })  # fmt: skip
    config = TrialConfig(1, case.max_batch, QUANT, "auto")
    runtime = LocalTritonRuntime(time_scale=scale)
    repo = folder / case.name / "model_repo"
    for rel, text in runtime.model_files(request, config).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text, encoding="utf-8")
    runtime.assemble(repo)
    http, metrics = free_ports(2)
    ports = Ports(grpc=port, http=http, metrics=metrics)
    return runtime.launch_argv(request, config, repo_dir=str(repo), ports=ports, host="127.0.0.1")


def side_by_side(case: Case, scale: float, logdir: Path, server: str, n: int) -> list[BenchResult]:
    """`n` trials of `case` at once, each in a thread (and its generator in its own process)."""
    results: list[BenchResult | None] = [None] * n
    failures: list[BaseException] = []

    def one(i: int) -> None:
        folder = logdir / f"{case.name}-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            results[i] = measure(case, scale, folder, server)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return [r for r in results if r is not None]


def measure(case: Case, scale: float, logdir: Path, server: str = "simserver") -> BenchResult:
    port = free_port()
    if server == "triton":
        argv = triton_argv(case, scale, logdir, port)
    else:
        argv = [
            sys.executable, "-m", "infertune_tuner.cli.simserver", "--host", "127.0.0.1",
            "--port", str(port), "--http-port", "-1", "--model", MODEL, "--gpu", GPU,
            "--max-batch", str(case.max_batch), "--quant", QUANT, "--time-scale", str(scale),
        ]  # fmt: skip
    load = LoadSpec(
        url=f"127.0.0.1:{port}", model="llm", concurrency=case.concurrency,
        requests=case.requests, warmup=case.warmup, input_tokens=WORKLOAD.input_tokens,
        output_tokens=WORKLOAD.output_tokens,
    )  # fmt: skip
    # The tuner's own trial lifecycle: start, wait until ready, drive load, tear down.
    plan = TrialPlan(argv, load, logdir / f"{case.name}.log", startup_timeout_s=60)
    outcome = run_trial(plan)
    if outcome.result is None:
        raise SystemExit(f"{server} trial failed ({outcome.status}):\n{outcome.reason}")
    return outcome.result


def pct(measured: float, reference: float) -> float:
    return (measured - reference) / reference * 100


def report(case: Case, scale: float, r: BenchResult) -> dict[str, Any]:
    cfg = TrialConfig(1, case.max_batch, QUANT, "auto")
    model, gpu = get_model(MODEL), get_gpu(GPU)
    m = modelled_steady_state(
        model, gpu, cfg, WORKLOAD, case.concurrency, case.requests, warmup=case.warmup
    )
    p = predict(model, gpu, cfg, WORKLOAD)
    assert r.itl_ms and r.e2e_ms and r.ttft_ms and m.itl_ms and m.e2e_ms and m.ttft_ms
    out: dict[str, Any] = {
        "case": case.name,
        "config": f"{MODEL} {GPU} {cfg.label()} {WORKLOAD.input_tokens}/{WORKLOAD.output_tokens}",
        "concurrency": case.concurrency,
        "requests": r.requests,
        "errors": r.errors,
        "time_scale": scale,
        "itl_p50_ms": {
            "measured": r.itl_ms.p50,
            "modelled": m.itl_ms.p50 * scale,
            "predicted": p.itl_ms.p50 * scale,
        },
        "e2e_p50_ms": {
            "measured": r.e2e_ms.p50,
            "modelled": m.e2e_ms.p50 * scale,
            "predicted": p.e2e_ms.p50 * scale,
        },
        "ttft_p50_ms": {
            "measured": r.ttft_ms.p50,
            "modelled": m.ttft_ms.p50 * scale,
            "predicted": p.ttft_ms.p50 * scale,
        },
    }
    if r.server_e2e_ms and r.server_ttft_ms:  # simserver reports its own timestamps
        out["server_reported_p50_ms"] = {"e2e": r.server_e2e_ms.p50, "ttft": r.server_ttft_ms.p50}
    for key in ("itl_p50_ms", "e2e_p50_ms", "ttft_p50_ms"):
        out[key]["error_pct"] = pct(out[key]["measured"], out[key]["modelled"])
    cpu = float(r.settings.get("client_cpu_s", 0.0))
    total_tokens = r.output_tokens * (case.requests + case.warmup) / case.requests
    out["client_overhead"] = {
        "cpu_us_per_token": cpu / total_tokens * 1e6,
        "cpu_share_of_wall_pct": cpu / r.duration_s * 100 if r.duration_s else 0.0,
        "output_tokens_per_s": r.output_tokens_per_s,
    }
    if r.server_e2e_ms and r.server_ttft_ms:
        out["client_overhead"] |= {
            "e2e_added_ms": r.e2e_ms.p50 - r.server_e2e_ms.p50,
            "e2e_added_pct": pct(r.e2e_ms.p50, r.server_e2e_ms.p50),
            "ttft_added_ms": r.ttft_ms.p50 - r.server_ttft_ms.p50,
        }
    return out


def show(row: dict[str, Any]) -> None:
    print(f"\n== {row['case']}: {row['config']}, concurrency {row['concurrency']}, "
          f"time scale {row['time_scale']:g}")  # fmt: skip
    print(f"   {row['requests']} requests completed, {row['errors']} errors")
    for key, label in (
        ("itl_p50_ms", "ITL p50"),
        ("e2e_p50_ms", "E2E p50"),
        ("ttft_p50_ms", "TTFT p50"),
    ):
        v = row[key]
        print(f"   {label:9s} measured {v['measured']:9.2f} ms   modelled {v['modelled']:9.2f} ms"
              f"   error {v['error_pct']:+6.2f} %   (perf model {v['predicted']:9.2f} ms)")  # fmt: skip
    o = row["client_overhead"]
    s = row.get("server_reported_p50_ms")
    if s is not None:
        print(f"   server-reported p50: E2E {s['e2e']:.2f} ms, TTFT {s['ttft']:.2f} ms")
        print(f"   client adds {o['e2e_added_ms']:.2f} ms to E2E p50 "
              f"({o['e2e_added_pct']:+.2f} %), {o['ttft_added_ms']:.2f} ms to TTFT p50")  # fmt: skip
    else:
        print("   (the server reports no timestamps of its own: client overhead not separable)")
    print(f"   client CPU {o['cpu_us_per_token']:.1f} us per output token, "
          f"{o['cpu_share_of_wall_pct']:.1f} % of one core; {o['output_tokens_per_s']:.0f} tok/s")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--server", choices=("simserver", "triton"), default="simserver",
        help="simserver (infertune's KServe v2 server) or triton (a real tritonserver from the "
        "nvidia-pytriton wheel serving the rendered repository, simulated model body)",
    )  # fmt: skip
    p.add_argument(
        "--generators", type=int, default=1,
        help="run each case N times side by side (N servers, N load generators, each trial in "
        "a thread of this process and its generator in a process of its own, as a tuner pod "
        "packing N trials runs them); prints every generator's numbers and the worst error",
    )  # fmt: skip
    a = p.parse_args()
    if a.generators < 1:
        raise SystemExit("--generators must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="loadgen-accuracy-") as tmp:
        for case in CASES:
            results = side_by_side(case, a.time_scale, Path(tmp), a.server, a.generators)
            case_rows = [report(case, a.time_scale, r) for r in results]
            rows += case_rows
            if not a.json:
                for i, row in enumerate(case_rows):
                    if a.generators > 1:
                        print(f"\n-- generator {i + 1} of {a.generators}")
                    show(row)
                if a.generators > 1:
                    keys = ("ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms")
                    worst = {k: max(abs(r[k]["error_pct"]) for r in case_rows) for k in keys}
                    print(f"\n== {case.name}: worst error of {a.generators} side-by-side "
                          "generators: " + ", ".join(f"{k.split('_')[0].upper()} "
                                                     f"{v:.2f} %" for k, v in worst.items()))  # fmt: skip
    if a.json:
        print(json.dumps(rows, indent=2))
    elif a.generators == 1:
        acc, ovh = rows[-2:]
        keys = ("itl_p50_ms", "e2e_p50_ms", "ttft_p50_ms")
        ok_acc = max(abs(acc[k]["error_pct"]) for k in keys) < 5
        added = ovh["client_overhead"].get("e2e_added_pct")
        ovh_text = "n/a" if added is None else ("yes" if added < 2 else "NO")
        print(f"\naccuracy within 5 % (TTFT, ITL, E2E): {'yes' if ok_acc else 'NO'}; "
              f"client overhead under 2 % at concurrency 256: {ovh_text}")  # fmt: skip


if __name__ == "__main__":
    main()
