"""Model catalog: transformer shapes of common open models, Hugging Face ids, config.json loading."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertune_tuner.errors import InputError


@dataclass(frozen=True, slots=True)
class ModelArch:
    key: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    ffn_size: int  # per expert for MoE
    vocab_size: int
    experts: int = 1
    experts_active: int = 1
    max_context: int = 4096
    hf_ids: tuple[str, ...] = field(default=(), compare=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def attention_params_per_layer(self) -> int:
        kv = self.kv_heads * self.head_dim
        return self.hidden_size * (2 * self.hidden_size + 2 * kv)  # q, o + k, v

    @property
    def expert_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.ffn_size  # gated MLP: up, gate, down

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size  # input embedding; the LM head is as large

    @property
    def params(self) -> int:
        """Total parameters (embedding and untied LM head included)."""
        per_layer = self.attention_params_per_layer + self.experts * self.expert_params_per_layer
        router = self.hidden_size * self.experts if self.experts > 1 else 0
        return self.layers * (per_layer + router) + 2 * self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches (MoE: the active experts only)."""
        per_layer = (
            self.attention_params_per_layer + self.experts_active * self.expert_params_per_layer
        )
        return self.layers * per_layer + 2 * self.embedding_params

    def valid_tp(self, tp: int) -> bool:
        return tp >= 1 and self.heads % tp == 0


def _m(key: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
       ctx: int, hf: tuple[str, ...], experts: int = 1, active: int = 1) -> ModelArch:  # fmt: skip
    return ModelArch(key, layers, hidden, heads, kv, ffn, vocab, experts, active, ctx, hf)


# fmt: off
# key              layers hidden heads kv   ffn    vocab   context
MODELS: dict[str, ModelArch] = {m.key: m for m in (
    _m("llama-2-7b",    32, 4096, 32, 32, 11008,  32000,  4096,
       ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf")),
    _m("llama-2-13b",   40, 5120, 40, 40, 13824,  32000,  4096,
       ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf")),
    _m("llama-2-70b",   80, 8192, 64,  8, 28672,  32000,  4096,
       ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf")),
    _m("llama-3-8b",    32, 4096, 32,  8, 14336, 128256,  8192,
       ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct")),
    _m("llama-3-70b",   80, 8192, 64,  8, 28672, 128256,  8192,
       ("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct",
        "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct")),
    _m("mistral-7b",    32, 4096, 32,  8, 14336,  32000, 32768,
       ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
        "mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.3")),
    _m("mixtral-8x7b",  32, 4096, 32,  8, 14336,  32000, 32768,
       ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
       experts=8, active=2),
    _m("qwen2-7b",      28, 3584, 28,  4, 18944, 152064, 32768,
       ("Qwen/Qwen2-7B", "Qwen/Qwen2-7B-Instruct")),
    _m("qwen2-72b",     80, 8192, 64,  8, 29568, 152064, 32768,
       ("Qwen/Qwen2-72B", "Qwen/Qwen2-72B-Instruct")),
)}
# fmt: on


def get_model(name: str) -> ModelArch:
    """Look a model up by catalog key or Hugging Face id (case-insensitive, hf:// allowed)."""
    if name in MODELS:
        return MODELS[name]
    low = name.lower().removeprefix("hf://")
    for model in MODELS.values():
        if model.key == low or low in (h.lower() for h in model.hf_ids):
            return model
    raise InputError(
        f"unknown model {name!r}; use a catalog key ({', '.join(MODELS)}), a Hugging Face id of "
        "one of them, or give spec.model.architecture / a config.json"
    )


def _pick(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def model_from_hf_config(cfg: dict[str, Any], key: str = "custom") -> ModelArch:
    """A ModelArch from a Hugging Face `config.json` dict (Llama/Mistral/Mixtral/Qwen style)."""
    try:
        heads = int(_pick(cfg, "num_attention_heads", "n_head"))
        arch = ModelArch(
            key=key,
            layers=int(_pick(cfg, "num_hidden_layers", "n_layer")),
            hidden_size=int(_pick(cfg, "hidden_size", "n_embd")),
            heads=heads,
            kv_heads=int(_pick(cfg, "num_key_value_heads", default=heads)),
            ffn_size=int(_pick(cfg, "intermediate_size", "ffn_dim")),
            vocab_size=int(_pick(cfg, "vocab_size")),
            experts=int(_pick(cfg, "num_local_experts", "num_experts", default=1)),
            experts_active=int(_pick(cfg, "num_experts_per_tok", default=1)),
            max_context=int(_pick(cfg, "max_position_embeddings", default=4096)),
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"config.json lacks a field infertune needs: {exc}") from None
    if arch.heads % arch.kv_heads or arch.hidden_size % arch.heads:
        raise InputError("config.json: heads must divide hidden_size and be a multiple of kv heads")
    return arch


def model_from_config_file(path: Path) -> ModelArch:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read Hugging Face config.json: {exc}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: config.json must hold a JSON object")
    return model_from_hf_config(cfg, key=path.parent.name or "custom")


def resolve_model(name: str) -> ModelArch:
    """A catalog key, a Hugging Face id, or a path to a Hugging Face config.json (or its folder)."""
    path = Path(name)
    if name.endswith(".json") or path.is_dir():
        return model_from_config_file(path / "config.json" if path.is_dir() else path)
    return get_model(name)
