"""The point the tuner searches over, and the workload it is measured under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

CONFIG_KEYS = ("tp", "max_batch_size", "quantization", "kv_cache_dtype")
GPU_KEY = "gpu"  # the pool dimension: a parameter only where the request lists several pools
PARAM_KEYS = (*CONFIG_KEYS, GPU_KEY)
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
    # The GPU pool (a catalog product) it runs on when the request lists several pools
    # (`spec.gpu.pools`); "" on a one-pool request, whose configurations are as they always were
    # (same parameters, same study, same report).
    gpu: str = ""

    def as_dict(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {
            "tp": self.tp,
            "max_batch_size": self.max_batch_size,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
        if self.gpu:
            out[GPU_KEY] = self.gpu
        return out

    def label(self) -> str:
        own = f"tp{self.tp}/bs{self.max_batch_size}/{self.quantization}/kv-{self.kv_cache_dtype}"
        return f"{self.gpu}/{own}" if self.gpu else own


@dataclass(frozen=True, slots=True)
class Workload:
    input_tokens: int
    output_tokens: int

    @property
    def context(self) -> int:
        return self.input_tokens + self.output_tokens
