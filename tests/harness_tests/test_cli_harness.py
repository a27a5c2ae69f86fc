"""`infertune bench`, `simserver` and `render`: output formats and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app, parse_config
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.harness.runner import free_port


def bench_args(port: int, *extra: str) -> list[str]:
    return [
        "bench", "--url", f"127.0.0.1:{port}", "--model", "llm", "--concurrency", "4",
        "--requests", "8", "--input-tokens", "32", "--output-tokens", "4", *extra,
    ]  # fmt: skip


def test_bench_json(cli: CliRunner, server_port: int) -> None:
    result = cli.invoke(app, bench_args(server_port, "--warmup", "2", "--json"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["requests"], data["errors"]) == (8, 0)
    for metric in ("ttft_ms", "itl_ms", "e2e_ms", "token_gap_ms"):
        assert set(data[metric]) >= {"p50", "p95", "p99"}
    assert data["itl_ms"]["count"] == 8  # one per request (GenAI-Perf), the gaps pooled apart
    assert data["token_gap_ms"]["count"] > data["itl_ms"]["count"]
    assert data["output_tokens_per_s"] > 0 and data["duration_s"] > 0
    assert data["settings"]["deadline_s"] == 3600


def test_bench_table(cli: CliRunner, server_port: int) -> None:
    result = cli.invoke(app, bench_args(server_port))
    assert result.exit_code == 0, result.output
    for word in ("TTFT", "ITL", "E2E", "token gaps", "p99", "requests 8"):
        assert word in result.stdout
    # simserver declares no token count: the run says it counted one token per response
    assert "counted as one per response" in " ".join(result.stdout.split())


def test_bench_warms_up_with_one_full_wave_by_default(cli: CliRunner, server_port: int) -> None:
    result = cli.invoke(app, bench_args(server_port, "--json"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"]["warmup"] == 4  # --concurrency 4
    rate = cli.invoke(app, [*bench_args(server_port, "--json"), "--request-rate", "20"])
    assert json.loads(rate.stdout)["settings"]["warmup"] == 4  # the cap
    uncapped = bench_args(server_port, "--json", "--request-rate", "2.5")
    uncapped[uncapped.index("--concurrency") : uncapped.index("--concurrency") + 2] = []
    assert json.loads(cli.invoke(app, uncapped).stdout)["settings"]["warmup"] == 3  # 1 s
    helptext = " ".join(cli.invoke(app, ["bench", "--help"]).stdout.split())
    assert "Default: one full wave" in helptext.replace("│ ", "")


def test_bench_exits_1_when_requests_fail(cli: CliRunner, server_port: int) -> None:
    # Each request takes milliseconds of modelled time; a 0.1 ms timeout fails every one.
    result = cli.invoke(
        app, bench_args(server_port, "--json", "--timeout", "0.0001", "--warmup", "0")
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["errors"] >= 1 and data["requests"] == 0 and data["error_samples"]


def test_bench_wrong_model_is_one_error_before_any_request(
    cli: CliRunner, server_port: int
) -> None:
    args = bench_args(server_port)
    args[args.index("llm")] = "nope"
    result = cli.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""  # no empty table
    assert result.stderr.startswith("error: --model 'nope': not served at")
    assert result.stderr.rstrip().endswith("; it serves llm")  # what to give --model instead


def test_simserver_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "infertune_tuner.cli.simserver", "--model", "llama-3-8b",
             "--gpu", "L4-24GB", "--max-batch", "8", "--host", "127.0.0.1", "--port", str(port),
             "--http-port", "-1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: cannot bind the gRPC port 127.0.0.1:{port}: Address already in use (give --port)"
    ]


def test_bench_unreachable_server_exits_2(cli: CliRunner) -> None:
    result = cli.invoke(app, ["bench", "--url", f"127.0.0.1:{free_port()}", "--model", "llm"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot reach Triton")
    assert "Traceback" not in result.output


def test_bench_bad_arguments_exit_2(cli: CliRunner) -> None:
    result = cli.invoke(app, ["bench", "--url", "127.0.0.1:1", "--model", "m", "--requests", "0"])
    assert result.exit_code == 2 and "error:" in result.stderr
    result = cli.invoke(app, ["bench", "--url", "127.0.0.1:1", "--model", "m", "--deadline", "0"])
    assert result.exit_code == 2 and "deadline" in result.stderr


def test_simserver_unknown_model_exits_2(cli: CliRunner) -> None:
    result = cli.invoke(
        app, ["simserver", "--model", "gpt-17", "--gpu", "H100-SXM-80GB", "--max-batch", "8"]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown model")


def test_simserver_weights_that_do_not_fit_exit_1_with_cuda_oom(cli: CliRunner) -> None:
    result = cli.invoke(
        app, ["simserver", "--model", "llama-2-70b", "--gpu", "L4-24GB", "--max-batch", "8"]
    )
    assert result.exit_code == 1
    assert "CUDA out of memory" in result.stderr


def test_render_prints_the_serving_objects(cli: CliRunner, repo: Path) -> None:
    result = cli.invoke(
        app,
        ["render", str(repo / "examples/llama2-70b-h100.yaml"),
         "--config", "tp=4,max_batch_size=64,quantization=fp8,kv_cache_dtype=fp8"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]
    model_yaml = yaml.safe_load(docs[0]["data"]["model.yaml"])
    assert model_yaml["model"] == "/model-cache/weights/nvidia/Llama-2-70b-chat-hf-FP8"
    assert model_yaml["kv_cache_config"]["dtype"] == "fp8"
    sim = cli.invoke(
        app,
        ["render", str(repo / "examples/llama2-70b-h100.yaml"), "--simulated",
         "--config", "tp=4,max_batch_size=64,quantization=fp8"],
    )  # fmt: skip
    assert sim.exit_code == 0, sim.output
    (dep,) = [d for d in yaml.safe_load_all(sim.stdout) if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"][1] == "simserver"


@pytest.mark.parametrize(
    "config",
    ["tp=2", "tp=two,max_batch_size=8,quantization=fp8", "tp=2,max_batch_size=8,quantization=q9",
     "tp=2,max_batch_size=8,quantization=fp8,color=red", "tp=2,max_batch_size"],
)  # fmt: skip
def test_render_bad_config_exits_2(cli: CliRunner, repo: Path, config: str) -> None:
    result = cli.invoke(
        app, ["render", str(repo / "examples/llama2-70b-h100.yaml"), "--config", config]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --config")


def test_parse_config() -> None:
    assert parse_config("tp=2, max_batch_size=128,quantization=fp8") == TrialConfig(
        2, 128, "fp8", "auto"
    )
    with pytest.raises(InputError):
        parse_config("tp=0,max_batch_size=1,quantization=fp8")
