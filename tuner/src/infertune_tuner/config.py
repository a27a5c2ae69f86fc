"""The point the tuner searches over, and the workload it is measured under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

CONFIG_KEYS = ("tp", "max_batch_size", "quantization", "kv_cache_dtype")
# No engine runs more sequences at once; beyond it a number is a typo, not a configuration.
MAX_BATCH_SIZE_LIMIT = 65536

# The values of the two precision dimensions (the catalog's QUANTIZATIONS and KV_DTYPE_BYTES
# describe each; the API's enums and the CLI's choices come from these).
Quantization = Literal["bf16", "fp16", "fp8", "w4a16_awq", "w4a8_awq", "nvfp4"]
KvCacheDtype = Literal["auto", "fp8"]
QUANTIZATION_VALUES: tuple[str, ...] = get_args(Quantization)
KV_CACHE_DTYPE_VALUES: tuple[str, ...] = get_args(KvCacheDtype)


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
