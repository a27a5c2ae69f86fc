"""The point the tuner searches over, and the workload it is measured under."""

from __future__ import annotations

from dataclasses import dataclass

CONFIG_KEYS = ("tp", "max_batch_size", "quantization", "kv_cache_dtype")


@dataclass(frozen=True, slots=True, order=True)
class TrialConfig:
    tp: int
    max_batch_size: int
    quantization: str
    kv_cache_dtype: str

    def as_dict(self) -> dict[str, int | str]:
        return {
            "tp": self.tp,
            "max_batch_size": self.max_batch_size,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
        }

    def label(self) -> str:
        return f"tp{self.tp}/bs{self.max_batch_size}/{self.quantization}/kv-{self.kv_cache_dtype}"


@dataclass(frozen=True, slots=True)
class Workload:
    input_tokens: int
    output_tokens: int

    @property
    def context(self) -> int:
        return self.input_tokens + self.output_tokens
