"""Achieved-efficiency factors: the fraction of datasheet peak a serving stack reaches.

The factors belong to a *stack* (a TensorRT-LLM generation) and a GPU generation, never to one
configuration. `benchmarks/calibrate.py` fits them to published measurements and writes them to
`fitted.py`; docs/performance-model.md lists the sources, the fit and its residuals.

- `trtllm-1.2` (the default): TensorRT-LLM 1.x on the PyTorch backend, what infertune deploys
  (Triton 26.0x ships TensorRT-LLM 1.2). Fitted to the TensorRT-LLM perf-overview tables: Hopper
  on H100 SXM (releases 1.0.0 / 1.1.0), Blackwell on B200 (release/1.2), and to the published
  FP8-vs-FP16 speedups by batch size on H100 (the only 16-bit contrast there is).
- `trtllm-0.5`: TensorRT-LLM v0.5 (2023, engine builds on the C++ runtime), the stack of the
  public Llama-2-70B A100/H100 sweep. Kept so old measurements can be compared under the stack
  that made them.

A GPU generation a stack was not measured on borrows another's factors (`BORROWED`); the tuner
refits a correction from its own trials anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infertune_tuner.errors import InputError
from infertune_tuner.perfmodel.fitted import FITTED


@dataclass(frozen=True, slots=True)
class Efficiency:
    weight_bw: float  # fraction of HBM bandwidth reached streaming weights in decode
    kv_bw: float  # fraction of HBM bandwidth reached reading the KV cache in attention
    gemm: float  # fraction of tensor-core peak in decode GEMMs
    prefill: float  # fraction of tensor-core peak in prefill
    link: float  # fraction of link bandwidth reached by all-reduce
    allreduce_latency_us: float  # fixed cost of one all-reduce (launch + sync)
    step_overhead_ms: float  # scheduler, sampling, launch gaps per engine step
    per_seq_overhead_us: float  # per active sequence per step (sampling, detokenisation)
    # Extra per step that carries prefills (eager, no CUDA graph); 0 for stacks fitted without it.
    context_step_overhead_ms: float = 0.0
    # Share of the host's per-step work hidden under the GPU's (an overlap scheduler); 0: none.
    host_overlap: float = 0.0
    # 8/4-bit tensor-core paths reach this share of their peak relative to the 16-bit path's.
    low_precision: float = 1.0

    def scaled(self, **factors: float) -> Efficiency:
        """A copy with fields multiplied by the given factors (used for perturbed truths)."""
        return replace(self, **{k: getattr(self, k) * v for k, v in factors.items()})


DEFAULT_STACK = "trtllm-1.2"

STACKS: dict[str, str] = {
    "trtllm-1.2": "TensorRT-LLM 1.x, PyTorch backend (what infertune deploys)",
    "trtllm-0.5": "TensorRT-LLM v0.5 engine builds, C++ runtime (2023; the Llama-2-70B sweep)",
}

# Per stack: which measured generation's factors an unmeasured generation uses.
BORROWED: dict[str, dict[str, str]] = {
    "trtllm-1.2": {
        "hopper": "hopper", "blackwell": "blackwell",
        "ampere": "hopper", "ada": "hopper", "turing": "hopper",
    },
    "trtllm-0.5": {
        "hopper": "hopper", "ampere": "ampere",
        "ada": "ampere", "turing": "ampere", "blackwell": "hopper",
    },
}  # fmt: skip


def check_stack(stack: str) -> str:
    if stack not in STACKS:
        raise InputError(f"unknown stack {stack!r}; known: {', '.join(STACKS)}")
    return stack


def calibrated(stack: str, architecture: str) -> bool:
    """Whether the stack's factors for this GPU generation were fitted, not borrowed."""
    return BORROWED[check_stack(stack)][architecture] == architecture


_BY_STACK: dict[str, dict[str, Efficiency]] = {
    stack: {
        arch: Efficiency(**FITTED[stack]["shared"], **FITTED[stack][gen])
        for arch, gen in BORROWED[stack].items()
    }
    for stack in STACKS
}


def default_efficiency(architecture: str, stack: str = DEFAULT_STACK) -> Efficiency:
    try:
        return _BY_STACK[stack][architecture]
    except KeyError:
        check_stack(stack)
        raise
