"""Hostile flags and side files for every command (classes 7 and 8): exit 2 naming the option
or the file, before anything runs."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from .corpus import check, invoke, manifest, put

SIM = ["simserver", "--model", "llama-3-8b", "--gpu", "H100-SXM-80GB", "--max-batch", "8",
       "--host", "127.0.0.1"]  # fmt: skip
PREDICT = ["predict", "--model", "llama-3-8b", "--gpu", "H100-SXM-80GB"]
BENCH = ["bench", "--url", "127.0.0.1:1", "--model", "llm"]
LLAMA_CONFIG = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 8192,
}  # fmt: skip

# (id, argv, fragment); every one exits 2.
FLAGS: list[tuple[str, list[str], str]] = [
    # predict
    ("predict-tp-3", [*PREDICT, "--tp", "3"], "tp 3 must divide llama-3-8b's 32 attention heads"),
    ("predict-tp-0", [*PREDICT, "--tp", "0"], "--tp, --batch, --isl and --osl must be positive"),
    ("predict-batch-0", [*PREDICT, "--batch", "0"], "must be positive"),
    (
        "predict-batch-huge",
        [*PREDICT, "--batch", str(10**21)],
        "max_batch_size must be between 1 and 65536",
    ),
    ("predict-isl-negative", [*PREDICT, "--isl", "-5"], "must be positive"),
    (
        "predict-fp8-a100",
        ["predict", "--model", "llama-3-8b", "--gpu", "A100-SXM-80GB", "--quant", "fp8"],
        "A100-SXM-80GB (ampere) does not support fp8",
    ),
    (
        "predict-kv-fp8-a100",
        ["predict", "--model", "llama-3-8b", "--gpu", "A100-SXM-80GB", "--kv-dtype", "fp8"],
        "kv_cache_dtype: A100-SXM-80GB has no fp8",
    ),
    ("predict-quant-unknown", [*PREDICT, "--quant", "int3"], "--quant: unknown quantization"),
    ("predict-kv-unknown", [*PREDICT, "--kv-dtype", "fp4"], "--kv-dtype: unknown KV-cache dtype"),
    ("predict-stack", [*PREDICT, "--stack", "vllm"], "unknown stack 'vllm'"),
    (
        "predict-model-unknown",
        ["predict", "--model", "gpt-17", "--gpu", "H100-SXM-80GB"],
        "unknown model 'gpt-17'",
    ),
    (
        "predict-gpu-unknown",
        ["predict", "--model", "llama-3-8b", "--gpu", "RTX-9999"],
        "unknown GPU 'RTX-9999'",
    ),
    ("predict-tp-text", [*PREDICT, "--tp", "two"], "Invalid value for '--tp'"),
    # simserver: ports, hosts, numbers
    ("sim-port-70000", [*SIM, "--port", "70000"], "--port must be between 0 and 65535, not 70000"),
    ("sim-port-negative", [*SIM, "--port", "-1"], "--port must be between 0 and 65535"),
    (
        "sim-http-70000",
        [*SIM, "--port", "0", "--http-port", "70000"],
        "--http-port must be between",
    ),
    ("sim-http-minus-2", [*SIM, "--port", "0", "--http-port", "-2"], "--http-port must be between"),
    ("sim-same-ports", [*SIM, "--port", "9001", "--http-port", "9001"], "is the gRPC --port too"),
    ("sim-host-dots", [*SIM[:-1], "not..a..host", "--port", "0"], "--host 'not..a..host'"),
    (
        "sim-host-unknown",
        [*SIM[:-1], "no-such-host.invalid", "--port", "0"],
        "--host 'no-such-host.invalid' is not an address to bind",
    ),
    ("sim-time-scale-nan", [*SIM, "--time-scale", "nan"], "--time-scale must be a positive number"),
    ("sim-time-scale-inf", [*SIM, "--time-scale", "inf"], "--time-scale must be a positive number"),
    ("sim-time-scale-0", [*SIM, "--time-scale", "0"], "--time-scale must be a positive number"),
    (
        "sim-max-batch-0",
        [*SIM[:-3], "0", "--host", "127.0.0.1"],
        "--max-batch must be between 1 and 65536",
    ),
    ("sim-tp-3", [*SIM, "--tp", "3"], "tensor parallel size 3 must divide the 32 attention heads"),
    (
        "sim-fp8-a100",
        [
            "simserver",
            "--model",
            "llama-3-8b",
            "--gpu",
            "A100-SXM-80GB",
            "--max-batch",
            "8",
            "--quant",
            "fp8",
        ],
        "A100-SXM-80GB does not support fp8",
    ),
    ("sim-arch-not-json", [*SIM, "--architecture", "{layers"], "--architecture is not JSON"),
    ("sim-arch-list", [*SIM, "--architecture", "[1]"], "--architecture must be a JSON object"),
    ("sim-arch-unknown-key", [*SIM, "--architecture", '{"depth": 3}'], "unknown keys ['depth']"),
    (
        "sim-arch-zero-heads",
        [
            *SIM,
            "--architecture",
            json.dumps(
                {
                    "layers": 2,
                    "hidden_size": 64,
                    "heads": 0,
                    "kv_heads": 1,
                    "ffn_size": 8,
                    "vocab_size": 8,
                }
            ),
        ],
        "--architecture: heads must be whole numbers >= 1",
    ),
    ("sim-arch-bool", [*SIM, "--architecture", '{"layers": true}'], "layers must be whole numbers"),
    (
        "sim-arch-string",
        [*SIM, "--architecture", '{"layers": "2"}'],
        "layers must be whole numbers",
    ),
    (
        "sim-arch-moe",
        [*SIM, "--architecture", '{"experts": 2, "experts_active": 3}'],
        "experts_active must not exceed experts",
    ),
    ("sim-arch-missing", [*SIM, "--architecture", '{"layers": 2}'], "--architecture:"),
    (
        "sim-max-batch-huge",
        [*SIM[:-3], str(10**21), "--host", "127.0.0.1"],
        "--max-batch must be between",
    ),
    ("sim-served-empty", [*SIM, "--served-model", ""], "--served-model must not be empty"),
    # bench: numbers first (before any connection), then the server and the model
    (
        "bench-rate-nan",
        [*BENCH, "--request-rate", "nan"],
        "--request-rate must be a positive number",
    ),
    (
        "bench-rate-inf",
        [*BENCH, "--request-rate", "inf"],
        "--request-rate must be a positive number",
    ),
    ("bench-rate-0", [*BENCH, "--request-rate", "0"], "--request-rate must be a positive number"),
    ("bench-rate-negative", [*BENCH, "--request-rate", "-3"], "--request-rate must be a positive"),
    ("bench-timeout-nan", [*BENCH, "--timeout", "nan"], "--timeout must be a positive number"),
    ("bench-timeout-0", [*BENCH, "--timeout", "0"], "--timeout must be a positive number"),
    ("bench-deadline-inf", [*BENCH, "--deadline", "inf"], "--deadline must be a positive number"),
    ("bench-deadline-negative", [*BENCH, "--deadline", "-1"], "--deadline must be a positive"),
    ("bench-seed-negative", [*BENCH, "--seed", "-1"], "--seed must be between 0 and 4294967295"),
    ("bench-seed-2-32", [*BENCH, "--seed", str(2**32)], "--seed must be between 0 and 4294967295"),
    ("bench-requests-0", [*BENCH, "--requests", "0"], "requests must be at least 1"),
    ("bench-concurrency-0", [*BENCH, "--concurrency", "0"], "concurrency must be at least 1"),
    (
        "bench-tokens-0",
        [*BENCH, "--output-tokens", "0"],
        "input and output tokens must be at least 1",
    ),
    ("bench-warmup-negative", [*BENCH, "--warmup", "-1"], "warmup must not be negative"),
    ("bench-unreachable", BENCH, "cannot reach Triton at 127.0.0.1:1"),
    ("bench-url-garbage", ["bench", "--url", "::::", "--model", "llm"], "::::"),
    # operator and tune-job
    ("operator-no-namespace", ["operator"], "give --namespace NS (repeatable) or --all-namespaces"),
    ("operator-both", ["operator", "-A", "-n", "x"], "give either --namespace"),
]


@pytest.mark.parametrize("argv", [c[1] for c in FLAGS], ids=[c[0] for c in FLAGS])
def test_flags(argv: list[str]) -> None:
    fragment = next(c[2] for c in FLAGS if c[1] is argv)
    check(invoke(argv), 2, fragment)


# ---------------------------------------------------------------- predict: config.json files


def _config(**changes: object) -> dict[str, object]:
    out = {**LLAMA_CONFIG, **changes}
    return {k: v for k, v in out.items() if v is not None}


CONFIGS: list[tuple[str, object, str]] = [
    ("zero-heads", _config(num_attention_heads=0), "num_attention_heads must be a whole number"),
    ("negative-layers", _config(num_hidden_layers=-2), "num_hidden_layers must be a whole number"),
    ("string-hidden", _config(hidden_size="4096"), "hidden_size must be a whole number"),
    ("float-vocab", _config(vocab_size=1.5), "vocab_size must be a whole number"),
    ("bool-kv", _config(num_key_value_heads=True), "num_key_value_heads must be a whole number"),
    ("zero-kv", _config(num_key_value_heads=0), "num_key_value_heads must be a whole number"),
    ("no-heads", _config(num_attention_heads=None), "config.json lacks num_attention_heads"),
    ("no-vocab", _config(vocab_size=None), "config.json lacks vocab_size"),
    ("kv-not-dividing", _config(num_key_value_heads=5), "must be a multiple of the KV heads"),
    ("moe-active", _config(num_local_experts=4, num_experts_per_tok=8), "num_experts_per_tok (8)"),
    ("zero-context", _config(max_position_embeddings=0), "max_position_embeddings must be a whole"),
    ("a-list", [1, 2], "config.json must hold a JSON object"),
    ("not-json", "{heads", "cannot read Hugging Face config.json"),
]


@pytest.mark.parametrize(
    ("content", "fragment"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS]
)
def test_predict_config_json(tmp_path: Path, content: object, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = invoke(["predict", "--model", path, "--gpu", "H100-SXM-80GB"])
    check(result, 2, fragment)
    assert str(path) in result.output


def test_predict_config_folder_without_config_json(tmp_path: Path) -> None:
    check(invoke(["predict", "--model", tmp_path, "--gpu", "H100-SXM-80GB"]), 2, "config.json")


# ---------------------------------------------------------------- render: what it renders must run

RENDER: list[tuple[str, str, str]] = [
    (
        "tp-3-of-64-heads",
        "tp=3,max_batch_size=8,quantization=bf16",
        "tp 3 must divide llama-2-70b's 64 attention heads",
    ),
    ("does-not-fit", "tp=1,max_batch_size=256,quantization=bf16", "does not fit: weights"),
    (
        "tp-over-max-gpus",
        "tp=16,max_batch_size=8,quantization=bf16",
        "tp 16 exceeds gpu.maxGpusPerReplica (8)",
    ),
    ("nvfp4-on-hopper", "tp=8,max_batch_size=8,quantization=nvfp4", "does not support nvfp4"),
    ("tp-0", "tp=0,max_batch_size=8,quantization=bf16", "--config: tp must be at least 1"),
    (
        "batch-text",
        "tp=8,max_batch_size=many,quantization=bf16",
        "max_batch_size must be an integer",
    ),
    ("unknown-key", "tp=8,max_batch_size=8,quantization=bf16,pp=2", "unknown key 'pp'"),
    ("missing-key", "tp=8", "--config: missing max_batch_size, quantization"),
    ("not-key-value", "tp", "'tp' is not KEY=VALUE"),
    ("quant-unknown", "tp=8,max_batch_size=8,quantization=int3", "quantization must be one of"),
]


@pytest.mark.parametrize(
    ("config", "fragment"), [c[1:] for c in RENDER], ids=[c[0] for c in RENDER]
)
def test_render_refuses_what_cannot_run(tmp_path: Path, config: str, fragment: str) -> None:
    spec = manifest(tmp_path, put("spec.model.name", "llama-2-70b"))
    result = invoke(["render", spec, "--config", config, "--simulated"])
    check(result, 2, fragment)
    assert "kind: Deployment" not in result.output


def test_render_refuses_a_context_the_model_lacks(tmp_path: Path) -> None:
    # Within the context for validate's sake is not the point: render checks on its own.
    spec = manifest(tmp_path, put("spec.model.name", "llama-2-70b"))
    check(invoke(["render", spec, "--config", "tp=8,max_batch_size=8,quantization=bf16",
                  "--simulated"]), 0, "kind: Deployment")  # fmt: skip


# ---------------------------------------------------------------- tune: flags


def test_tune_flags(tmp_path: Path) -> None:
    spec = manifest(tmp_path)
    out = tmp_path / "out"
    for argv, fragment in (
        (["--seed", str(2**32)], "--seed must be between 0 and 4294967295"),
        (["--seed", "-1"], "--seed must be between 0"),
        (["--max-trials", "0"], "--max-trials must be between 1 and 1000"),
        # One limit: what a manifest may not ask (spec.tuning.maxTrials), the flag may not either.
        (
            ["--max-trials", "100000000"],
            "--max-trials must be between 1 and 1000 (the limit of "
            "spec.tuning.maxTrials), not 100000000",
        ),
        (["--confidence", "1"], "--confidence must be between 0.5 and 0.99, not 1.0"),
        (["--confidence", "0.3"], "--confidence must be between 0.5 and 0.99, not 0.3"),
        (["--backend", "gpu-cloud"], "unknown backend"),
        (["--sampler", "bayes"], "--sampler: unknown sampler 'bayes'"),
        (["--backend", f"replay:{tmp_path / 'none.csv'}"], "none.csv"),
    ):
        check(invoke(["tune", spec, "--out", out, "--no-progress", *argv]), 2, fragment)
    assert not (out / "report.json").exists()


def test_tune_job_bad_request_files(tmp_path: Path) -> None:
    base = ["tune-job", "--report-configmap", "x", "--namespace", "ns", "--request"]
    check(invoke([*base, tmp_path / "none.json"]), 2, "none.json: no such file")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "infertune.request/v1", "name": 3}')
    check(invoke([*base, bad]), 2, "bad.json: not a valid TuningRequest")


# ---------------------------------------------------------------- the operator and a dead cluster


def test_operator_with_a_dead_api_server_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    result = invoke(["operator", "-A"], env={"KUBECONFIG": str(kubeconfig)})
    check(result, 2, "cannot reach the Kubernetes API server")
    assert len(result.output.strip().splitlines()) == 1


def test_operator_with_a_broken_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [")
    result = invoke(["operator", "-A"], env={"KUBECONFIG": str(kubeconfig)})
    check(result, 2, "cannot reach a cluster")
