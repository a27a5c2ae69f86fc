"""LLM catalog: transformer shapes of common open models, Hugging Face ids, config.json loading.

Shapes are the models' own Hugging Face `config.json` values. `max_context` is
`max_position_embeddings`: the longest input + output a deployment can serve (`None` when unknown,
e.g. an architecture given by hand). `head_dim` is the config's `head_dim` where the model sets
one that differs from hidden_size / heads (Qwen3: 128 with hidden 2048 and 32 heads).
"""

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
    max_context: int | None = None  # max_position_embeddings; None: unknown, not checked
    hf_ids: tuple[str, ...] = field(default=(), compare=False)
    head_dim: int = 0  # 0: hidden_size // heads

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.heads)

    @property
    def q_size(self) -> int:
        """Width of the attention queries (and of the output projection's input)."""
        return self.heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        kv = self.kv_heads * self.head_dim
        return self.hidden_size * (2 * self.q_size + 2 * kv)  # q, o + k, v

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

    def context_problem(self, input_tokens: int, output_tokens: int) -> str | None:
        """Why a request of this length cannot be served, or None when it can (or is unknown)."""
        total = input_tokens + output_tokens
        if self.max_context is None or total <= self.max_context:
            return None
        return (
            f"{input_tokens} input + {output_tokens} output = {total} tokens exceed {self.key}'s "
            f"maximum context of {self.max_context} tokens (max_position_embeddings)"
        )


# Hugging Face organisations whose model repositories are gated: the Hub serves their files only
# to an account that accepted the repository's terms, so a download needs that account's token.
# Their model cards carry `extra_gated_*` front matter: meta-llama's licence agreement (every
# Llama), mistralai's "You need to agree to share your contact information to access this
# model" (Mistral-7B-Instruct-v0.2 and later, since 2024), google's Gemma terms.
GATED_HF_ORGS = ("meta-llama", "mistralai", "google")


def is_gated(hf_id: str) -> bool:
    """Whether downloading the Hugging Face repository `org/name` needs an access token."""
    return hf_id.removeprefix("hf://").split("/", 1)[0] in GATED_HF_ORGS


def _m(key: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
       ctx: int, hf: tuple[str, ...], experts: int = 1, active: int = 1,
       head_dim: int = 0) -> ModelArch:  # fmt: skip
    return ModelArch(key, layers, hidden, heads, kv, ffn, vocab, experts, active, ctx, hf, head_dim)


def _llama31(size: str, *more: str) -> tuple[str, ...]:
    """Meta's Hugging Face ids of a Llama 3.1 size (both spellings), then any others."""
    names = (
        "Llama-3.1-{}",
        "Llama-3.1-{}-Instruct",
        "Meta-Llama-3.1-{}",
        "Meta-Llama-3.1-{}-Instruct",
    )
    return tuple("meta-llama/" + n.format(size) for n in names) + more


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
       ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct")),
    _m("llama-3-70b",   80, 8192, 64,  8, 28672, 128256,  8192,
       ("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct")),
    _m("llama-3.1-8b",  32, 4096, 32,  8, 14336, 128256, 131072,
       _llama31("8B", "nvidia/Llama-3.1-8B-Instruct-FP8")),
    _m("llama-3.1-70b", 80, 8192, 64,  8, 28672, 128256, 131072,
       _llama31("70B", "meta-llama/Llama-3.3-70B-Instruct", "nvidia/Llama-3.3-70B-Instruct-FP8",
                "nvidia/Llama-3.3-70B-Instruct-FP4")),
    _m("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072,
       _llama31("405B", "nvidia/Llama-3.1-405B-Instruct-FP8", "nvidia/Llama-3.1-405B-Instruct-FP4")),
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
    # Qwen3 MoE: every layer is MoE; ffn is moe_intermediate_size; head_dim 128 != hidden / heads.
    _m("qwen3-30b-a3b", 48, 2048, 32,  4,   768, 151936, 40960,
       ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-FP8", "nvidia/Qwen3-30B-A3B-FP4"),
       experts=128, active=8, head_dim=128),
    _m("qwen3-235b-a22b", 94, 4096, 64, 4,  1536, 151936, 40960,
       ("Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-FP8", "nvidia/Qwen3-235B-A22B-FP8",
        "nvidia/Qwen3-235B-A22B-FP4"),
       experts=128, active=8, head_dim=128),
    # Dense Qwen3: head_dim 128 (the 32B's 64 heads are 8192 wide, its hidden size 5120).
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    _m("qwen3-8b",      36, 4096, 32,  8, 12288, 151936, 40960, ("Qwen/Qwen3-8B",), head_dim=128),
    # https://huggingface.co/Qwen/Qwen3-14B/blob/main/config.json
    _m("qwen3-14b",     40, 5120, 40,  8, 17408, 151936, 40960, ("Qwen/Qwen3-14B",), head_dim=128),
    # https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json
    _m("qwen3-32b",     64, 5120, 64,  8, 25600, 151936, 40960, ("Qwen/Qwen3-32B",), head_dim=128),
    # Qwen2.5 Instruct: 32768 positions (the base models' config.json says 131072); the 7B and
    # 72B have Qwen2's shapes.
    # https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json
    _m("qwen2.5-7b",    28, 3584, 28,  4, 18944, 152064, 32768, ("Qwen/Qwen2.5-7B-Instruct",)),
    # https://huggingface.co/Qwen/Qwen2.5-32B-Instruct/blob/main/config.json
    _m("qwen2.5-32b",   64, 5120, 40,  8, 27648, 152064, 32768, ("Qwen/Qwen2.5-32B-Instruct",)),
    # https://huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/config.json
    _m("qwen2.5-72b",   80, 8192, 64,  8, 29568, 152064, 32768, ("Qwen/Qwen2.5-72B-Instruct",)),
    # Mistral Small 3: head_dim 128 (32 heads x 128 = 4096 != hidden 5120).
    # https://huggingface.co/mistralai/Mistral-Small-24B-Instruct-2501/blob/main/config.json
    _m("mistral-small-24b", 40, 5120, 32, 8, 32768, 131072, 32768,
       ("mistralai/Mistral-Small-24B-Instruct-2501",), head_dim=128),
    # Gemma 3 27B, its language model: config.json's text_config (62 layers, 5376 hidden, 32
    # heads, 16 KV heads of head_dim 128, 21504 FFN); the vocabulary (262208), the positions
    # (131072) and tie_word_embeddings (true) are transformers' Gemma3TextConfig defaults, which
    # that text_config leaves unset:
    # https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json
    # https://github.com/huggingface/transformers/blob/main/src/transformers/models/gemma3/configuration_gemma3.py
    # Approximated: 52 of the 62 layers attend over a sliding window of 1024 tokens, modelled as
    # full attention like every layer here (past 1024 tokens the KV cache is overestimated, up
    # to 62/10 = 6.2x); the tied LM head is counted apart like every model's (params reads one
    # 1.4 B embedding above the checkpoint); the 0.4 B vision encoder is left out.
    _m("gemma-3-27b",   62, 5376, 32, 16, 21504, 262208, 131072, ("google/gemma-3-27b-it",),
       head_dim=128),
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


def _count(cfg: dict[str, Any], *names: str, default: Any = None, least: int = 1) -> int:
    """A whole number field of config.json (the first of ``names`` present), at least ``least``."""
    value = _pick(cfg, *names, default=default)
    if value is None:
        raise InputError(f"config.json lacks {names[0]}, which infertune needs")
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(
            f"config.json: {next((n for n in names if n in cfg), names[0])} must be a whole "
            f"number of at least {least}, not {value!r}"
        )
    return value


def model_from_hf_config(cfg: dict[str, Any], key: str = "custom") -> ModelArch:
    """A ModelArch from a Hugging Face `config.json` dict (Llama/Mistral/Mixtral/Qwen style)."""
    heads = _count(cfg, "num_attention_heads", "n_head")
    context = _pick(cfg, "max_position_embeddings", "n_positions")
    arch = ModelArch(
        key=key,
        layers=_count(cfg, "num_hidden_layers", "n_layer"),
        hidden_size=_count(cfg, "hidden_size", "n_embd"),
        heads=heads,
        kv_heads=_count(cfg, "num_key_value_heads", default=heads),
        # MoE configs that also carry a dense intermediate_size name the expert width apart.
        ffn_size=_count(cfg, "moe_intermediate_size", "intermediate_size", "ffn_dim"),
        vocab_size=_count(cfg, "vocab_size"),
        experts=_count(cfg, "num_local_experts", "num_experts", default=1),
        experts_active=_count(cfg, "num_experts_per_tok", default=1),
        max_context=None
        if context is None
        else _count(cfg, "max_position_embeddings", "n_positions"),
        head_dim=_count(cfg, "head_dim", default=0, least=0),
    )
    if arch.heads % arch.kv_heads:
        raise InputError("config.json: num_attention_heads must be a multiple of the KV heads")
    if arch.hidden_size % arch.heads and not cfg.get("head_dim"):
        raise InputError("config.json: heads must divide hidden_size (or give head_dim)")
    if arch.experts_active > arch.experts:
        raise InputError(
            f"config.json: num_experts_per_tok ({arch.experts_active}) exceeds the number of "
            f"experts ({arch.experts})"
        )
    return arch


def model_from_config_file(path: Path) -> ModelArch:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{path}: cannot read Hugging Face config.json: {exc}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: config.json must hold a JSON object")
    try:
        return model_from_hf_config(cfg, key=path.parent.name or "custom")
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def resolve_model(name: str) -> ModelArch:
    """A catalog key, a Hugging Face id, or a path to a Hugging Face config.json (or its folder)."""
    path = Path(name)
    if name.endswith(".json") or path.is_dir():
        return model_from_config_file(path / "config.json" if path.is_dir() else path)
    return get_model(name)
