"""GPU catalog: public datasheet figures.

Throughputs are *dense* tensor-core TFLOPS (sparsity excluded). Memory is what the driver reports
as usable (GiB), slightly below the marketing figure. Link bandwidth is per direction per GPU:
NVLink 3/4/5 = 300/450/900 GB/s; PCIe Gen4/Gen5 x16 = ~25/~50 GB/s achieved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infertune_tuner.errors import InputError

Architecture = Literal["turing", "ampere", "ada", "hopper", "blackwell"]


@dataclass(frozen=True, slots=True)
class Gpu:
    key: str
    name: str
    architecture: Architecture
    memory_gib: float
    hbm_bandwidth_gbs: float
    bf16_tflops: float  # fp16 on Turing, which has no bf16
    fp8_tflops: float | None
    fp4_tflops: float | None
    int8_tops: float
    link: Literal["nvlink", "pcie"]
    link_bandwidth_gbs: float
    link_latency_us: float
    product_labels: tuple[str, ...]
    quantizations: frozenset[str]
    kv_dtypes: frozenset[str]

    def tflops(self, path: str) -> float:
        if path == "fp4" and self.fp4_tflops:
            return self.fp4_tflops
        if path in ("fp8", "fp4") and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


_AMPERE_Q = frozenset({"bf16", "fp16", "w4a16_awq"})
_ADA_HOPPER_Q = frozenset({"bf16", "fp16", "fp8", "w4a16_awq", "w4a8_awq"})
_BLACKWELL_Q = frozenset({"bf16", "fp16", "fp8", "w4a16_awq", "nvfp4"})
_KV_16 = frozenset({"auto"})
_KV_FP8 = frozenset({"auto", "fp8"})

_NVLINK3 = ("nvlink", 300.0, 8.0)
_NVLINK4 = ("nvlink", 450.0, 6.0)
_NVLINK5 = ("nvlink", 900.0, 5.0)
_PCIE4 = ("pcie", 25.0, 15.0)
_PCIE5 = ("pcie", 50.0, 12.0)


def _gpu(
    key: str,
    name: str,
    arch: Architecture,
    mem: float,
    bw: float,
    bf16: float,
    fp8: float | None,
    fp4: float | None,
    int8: float,
    link: tuple[str, float, float],
    labels: tuple[str, ...],
    quants: frozenset[str],
    kv: frozenset[str],
) -> Gpu:
    kind, link_bw, link_lat = link
    return Gpu(
        key, name, arch, mem, bw, bf16, fp8, fp4, int8,
        "nvlink" if kind == "nvlink" else "pcie", link_bw, link_lat, labels, quants, kv,
    )  # fmt: skip


# fmt: off
# key               name                      arch        GiB    GB/s  bf16  fp8   fp4   int8  link
GPUS: dict[str, Gpu] = {g.key: g for g in (
    _gpu("T4-16GB",        "NVIDIA T4",               "turing",    15.0,  320,   65, None, None,  130, _PCIE4,
         ("Tesla-T4", "NVIDIA-T4"), frozenset({"fp16"}), _KV_16),
    _gpu("A10-24GB",       "NVIDIA A10",              "ampere",    22.0,  600,  125, None, None,  250, _PCIE4,
         ("NVIDIA-A10",), _AMPERE_Q, _KV_16),
    _gpu("L4-24GB",        "NVIDIA L4",               "ada",       22.0,  300,  121,  242, None,  242, _PCIE4,
         ("NVIDIA-L4",), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("L40S-48GB",      "NVIDIA L40S",             "ada",       44.4,  864,  362,  733, None,  733, _PCIE4,
         ("NVIDIA-L40S",), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("A100-SXM-40GB",  "NVIDIA A100-SXM4-40GB",   "ampere",    39.4, 1555,  312, None, None,  624, _NVLINK3,
         ("NVIDIA-A100-SXM4-40GB",), _AMPERE_Q, _KV_16),
    _gpu("A100-SXM-80GB",  "NVIDIA A100-SXM4-80GB",   "ampere",    79.2, 2039,  312, None, None,  624, _NVLINK3,
         ("NVIDIA-A100-SXM4-80GB",), _AMPERE_Q, _KV_16),
    _gpu("H100-SXM-80GB",  "NVIDIA H100 80GB HBM3",   "hopper",    79.6, 3350,  989, 1979, None, 1979, _NVLINK4,
         ("NVIDIA-H100-80GB-HBM3",), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("H100-PCIE-80GB", "NVIDIA H100 PCIe",        "hopper",    79.6, 2000,  756, 1513, None, 1513, _PCIE5,
         ("NVIDIA-H100-PCIe",), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("H200-SXM-141GB", "NVIDIA H200",             "hopper",   139.8, 4800,  989, 1979, None, 1979, _NVLINK4,
         ("NVIDIA-H200",), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("GH200-96GB",     "NVIDIA GH200 96GB HBM3",  "hopper",    95.0, 4000,  989, 1979, None, 1979, _NVLINK4,
         ("NVIDIA-GH200-480GB", "NVIDIA-GH200-96GB-HBM3"), _ADA_HOPPER_Q, _KV_FP8),
    _gpu("B200-SXM-192GB", "NVIDIA B200",             "blackwell", 179.0, 8000, 2250, 4500, 9000, 4500, _NVLINK5,
         ("NVIDIA-B200",), _BLACKWELL_Q, _KV_FP8),
)}
# fmt: on


def get_gpu(key: str) -> Gpu:
    """Look a GPU up by catalog key or by its `nvidia.com/gpu.product` label (case-insensitive)."""
    if key in GPUS:
        return GPUS[key]
    low = key.lower()
    for gpu in GPUS.values():
        if gpu.key.lower() == low or low in (lbl.lower() for lbl in gpu.product_labels):
            return gpu
    raise InputError(f"unknown GPU {key!r}; known: {', '.join(GPUS)}")
