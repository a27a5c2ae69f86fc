"""Quantized checkpoints on the triton backend (item 4 of the real path): a quantization without
a pre-quantized checkpoint leaves the space up front, with its reason, instead of being measured
and failing; a checkpoint whose hf_quant_config.json declares an FP8 KV cache runs kv "auto" as
FP8, and the model predicts it so.

Upstream contract: TensorRT-LLM's PyTorch backend loads pre-quantized ModelOpt checkpoints
(NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py, `load_modelopt_quant_config` reads
`hf_quant_config.json`: `quantization.quant_algo`, `quantization.kv_cache_quant_algo`), and
`KvCacheConfig.dtype: "auto"` follows the checkpoint (tensorrt_llm/llmapi/llm_args.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from infertune_operator.api.manifest import load_deployment
from infertune_operator.api.to_request import to_request
from infertune_operator.cli import app
from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.run import prior_predictions, tune
from infertune_tuner.runtime import SimulatedRuntime
from infertune_tuner.space import build_space

REPO = Path(__file__).resolve().parents[2]
QUANTS = ["bf16", "fp8", "w4a16_awq", "w4a8_awq"]


def request(checkpoints: dict[str, str] | None = None, **tuning: object) -> TuningRequest:
    return TuningRequest.model_validate({
        "name": "ck",
        "model": {"name": "llama-3-8b", "checkpoints": checkpoints or {}},
        "gpu": {"product": "H100-SXM-80GB"},
        "workload": {"input_tokens": 64, "output_tokens": 16},
        "slo": [{"metric": "e2e_ms", "percentile": "p95", "max_ms": 60000}],
        "search": {"tensor_parallel": [1], "max_batch_size": [4, 8], "quantization": QUANTS,
                   "kv_cache_dtype": ["auto", "fp8"], "max_accuracy_loss_percent": 2.0},
        "tuning": {"backend": "triton", "max_trials": 2, **tuning},
    })  # fmt: skip


def space_of(req: TuningRequest, backend: str | None = None):  # type: ignore[no-untyped-def]
    return build_space(req, req.resolve_model(), req.resolve_gpu(), backend)


def test_quantizations_without_checkpoints_leave_the_triton_space_with_their_reason() -> None:
    space = space_of(request())
    assert space.quantization == ("bf16",)
    reasons = {e.value: e.reason for e in space.excluded if e.field == "quantization"}
    assert set(reasons) == {"fp8", "w4a16_awq", "w4a8_awq"}
    assert all(f"spec.model.checkpoints.{q}" in r for q, r in reasons.items())
    # a checkpoint brings its quantization back; the simulated pool loads no weights at all
    assert "fp8" in space_of(request({"fp8": "hf://nvidia/Llama-3-8B-FP8"})).quantization
    assert space_of(request(), "simulated").quantization == tuple(QUANTS)


def test_a_triton_search_without_checkpoints_spends_no_trial_on_them(tmp_path: Path) -> None:
    runtime = SimulatedRuntime(program=(sys.executable, "-m", "infertune_tuner.cli.simserver"),
                               time_scale=0.02)  # fmt: skip
    req = request()
    backend = TritonBackend(req, runtime=runtime, workdir=tmp_path / "w", requests_per_trial=8,
                            warmup=0, startup_timeout_s=30)  # fmt: skip
    report = tune(req, backend=backend, out_dir=tmp_path / "out")
    executed = [t for t in report.trials if t.executed]
    assert executed and all(t.config.quantization == "bf16" for t in executed)
    assert all(t.state == "complete" for t in executed), [t.reason for t in executed]
    assert report.best is not None
    assert {e.value for e in report.excluded} >= {"fp8", "w4a16_awq", "w4a8_awq"}


FP8_KV = {"producer": {"name": "modelopt"},
          "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}  # fmt: skip


def test_an_fp8_kv_checkpoint_makes_kv_auto_fp8(tmp_path: Path) -> None:
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(FP8_KV))
    req = request({"fp8": f"file://{tmp_path}"})
    space = space_of(req)
    assert space.fp8_kv_checkpoints == {"fp8"}
    fp8_auto = TrialConfig(1, 8, "fp8", "auto")
    assert space.effective(fp8_auto) == TrialConfig(1, 8, "fp8", "fp8")
    assert space.effective(TrialConfig(1, 8, "bf16", "auto")).kv_cache_dtype == "auto"
    # (fp8, kv fp8) is the same server as (fp8, kv auto): measured once
    assert TrialConfig(1, 8, "fp8", "fp8") not in space.configs and fp8_auto in space.configs
    twin = next(e for e in space.excluded if e.field == "kv_cache_dtype")
    assert "hf_quant_config.json" in twin.reason
    # the model predicts what runs: an FP8 KV cache holds twice the tokens
    priors = prior_predictions(req, space)
    plain = prior_predictions(req, space_of(req, "simulated"))
    assert priors[fp8_auto].memory.kv_bytes_per_token_per_gpu == (
        plain[fp8_auto].memory.kv_bytes_per_token_per_gpu / 2
    )
    # and the trial says so in its row of the report
    backend = TritonBackend(req, workdir=tmp_path / "w")
    assert "FP8 KV cache" in (backend._kv_note(fp8_auto) or "")
    assert backend._kv_note(TrialConfig(1, 8, "bf16", "auto")) is None


def test_the_shipped_examples_search_only_what_they_can_load() -> None:
    """On its backend (the operator's default, triton, unless it names one) no example loses a
    quantization for lack of a checkpoint (two used to search 4-bit formats without any, and
    aborted after three failed trials while 16-bit configurations that would run remained)."""
    for path in sorted((REPO / "examples").glob("*.yaml")):
        req = to_request(load_deployment(path), default_backend="triton")
        space = space_of(req)
        missing = [e for e in space.excluded if "checkpoint" in e.reason]
        assert not missing, f"{path.name}: {missing}"


def test_validate_lists_the_exclusions(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((REPO / "examples" / "llama3-8b-l4.yaml").read_text())
    doc["spec"]["model"].pop("checkpoints", None)
    path = tmp_path / "no-checkpoints.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = cli.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "search space on the triton backend" in result.stdout
    for q in ("fp8", "w4a16_awq", "w4a8_awq"):
        assert f"quantization={q}: no pre-quantized checkpoint" in result.stdout
