"""`infertune bench` and NVIDIA's AIPerf side by side, against the same real Triton server.

One real `tritonserver` 2.51 (the nvidia-pytriton wheel) serves infertune's Python-backend model
with the simulated body (docs/benchmarking.md: `triton:simulated`): llama-3-8b fp8 on an H100,
max batch 32, each step as long as the performance model says times `--time-scale`, one
response per token carrying that token's text (`text_mode: delta`, so AIPerf, which
concatenates streamed text, counts what was generated). Its step budget admits one prompt per
step beside the decoding sequences (`--prefills-per-step`; model.yaml `max_num_tokens` = input
tokens + max batch), so every step of the steady state looks alike (one prefill, the rest
decoding) and each request's TTFT comes from one distribution. Measured otherwise, TTFT is a
mixture that depends on how fast each client turns around rather than on how it measures: with
every request of a closed-loop wave admitted in one step, the batch drains at once, the next
wave finds the engine idle and the first arrival gets a step of its own (TTFT p50 10-16 % apart
at concurrency 8 and 32); with four prompts per step, cohorts of four alternate between a short
and a long wait and p50 falls on whichever side holds the median (0 to 8 % apart from one run to
the next). ITL, E2E and throughput agreed within 2.6 % in every such run.

For each concurrency (1, 8, 32):

- `infertune bench` over gRPC (`ModelStreamInfer`), warm-up one full wave (its default);
- `aiperf profile` over HTTP, Triton's `generate_stream` endpoint (`--endpoint-type template`,
  the payload `text_input` / `sampling_param_max_tokens` / `streaming`, `response_field`
  `text_output`), `--warmup-request-count` one full wave;

same input and output lengths, same requests, same concurrency, one after the other. It prints
p50 TTFT, ITL, E2E and the output throughput of both and their difference; exit 1 when a
difference exceeds `--tolerance` (5 %).

AIPerf runs from a virtual environment of its own (`--aiperf-venv`, created with `pip install
aiperf==AIPERF_VERSION` on first use): aiperf pins huggingface-hub < 2, rich ~= 14.1,
psutil ~= 7.0 and pyzmq ~= 26.4 and pulls about a hundred packages (dash, datasets, pyarrow,
transformers, ...) that the dev install resolves differently or does not need, so it is not a dev
extra. Its tokenizer is made here, offline: a word-level tokenizer (the `tokenizers` JSON
format) in which every whitespace-separated word is one token, which is how infertune's model
counts input tokens and what each of its output tokens (" tok") is; `HF_ENDPOINT` pointed at a
closed local port keeps AIPerf off the Hugging Face Hub (`OFFLINE`).

    python benchmarks/aiperf_compare.py [--concurrency 1 8 32] [--time-scale 10]
        [--input-tokens 128] [--output-tokens 64] [--prefills-per-step 1] [--requests N]
        [--aiperf-venv DIR] [--json]

About 8 minutes on 2 cores with the defaults. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infertune_tuner.config import TrialConfig
from infertune_tuner.harness.prompts import WORDS
from infertune_tuner.harness.runner import ServerProcess, free_ports, wait_ready
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import SERVED_MODEL, Ports
from infertune_tuner.runtime.local_triton import LocalTritonRuntime

AIPERF_VERSION = "0.13.0"
DEFAULT_VENV = Path.home() / ".cache" / "infertune" / f"aiperf-{AIPERF_VERSION}"
MAX_BATCH = 32
CONFIG = TrialConfig(1, MAX_BATCH, "fp8", "auto")
METRICS = ("ttft_ms", "itl_ms", "e2e_ms", "tok_s")
LABELS = {"ttft_ms": "TTFT p50 ms", "itl_ms": "ITL p50 ms", "e2e_ms": "E2E p50 ms",
          "tok_s": "output tok/s"}  # fmt: skip
# AIPerf off the Hugging Face Hub: every Hub call goes to a closed local port and fails at once.
# Not HF_HUB_OFFLINE: in that mode aiperf 0.13 loads tokenizers only from cached Hub snapshots and
# refuses a tokenizer folder (aiperf/common/tokenizer.py `_load_from_hub` ->
# `_from_pretrained_local` -> `snapshot_download(local_files_only=True)`: "Repo id must be in the
# form 'repo_name' ..."); a local folder never needs the Hub.
OFFLINE = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
# AIPerf's payload for Triton's generate extension: JSON keys are the model's input names.
PAYLOAD = (
    '{"text_input": {{ text|tojson }}, "sampling_param_max_tokens": {{ max_tokens }}, '
    '"streaming": true}'
)


@dataclass(frozen=True)
class Row:
    concurrency: int
    infertune: dict[str, float]
    aiperf: dict[str, float]

    def differences(self) -> dict[str, float]:
        return {m: self.aiperf[m] / self.infertune[m] - 1 for m in METRICS}


def ensure_aiperf(venv: Path) -> Path:
    """The aiperf executable in `venv`, creating the environment on first use."""
    exe = venv / "bin" / "aiperf"
    if exe.exists():
        return exe
    print(f"creating {venv} with aiperf=={AIPERF_VERSION} (once)", file=sys.stderr)
    python = shutil.which("python3.11") or sys.executable
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"aiperf=={AIPERF_VERSION}"], check=True)
    return exe


def write_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer, one token per whitespace-separated word (see the module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys([*WORDS, "tok"]))}}
    tokenizer: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def start_server(
    folder: Path, input_tokens: int, output_tokens: int, scale: float, prefills: int
) -> Any:
    """A real tritonserver serving the simulated model with delta text; (process, ports)."""
    request = TuningRequest.model_validate({
        "name": "aiperf-compare", "model": {"name": "llama-3-8b"},
        "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 1000}],
    })  # fmt: skip
    runtime = LocalTritonRuntime(time_scale=scale)
    repo = folder / "model_repo"
    for rel, text in runtime.model_files(request, CONFIG).items():
        if rel.endswith("body.json"):
            text = json.dumps({**json.loads(text), "text_mode": "delta"})
        if rel.endswith("model.yaml"):
            llm = yaml.safe_load(text)
            # the decoding sequences' tokens count against the budget too (one each)
            budget = prefills * input_tokens + MAX_BATCH
            text = yaml.safe_dump({**llm, "max_num_tokens": budget})
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text, encoding="utf-8")
    runtime.assemble(repo)
    ports = Ports(*free_ports(3))
    argv = runtime.launch_argv(request, CONFIG, repo_dir=str(repo), ports=ports, host="127.0.0.1")
    proc = ServerProcess.start(argv, folder / "server.log")
    failure = asyncio.run(wait_ready(proc, f"127.0.0.1:{ports.grpc}", SERVED_MODEL, 120))
    if failure is not None:
        proc.stop()
        raise SystemExit(f"tritonserver did not start ({failure}):\n{proc.log_text()[-3000:]}")
    return proc, ports


def run_infertune(ports: Ports, c: int, requests: int, isl: int, osl: int) -> dict[str, float]:
    exe = Path(sys.executable).parent / "infertune"
    argv = [
        str(exe) if exe.exists() else "infertune", "bench", "--url", f"127.0.0.1:{ports.grpc}",
        "--model", SERVED_MODEL, "--concurrency", str(c), "--requests", str(requests),
        "--input-tokens", str(isl), "--output-tokens", str(osl), "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"infertune bench failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    data = json.loads(done.stdout)
    return {
        "ttft_ms": data["ttft_ms"]["p50"], "itl_ms": data["itl_ms"]["p50"],
        "e2e_ms": data["e2e_ms"]["p50"], "tok_s": data["output_tokens_per_s"],
    }  # fmt: skip


def run_aiperf(
    exe: Path, tokenizer: Path, ports: Ports, c: int, requests: int, isl: int, osl: int,
    out: Path,
) -> dict[str, float]:  # fmt: skip
    argv = [
        str(exe), "profile", "--model", SERVED_MODEL, "--url", f"http://127.0.0.1:{ports.http}",
        "--endpoint-type", "template", "--custom-endpoint",
        f"/v2/models/{SERVED_MODEL}/generate_stream", "--streaming",
        "--extra-inputs",
        json.dumps({"payload_template": PAYLOAD, "response_field": "text_output"}),
        "--tokenizer", str(tokenizer), "--concurrency", str(c), "--request-count", str(requests),
        "--warmup-request-count", str(c), "--isl", str(isl), "--isl-stddev", "0",
        "--osl", str(osl), "--osl-stddev", "0", "--random-seed", "0",
        "--artifact-dir", str(out), "--ui-type", "none", "--no-server-metrics",
    ]  # fmt: skip
    env = {**os.environ, **OFFLINE}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"aiperf failed ({done.returncode}):\n{(done.stderr + done.stdout)[-4000:]}"
        )
    data = json.loads(found[-1].read_text(encoding="utf-8"))
    metrics = data.get("records", data)

    def p50(tag: str) -> float:
        return float(metrics[tag]["p50"])

    return {
        "ttft_ms": p50("time_to_first_token"), "itl_ms": p50("inter_token_latency"),
        "e2e_ms": p50("request_latency"),
        "tok_s": float(metrics["output_token_throughput"]["avg"]),
    }  # fmt: skip


def print_table(rows: list[Row], tolerance: float) -> bool:
    ok = True
    print(f"{'concurrency':>11} {'metric':<14} {'infertune':>11} {'AIPerf':>11} {'diff':>8}")
    for row in rows:
        diffs = row.differences()
        for m in METRICS:
            flag = "" if abs(diffs[m]) <= tolerance else "  <-- beyond tolerance"
            ok = ok and not flag
            print(
                f"{row.concurrency:>11} {LABELS[m]:<14} {row.infertune[m]:>11.2f} "
                f"{row.aiperf[m]:>11.2f} {diffs[m]:>+7.2%}{flag}"
            )
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--prefills-per-step", type=int, default=1)
    p.add_argument("--requests", type=int, default=None,
                   help="Measured requests per run (default: max(16, 4 x concurrency)).")  # fmt: skip
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--aiperf-venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if max(args.concurrency) > MAX_BATCH:
        raise SystemExit(f"--concurrency at most {MAX_BATCH} (the server's max batch)")
    exe = ensure_aiperf(args.aiperf_venv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="aiperf-compare-") as tmp:
        folder = Path(tmp)
        tokenizer = write_tokenizer(folder / "tokenizer")
        proc, ports = start_server(
            folder, args.input_tokens, args.output_tokens, args.time_scale, args.prefills_per_step
        )
        try:
            for c in args.concurrency:
                n = args.requests or max(16, 4 * c)
                io = (args.input_tokens, args.output_tokens)
                ours = run_infertune(ports, c, n, *io)
                theirs = run_aiperf(exe, tokenizer, ports, c, n, *io, folder / f"aiperf-c{c}")
                rows.append(Row(c, ours, theirs))
                print(f"concurrency {c}: done", file=sys.stderr)
        finally:
            proc.stop()
    if args.json:
        print(json.dumps([row.__dict__ | {"diff": row.differences()} for row in rows], indent=2))
        ok = all(abs(d) <= args.tolerance for r in rows for d in r.differences().values())
    else:
        ok = print_table(rows, args.tolerance)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
