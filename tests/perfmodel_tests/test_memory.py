"""Memory math against hand calculations."""

from __future__ import annotations

import pytest

from infertune_tuner.catalog.gpus import GPUS, get_gpu
from infertune_tuner.catalog.llms import MODELS, get_model, model_from_hf_config
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.errors import InputError
from infertune_tuner.perfmodel.memory import (
    GIB,
    estimate_memory,
    kv_bytes_per_token,
    weight_bytes_per_gpu,
)

MIB = 1024**2


def test_llama2_7b_fp16_kv_is_half_a_mib_per_token() -> None:
    # 2 (K,V) x 32 layers x 32 kv heads x 128 head dim x 2 bytes = 524288 B
    assert kv_bytes_per_token(get_model("llama-2-7b"), 1, "auto") == 0.5 * MIB


def test_fp8_kv_halves_and_tp_splits_kv_heads() -> None:
    m = get_model("llama-2-70b")  # 8 KV heads (GQA)
    assert kv_bytes_per_token(m, 1, "fp8") == kv_bytes_per_token(m, 1, "auto") / 2
    assert kv_bytes_per_token(m, 8, "auto") == kv_bytes_per_token(m, 1, "auto") / 8
    # Beyond 8 ranks the KV heads replicate: no further saving.
    assert kv_bytes_per_token(m, 16, "auto") == kv_bytes_per_token(m, 8, "auto")


def test_llama2_70b_fp16_does_not_fit_two_80gb_gpus_with_32x4096_kv() -> None:
    m, g = get_model("llama-2-70b"), get_gpu("H100-SXM-80GB")
    cfg = TrialConfig(tp=2, max_batch_size=32, quantization="fp16", kv_cache_dtype="auto")
    est = estimate_memory(m, g, cfg, Workload(input_tokens=3584, output_tokens=512))
    # weights: ~69e9 params x 2 B / 2 GPUs = 64.2 GiB; KV: 32 x 4096 x 160 KiB = 20 GiB
    assert est.weights_gib_per_gpu == pytest.approx(68.98e9 * 2 / 2 / GIB, rel=0.01)
    assert est.kv_cache_gib_per_gpu == pytest.approx(20.0, rel=0.01)
    assert not est.fits
    assert "fewer than max batch 32" in (est.reason or "")


def test_weights_alone_overflowing_is_reported() -> None:
    m, g = get_model("llama-2-70b"), get_gpu("H100-SXM-80GB")
    est = estimate_memory(m, g, TrialConfig(1, 1, "fp16", "auto"), Workload(1024, 512))
    assert not est.fits and est.max_concurrent_sequences == 0
    assert "exceed 80 GiB per GPU" in (est.reason or "")


def test_quantization_shrinks_weights_with_scales_included() -> None:
    m = get_model("llama-2-70b")
    fp16 = weight_bytes_per_gpu(m, 1, "fp16")
    fp8 = weight_bytes_per_gpu(m, 1, "fp8")
    awq = weight_bytes_per_gpu(m, 1, "w4a16_awq")
    assert 0.5 < fp8 / fp16 < 0.53  # embeddings stay 16-bit
    assert 0.26 < awq / fp16 < 0.3  # 4-bit + group scales + 16-bit embeddings


def test_more_memory_fits_more_sequences() -> None:
    m, w = get_model("llama-3-8b"), Workload(1024, 1024)
    cfg = TrialConfig(1, 8, "bf16", "auto")
    small = estimate_memory(m, get_gpu("L4-24GB"), cfg, w).max_concurrent_sequences
    big = estimate_memory(m, get_gpu("H100-SXM-80GB"), cfg, w).max_concurrent_sequences
    assert 0 < small < big


def test_catalogs_have_the_contract_keys() -> None:
    assert set(GPUS) == {
        "T4-16GB", "A10-24GB", "L4-24GB", "L40S-48GB", "A100-SXM-40GB", "A100-SXM-80GB",
        "H100-SXM-80GB", "H100-PCIE-80GB", "H200-SXM-141GB", "GH200-96GB", "B200-SXM-192GB",
    }  # fmt: skip
    assert set(MODELS) == {
        "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
        "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2-7b", "qwen2-72b",
        "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen2.5-7b",
        "qwen2.5-32b", "qwen2.5-72b", "mistral-small-24b", "gemma-3-27b",
    }  # fmt: skip
    assert "fp8" not in GPUS["A100-SXM-80GB"].quantizations
    assert "nvfp4" in GPUS["B200-SXM-192GB"].quantizations
    assert GPUS["H100-SXM-80GB"].product_labels[0] == "NVIDIA-H100-80GB-HBM3"


def test_model_params_and_moe() -> None:
    assert MODELS["llama-2-70b"].params == pytest.approx(69e9, rel=0.01)
    assert MODELS["llama-3.1-405b"].params == pytest.approx(405.9e9, rel=0.01)
    big = MODELS["qwen3-235b-a22b"]  # published: 235B total, 22B active
    assert big.params == pytest.approx(235e9, rel=0.01)
    assert big.active_params == pytest.approx(22e9, rel=0.02)
    mix = MODELS["mixtral-8x7b"]
    assert mix.params == pytest.approx(46.7e9, rel=0.01)
    assert mix.active_params == pytest.approx(12.9e9, rel=0.01)


# Published sizes: the model cards' "Number of Parameters" (Qwen), the Hub's count of the
# safetensors (Mistral Small 3).
PUBLISHED_PARAMS = {
    "qwen3-8b": 8.2e9, "qwen3-14b": 14.8e9, "qwen3-32b": 32.8e9, "qwen2.5-7b": 7.61e9,
    "qwen2.5-32b": 32.5e9, "qwen2.5-72b": 72.7e9, "mistral-small-24b": 23.6e9,
}  # fmt: skip


@pytest.mark.parametrize("key", PUBLISHED_PARAMS)
def test_dense_model_params_match_the_published_size(key: str) -> None:
    assert MODELS[key].params == pytest.approx(PUBLISHED_PARAMS[key], rel=0.01)


def test_gemma3_27b_params_match_the_technical_report() -> None:
    """The Gemma 3 report counts 25,600 M non-embedding parameters in the 27B (its 27 B adds
    the 1.4 B embedding, which the LM head shares, and a 0.4 B vision encoder)."""
    gemma = MODELS["gemma-3-27b"]
    non_embedding = gemma.params - 2 * gemma.embedding_params  # the catalog's LM head apart
    assert non_embedding == pytest.approx(25.6e9, rel=0.01)


def test_hf_ids_and_config_json() -> None:
    assert get_model("meta-llama/Llama-2-70b-chat-hf").key == "llama-2-70b"
    assert get_model("hf://Qwen/Qwen2-7B-Instruct").key == "qwen2-7b"
    assert get_model("Qwen/Qwen2.5-72B-Instruct").key == "qwen2.5-72b"
    assert get_model("mistralai/Mistral-Small-24B-Instruct-2501").key == "mistral-small-24b"
    assert get_model("google/gemma-3-27b-it").key == "gemma-3-27b"
    with pytest.raises(InputError, match="unknown model"):
        get_model("gpt-17")
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000}  # fmt: skip
    arch = model_from_hf_config(cfg, key="x")
    assert arch.params == MODELS["mistral-7b"].params
    with pytest.raises(InputError):
        model_from_hf_config({"hidden_size": 1})


def test_gpu_lookup_by_node_label() -> None:
    assert get_gpu("NVIDIA-H100-80GB-HBM3").key == "H100-SXM-80GB"
    with pytest.raises(InputError, match="unknown GPU"):
        get_gpu("RTX-9999")
