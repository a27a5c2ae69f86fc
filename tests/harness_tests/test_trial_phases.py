"""A real trial tells whoever watches which phase it is in (the CLI shows it beside the bar)."""

from __future__ import annotations

import sys
from pathlib import Path

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest

SIM = (
    f"{sys.executable} -m infertune_tuner.cli.simserver --host 127.0.0.1 --port {{port}}"
    " --http-port {http_port} --model {model} --gpu {gpu} --tp {tp}"
    " --max-batch {max_batch_size} --quant {quantization} --kv-dtype {kv_cache_dtype}"
    " --served-model {served_model} --time-scale 0.05"
)


def _request() -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "phases",
        "model": {"name": "llama-3-8b"},
        "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": 64, "output_tokens": 8},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
    })  # fmt: skip


def test_a_trial_reports_its_phases_in_order(tmp_path: Path) -> None:
    heard: list[tuple[str, str]] = []
    backend = TritonBackend(
        _request(), server_command=SIM, workdir=tmp_path, requests_per_trial=8, warmup=2,
        startup_timeout_s=30, on_phase=lambda cfg, phase: heard.append((cfg.label(), phase)),
    )  # fmt: skip
    cfg = TrialConfig(1, 4, "bf16", "auto")
    m = backend.run(cfg)
    assert m.status == "ok", m.reason
    assert heard == [
        (cfg.label(), "starting server"),
        (cfg.label(), "loading model"),
        (cfg.label(), "warm-up"),
        (cfg.label(), "measuring"),
    ]


def test_a_server_that_never_starts_stops_at_its_first_phases(tmp_path: Path) -> None:
    heard: list[str] = []
    backend = TritonBackend(
        _request(), server_command=f"{sys.executable} -c 'raise SystemExit(3)' {{port}}",
        workdir=tmp_path, startup_timeout_s=10, on_phase=lambda _, phase: heard.append(phase),
    )  # fmt: skip
    m = backend.run(TrialConfig(1, 4, "bf16", "auto"))
    assert m.status == "error"
    assert heard == ["starting server", "loading model"]
