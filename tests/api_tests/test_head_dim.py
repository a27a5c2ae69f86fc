"""Attention heads wider or narrower than hiddenSize / heads (Qwen3, Mistral Small 3, Gemma 3):
by catalog name, or by hand with `spec.model.architecture.headDim`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.manifest import load_deployment, validate_document
from infertune_operator.api.to_request import to_request
from infertune_operator.cli import app
from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.harness.simserver import build_config, parse_architecture
from infertune_tuner.perfmodel import predict
from infertune_tuner.runtime.base import Ports
from infertune_tuner.runtime.simulated import SimulatedRuntime

GIB = 1024**3
A = "spec.model.architecture"
# Qwen/Qwen3-30B-A3B config.json: 32 heads of head_dim 128 = 4096 wide, hidden_size 2048.
QWEN3_30B_A3B = {"layers": 48, "hiddenSize": 2048, "heads": 32, "kvHeads": 4, "ffnSize": 768,
                 "vocabSize": 151936, "experts": 128, "expertsActive": 8}  # fmt: skip
# Qwen/Qwen3-32B config.json: 64 heads of head_dim 128 = 8192 wide, hidden_size 5120.
QWEN3_32B = {"layers": 64, "hiddenSize": 5120, "heads": 64, "kvHeads": 8, "ffnSize": 25600,
             "vocabSize": 151936}  # fmt: skip
# K and V, per layer, per KV head, head_dim values of 2 bytes (fp16/bf16 KV cache).
QWEN3_32B_KV_BYTES_PER_TOKEN = 2 * 64 * 8 * 128 * 2
# mistralai/Mistral-Small-24B-Instruct-2501 config.json: 32 x 128 = 4096, hidden_size 5120.
MISTRAL_SMALL_24B = {"layers": 40, "hiddenSize": 5120, "heads": 32, "kvHeads": 8,
                     "ffnSize": 32768, "vocabSize": 131072}  # fmt: skip
# google/gemma-3-27b-it config.json's text_config: 32 x 128 = 4096, hidden_size 5376.
GEMMA3_27B = {"layers": 62, "hiddenSize": 5376, "heads": 32, "kvHeads": 16, "ffnSize": 21504,
              "vocabSize": 262208}  # fmt: skip
BY_HAND = {"qwen3-30b-a3b": QWEN3_30B_A3B, "qwen3-32b": QWEN3_32B,
           "mistral-small-24b": MISTRAL_SMALL_24B, "gemma-3-27b": GEMMA3_27B}  # fmt: skip
# meta-llama/Meta-Llama-3-8B config.json: 4096 / 32 heads = 128, no head_dim of its own.
LLAMA3_8B = {"layers": 32, "hiddenSize": 4096, "heads": 32, "kvHeads": 8, "ffnSize": 14336,
             "vocabSize": 128256}  # fmt: skip
ISL, OSL, BATCH = 512, 128, 8  # 640 tokens: 20 whole KV pages of 32


def _doc(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "infertune.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "heads"},
        "spec": {
            "model": model,
            "gpu": {"product": "H100-SXM-80GB"},
            "workload": {"inputTokens": ISL, "outputTokens": OSL},
            "slo": {"e2eLatencyMs": {"p95": 600000}},
            "search": {
                "tensorParallel": [1, 2],
                "maxBatchSize": [BATCH],
                "quantization": ["bf16"],
                "kvCacheDtype": ["auto"],
            },
            "tuning": {"maxTrials": 2, "seed": 1, "backend": "simulated", "sampler": "grid"},
        },
    }


def _write(tmp_path: Path, model: dict[str, Any], name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_doc(model), sort_keys=False), encoding="utf-8")
    return path


def _tune(cli: CliRunner, spec: Path, out: Path) -> dict[str, Any]:
    result = cli.invoke(app, ["tune", str(spec), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def _predicted(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """What the performance model said of each executed trial, by tensor parallel size."""
    return {t["config"]["tp"]: t["predicted"] for t in report["trials"] if t["executed"]}


def test_qwen3_32b_by_name_validates_and_tunes_with_its_own_kv_size(
    tmp_path: Path, cli: CliRunner
) -> None:
    spec = _write(tmp_path, {"name": "Qwen/Qwen3-32B"}, "named")
    check = cli.invoke(app, ["validate", str(spec)])
    assert check.exit_code == 0, check.output
    tp1 = _predicted(_tune(cli, spec, tmp_path / "named"))[1]
    # max batch sequences of 640 tokens at the published per-token size
    expected = BATCH * (ISL + OSL) * QWEN3_32B_KV_BYTES_PER_TOKEN / GIB
    assert tp1["fits"] and tp1["kv_cache_gib_per_gpu"] == pytest.approx(expected, abs=1e-3)
    argv = ["predict", "--model", "Qwen/Qwen3-32B", "--gpu", "H100-SXM-80GB", "--json"]
    predicted = json.loads(cli.invoke(app, argv).output)
    assert predicted["model"] == "qwen3-32b"
    assert predicted["kv_bytes_per_token_per_gpu"] == QWEN3_32B_KV_BYTES_PER_TOKEN


@pytest.mark.parametrize("key", ["qwen3-30b-a3b", "qwen3-32b"])
def test_a_model_by_hand_with_head_dim_predicts_as_the_catalog(
    tmp_path: Path, cli: CliRunner, key: str
) -> None:
    named = _tune(cli, _write(tmp_path, {"name": key}, "named"), tmp_path / "named")
    custom = {"name": f"my-{key}", "architecture": {**BY_HAND[key], "headDim": 128}}
    by_hand = _tune(cli, _write(tmp_path, custom, "custom"), tmp_path / "custom")
    assert _predicted(by_hand) == _predicted(named) != {}
    assert by_hand["request"]["model"]["architecture"]["head_dim"] == 128


@pytest.mark.parametrize("key", BY_HAND)
def test_head_dim_reaches_every_prediction(key: str) -> None:
    named, _ = validate_document(_doc({"name": key}))
    custom, _ = validate_document(
        _doc({"name": "mine", "architecture": {**BY_HAND[key], "headDim": 128}})
    )
    assert named is not None and custom is not None
    ref, arch = to_request(named).resolve_model(), to_request(custom).resolve_model()
    gpu, work = get_gpu("H100-SXM-80GB"), Workload(2048, 512)
    for cfg in (TrialConfig(1, 8, "bf16", "auto"), TrialConfig(4, 64, "fp8", "fp8")):
        assert predict(arch, gpu, cfg, work) == predict(ref, gpu, cfg, work)


def test_an_architecture_without_head_dim_is_tuned_as_before(
    tmp_path: Path, cli: CliRunner
) -> None:
    """hiddenSize / heads as always: the same predictions as the catalog's Llama 3 8B, and a
    request without the field, so a study tuned before resumes under the same name."""
    named = _tune(cli, _write(tmp_path, {"name": "llama-3-8b"}, "named"), tmp_path / "named")
    custom = {"name": "my-llama", "architecture": LLAMA3_8B}
    by_hand = _tune(cli, _write(tmp_path, custom, "custom"), tmp_path / "custom")
    assert _predicted(by_hand) == _predicted(named) != {}
    assert "head_dim" not in by_hand["request"]["model"]["architecture"]


def test_the_simulated_server_models_the_head_dim() -> None:
    """A Deployment on the simulated pool (and the `triton:simulated` backend) starts
    `infertune simserver --architecture ...` with the request's shape."""
    custom, _ = validate_document(
        _doc({"name": "mine", "architecture": {**QWEN3_30B_A3B, "headDim": 128}})
    )
    assert custom is not None
    request, cfg = to_request(custom), TrialConfig(1, BATCH, "bf16", "auto")
    argv = SimulatedRuntime().launch_argv(request, cfg, repo_dir="", ports=Ports())
    arch = parse_architecture(argv[argv.index("--architecture") + 1])
    served = build_config(model="mine", gpu="H100-SXM-80GB", tp=1, max_batch=BATCH,
                          quant="bf16", architecture=arch).model  # fmt: skip
    assert served == request.resolve_model()


def test_head_dim_frees_hidden_size_from_a_multiple_of_heads(tmp_path: Path) -> None:
    odd = {"name": "odd", "architecture": {**LLAMA3_8B, "hiddenSize": 4100}}
    _, problems = validate_document(_doc(odd))
    assert [p.path for p in problems] == [A]
    assert "hiddenSize (4100) must be a multiple of heads (32)" in problems[0].message
    with_head_dim = {"name": "odd", "architecture": {**odd["architecture"], "headDim": 128}}
    obj, problems = validate_document(_doc(with_head_dim))
    assert problems == [] and obj is not None
    assert to_request(obj).resolve_model().q_size == 32 * 128


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "greater than or equal to 1"),
        (-128, "greater than or equal to 1"),
        ("128", "valid integer"),
        (True, "valid integer"),
        (128.5, "valid integer"),
    ],
)
def test_a_bad_head_dim_is_named_by_its_field_path(
    tmp_path: Path, cli: CliRunner, value: object, message: str
) -> None:
    custom = {"name": "mine", "architecture": {**QWEN3_30B_A3B, "headDim": value}}
    _, problems = validate_document(_doc(custom))
    assert [p.path for p in problems] == [f"{A}.headDim"]
    assert message in problems[0].message
    result = cli.invoke(app, ["validate", str(_write(tmp_path, custom, "bad"))])
    assert result.exit_code == 2 and f"{A}.headDim" in result.output
    assert "Traceback" not in result.output


def test_the_manifest_loader_keeps_head_dim(tmp_path: Path) -> None:
    custom = {"name": "mine", "architecture": {**QWEN3_30B_A3B, "headDim": 128}}
    obj = load_deployment(_write(tmp_path, custom, "loaded"))
    arch = obj.spec.model.architecture
    assert arch is not None and arch.head_dim == 128
