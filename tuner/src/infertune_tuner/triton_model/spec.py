"""What the Python-backend model serves: model.yaml (as rendered for TensorRT-LLM) + body.json.

model.yaml is read for what TensorRT-LLM's LLM API would read from it (`max_batch_size`,
`max_num_tokens`, `kv_cache_config.dtype`, `tensor_parallel_size`, `stream_interval`: one
streamed response per that many tokens); body.json names what only infertune's model needs:
which body, the model's shape, the GPU, the quantization (model.yaml says `auto` for a
pre-quantized checkpoint), the longest context a request may have and the simulated clock's time
scale. Three more body.json keys make the model behave as other servers do, for the tests and
benchmarks that measure the client against them (never rendered by the runtime):

- `stop_after`: every request ends after this many tokens, as a model that reaches its
  end-of-sequence token early;
- `stop_signal`: how a request's end reaches Triton: `flagged` (its last token goes out flagged
  final, as TensorRT-LLM's LLM-API model sends it), `empty` (the last token goes out unflagged,
  then the final flag alone: Triton sends the client nothing for it unless the request opted in
  to the empty final response), `none` (never: the request stays open until the client cancels
  it, as a stuck model would leave it);
- `text_mode`: `cumulative` (each response holds the text so far, as the LLM-API model sends
  `output.text`) or `delta` (only the response's new tokens, as clients that concatenate
  streamed text, such as AIPerf, expect).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig

BODY_FILE = "body.json"
MODEL_YAML = "model.yaml"
BodyKind = Literal["simulated", "torch"]
BODIES: tuple[BodyKind, ...] = ("simulated", "torch")
StopSignal = Literal["flagged", "empty", "none"]
STOP_SIGNALS: tuple[StopSignal, ...] = ("flagged", "empty", "none")
TextMode = Literal["cumulative", "delta"]
TEXT_MODES: tuple[TextMode, ...] = ("cumulative", "delta")


@dataclass(frozen=True)
class BodySpec:
    """body.json: the model body and what it needs beyond model.yaml."""

    body: BodyKind
    arch: dict[str, Any]  # ModelArch's fields (hf_ids left out)
    gpu: str  # catalog key
    quantization: str
    max_context: int  # input + output tokens of the longest request the body must hold
    time_scale: float = 1.0
    stop_after: int | None = None  # see the module doc: other servers' behaviours
    stop_signal: StopSignal = "flagged"
    text_mode: TextMode = "cumulative"

    def model_arch(self) -> ModelArch:
        return ModelArch(**self.arch)

    def text(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def of(
        cls, body: BodyKind, arch: ModelArch, gpu: str, config: TrialConfig, max_context: int,
        time_scale: float = 1.0,
    ) -> BodySpec:  # fmt: skip
        fields = {k: v for k, v in asdict(arch).items() if k != "hf_ids"}
        return cls(body, fields, gpu, config.quantization, max_context, time_scale)


@dataclass(frozen=True)
class Served:
    """Everything the model serves with, read from its version folder."""

    spec: BodySpec
    config: TrialConfig
    max_num_tokens: int
    stream_interval: int = 1


def read(version_dir: Path) -> Served:
    """Read model.yaml and body.json of a repository's version folder (ValueError if unusable)."""
    try:
        llm = yaml.safe_load((version_dir / MODEL_YAML).read_text(encoding="utf-8"))
        raw = json.loads((version_dir / BODY_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the model's files in {version_dir}: {exc}") from exc
    spec = BodySpec(**raw)
    if spec.body not in BODIES:
        raise ValueError(f"{BODY_FILE}: unknown body {spec.body!r}; known: {', '.join(BODIES)}")
    if spec.stop_signal not in STOP_SIGNALS or spec.text_mode not in TEXT_MODES:
        raise ValueError(
            f"{BODY_FILE}: stop_signal must be one of {', '.join(STOP_SIGNALS)} and text_mode one of "
            f"{', '.join(TEXT_MODES)}"
        )
    if spec.stop_after is not None and spec.stop_after < 1:
        raise ValueError(f"{BODY_FILE}: stop_after must be at least 1")
    interval = int(llm.get("stream_interval") or 1)
    if interval < 1:
        raise ValueError(f"{MODEL_YAML}: stream_interval must be at least 1")
    kv = (llm.get("kv_cache_config") or {}).get("dtype", "auto")
    config = TrialConfig(
        tp=int(llm["tensor_parallel_size"]),
        max_batch_size=int(llm["max_batch_size"]),
        quantization=spec.quantization,
        kv_cache_dtype=kv,
    )
    return Served(spec, config, int(llm["max_num_tokens"]), interval)
