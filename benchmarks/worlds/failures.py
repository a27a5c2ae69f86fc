"""Failures by structure, and transient ones: what the `failing` worlds fail with, and how.

Real pools do not only run slow or out of memory: whole structures of a space fail to start,
every configuration inside them with the same error. A `failing` world (``WorldBackend(request,
"failing", seed=...)``) is the `mixed` world of the same scenario and seed (the same physics,
the same runs where it runs) plus one failure form, drawn per (scenario, seed) from:

- `quantization`: one weight quantization fails at load (not the space's only one; a 4-bit or
  FP8 one, which the performance model likes, where the space has one): a kernel missing for it
  on the GPU's architecture;
- `tp`: the largest tensor-parallel size fails at start (NCCL cannot set up its communicator);
- `pair`: FP8 weights with the FP8 KV cache (an attention backend without FP8 KV support), or,
  where the space lacks them, an AWQ quantization with tensor parallel (its checkpoint is not
  sharded);
- `batch`: max batch sizes above a build-time limit fail at load, whatever the structure;
- `isolated`: two or three single configurations fail while measuring (an illegal memory
  access), sharing no structure: nothing to learn from them but themselves.

Every failure is a ``Measurement.failed("error", reason, phase)`` with the error line a real
stack prints and the phase it happens in. A form is kept only where configurations that run
still meet the SLO with room (the truth, and so the optimum, is what runs); otherwise the next
form is tried. A world declares its failing structures (`FailureForm.structures`, each a
`Structure`): the benchmark counts the failed trials a search spends inside them.

`structures_of` derives the failing structures of a replay table whose rows say only `error`
(benchmarks/dev-worlds/failing-*.csv). `Transient` makes any trial fail now and then with a
transient error (a server not ready in time, a lost connection, an evicted pod) that does not
repeat on the configuration's next run.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.catalog.gpus import Gpu
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement, TrialPhase

FAILING = "failing"  # the world family
PHYSICS = "mixed"  # the family whose physics a failing world has
FORMS = ("quantization", "tp", "pair", "batch", "isolated")
SIXTEEN_BIT = frozenset({"bf16", "fp16"})
# Room every bound keeps on some configuration that runs: beyond any resolution zone the
# benchmark draws around the bounds (worldset.truth_of probes those within 0.25).
ROOM = 0.25
T = TypeVar("T")

_MODE = {  # how TensorRT-LLM names a quantization's mode, and the GEMM that runs it
    "w4a16_awq": ("W4A16 AWQ", "weightOnlyGemm"),
    "w4a8_awq": ("W4A8 AWQ", "fp8RowwiseGemm"),
    "fp8": ("FP8", "fp8RowwiseGemm"),
    "nvfp4": ("NVFP4", "fp4Gemm"),
    "bf16": ("BF16", "cublasGemm"),
    "fp16": ("FP16", "cublasGemm"),
}
_SM = {"turing": 75, "ampere": 80, "ada": 89, "hopper": 90, "blackwell": 100}
NCCL = (
    "NCCL error in: /src/nccl/init.cc:1234, unhandled system error (run with NCCL_DEBUG=INFO "
    "for details)"
)
FP8_KV = "[TensorRT-LLM][ERROR] FP8 KV cache is not supported with this attention backend"
AWQ_TP = (
    "ValueError: the {quant} checkpoint's AWQ scales are not sharded for tensor parallel size {tp}"
)
BATCH = "RuntimeError: max_batch_size {batch} exceeds the engine's build-time limit of {limit}"
ILLEGAL = "CUDA error: an illegal memory access was encountered"
# Transient failures (the signature table calls them so): the configuration's next run may pass.
TRANSIENT: tuple[tuple[str, TrialPhase], ...] = (
    ("the server was not ready after 1800 s", "loading model"),
    ("rpc error: code = Unavailable desc = connection reset by peer", "measuring"),
    (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi.",
        "measuring",
    ),
    ("pod evicted: node lost", "loading model"),
)


def _uniform(*parts: object) -> float:
    """A deterministic draw in [0, 1) per `parts`."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _pick(items: Sequence[T], *parts: object) -> T:
    return items[int(_uniform(*parts) * len(items))]


@dataclass(frozen=True)
class Structure:
    """Configurations that fail together: those matching every field that is set (None: any),
    with a max batch of at least `min_batch`. All four configuration fields set: one isolated
    configuration."""

    quantization: str | None = None
    kv_cache_dtype: str | None = None
    tp: int | None = None
    max_batch_size: int | None = None
    min_batch: int | None = None

    @classmethod
    def single(cls, cfg: TrialConfig) -> Structure:
        return cls(cfg.quantization, cfg.kv_cache_dtype, cfg.tp, cfg.max_batch_size)

    def contains(self, cfg: TrialConfig) -> bool:
        return (
            self.quantization in (None, cfg.quantization)
            and self.kv_cache_dtype in (None, cfg.kv_cache_dtype)
            and self.tp in (None, cfg.tp)
            and self.max_batch_size in (None, cfg.max_batch_size)
            and (self.min_batch is None or cfg.max_batch_size >= self.min_batch)
        )

    def within(self, other: Structure) -> bool:
        """Whether every configuration this names, `other` names too (as a rule)."""
        fields = ("quantization", "kv_cache_dtype", "tp", "max_batch_size")
        same = all(getattr(other, f) in (None, getattr(self, f)) for f in fields)
        least = self.min_batch or self.max_batch_size or 0
        return same and (other.min_batch is None or least >= other.min_batch)

    def label(self) -> str:
        if self.max_batch_size is not None and None not in (
            self.quantization, self.kv_cache_dtype, self.tp
        ):  # fmt: skip
            return (
                f"tp{self.tp}/bs{self.max_batch_size}/{self.quantization}/kv-{self.kv_cache_dtype}"
            )
        parts = [
            *([self.quantization] if self.quantization else []),
            *([f"KV {self.kv_cache_dtype}"] if self.kv_cache_dtype else []),
            *([f"TP {self.tp}"] if self.tp else []),
            *([f"batch {self.max_batch_size}"] if self.max_batch_size else []),
            *([f"batch >= {self.min_batch}"] if self.min_batch else []),
        ]
        return " + ".join(parts) or "everything"


@dataclass(frozen=True)
class Failure:
    """Every configuration in `structure` fails with `reason` (a template: {batch}, {tp} and
    {quant} are the configuration's) in `phase`."""

    structure: Structure
    reason: str
    phase: TrialPhase

    def measurement(self, cfg: TrialConfig) -> Measurement:
        text = self.reason.format(batch=cfg.max_batch_size, tp=cfg.tp, quant=cfg.quantization)
        return Measurement.failed("error", text, self.phase)


@dataclass(frozen=True)
class FailureForm:
    """One world's failures: its form (one of FORMS) and the rules that make configurations
    fail, each over one failing structure."""

    kind: str
    failures: tuple[Failure, ...]

    @property
    def structures(self) -> tuple[Structure, ...]:
        return tuple(f.structure for f in self.failures)

    def failure(self, cfg: TrialConfig) -> Measurement | None:
        """How `cfg` fails in this world (None: it runs)."""
        for f in self.failures:
            if f.structure.contains(cfg):
                return f.measurement(cfg)
        return None

    def fails(self, cfg: TrialConfig) -> bool:
        return any(f.structure.contains(cfg) for f in self.failures)


def _quantization(configs: list[TrialConfig], gpu: Gpu, key: str) -> FailureForm | None:
    quants = sorted({c.quantization for c in configs})
    if len(quants) < 2:
        return None
    liked = [q for q in quants if q not in SIXTEEN_BIT] or quants[1:]
    quant = _pick(liked, "quantization", key)
    mode, gemm = _MODE.get(quant, (quant.upper(), "gemm"))
    sm = 86 if gpu.key.startswith(("A10-", "A40")) else _SM[gpu.architecture]
    reason = (
        f"[TensorRT-LLM][ERROR] Assertion failed: Unsupported quantization mode for {mode} on "
        f"SM{sm} ({gemm})"
    )
    return FailureForm(
        "quantization", (Failure(Structure(quantization=quant), reason, "loading model"),)
    )


def _tp(configs: list[TrialConfig]) -> FailureForm | None:
    tps = sorted({c.tp for c in configs})
    if len(tps) < 2:
        return None
    return FailureForm("tp", (Failure(Structure(tp=tps[-1]), NCCL, "loading model"),))


def _pair(configs: list[TrialConfig]) -> FailureForm | None:
    quants = {c.quantization for c in configs}
    if any(c.quantization == "fp8" and c.kv_cache_dtype == "fp8" for c in configs) and (
        len(quants) > 1 or len({c.kv_cache_dtype for c in configs}) > 1
    ):
        rule = Failure(Structure(quantization="fp8", kv_cache_dtype="fp8"), FP8_KV, "loading model")
        return FailureForm("pair", (rule,))
    awq = sorted(q for q in quants if q.endswith("_awq"))
    tps = sorted({c.tp for c in configs if c.tp > 1})
    if not awq or not tps or len(quants) < 2:
        return None
    rules = tuple(
        Failure(Structure(quantization=awq[0], tp=tp), AWQ_TP, "loading model") for tp in tps
    )
    return FailureForm("pair", rules)


def _batch(configs: list[TrialConfig], key: str) -> FailureForm | None:
    batches = sorted({c.max_batch_size for c in configs})
    if len(batches) < 3:
        return None
    # The limit: a batch in the upper half, so that the band above it is large batches.
    options = batches[len(batches) // 2 : -1]
    limit = _pick(options, "batch", key)
    above = batches[batches.index(limit) + 1]
    reason = BATCH.replace("{limit}", str(limit))
    return FailureForm("batch", (Failure(Structure(min_batch=above), reason, "loading model"),))


def _isolated(
    configs: list[TrialConfig], runs: Callable[[TrialConfig], bool], key: str
) -> FailureForm | None:
    """Two or three configurations that run, apart in every field the space lets them be."""
    quants = len({c.quantization for c in configs})
    kvs = len({c.kv_cache_dtype for c in configs})
    tps = len({c.tp for c in configs})
    want = 3 if min(quants, tps) >= 3 else 2
    chosen: list[TrialConfig] = []
    for c in sorted(configs, key=lambda c: _uniform("isolated", key, c.label())):
        apart = all(
            (quants < want or c.quantization != o.quantization)
            and (tps < want or c.tp != o.tp)
            and (kvs < want or c.kv_cache_dtype != o.kv_cache_dtype)
            and c.max_batch_size != o.max_batch_size
            for o in chosen
        )
        if apart and runs(c):
            chosen.append(c)
            if len(chosen) == want:
                break
    if len(chosen) < 2:
        return None
    return FailureForm(
        "isolated", tuple(Failure(Structure.single(c), ILLEGAL, "measuring") for c in chosen)
    )


def candidates(
    configs: list[TrialConfig], gpu: Gpu, key: str, runs: Callable[[TrialConfig], bool]
) -> list[FailureForm]:
    """Every form that applies to the space, in the order drawn for `key` (scenario and seed):
    the first is the world's unless it leaves nothing that runs within the SLO."""
    start = int(_uniform("form", key) * len(FORMS))
    out = []
    for kind in FORMS[start:] + FORMS[:start]:
        if kind == "quantization":
            form = _quantization(configs, gpu, key)
        elif kind == "tp":
            form = _tp(configs)
        elif kind == "pair":
            form = _pair(configs)
        elif kind == "batch":
            form = _batch(configs, key)
        else:
            form = _isolated(configs, runs, key)
        if form is not None:
            out.append(form)
    return out


def choose(
    configs: list[TrialConfig],
    gpu: Gpu,
    key: str,
    margin: Callable[[TrialConfig], float | None],
) -> FailureForm:
    """The world's failure form: the first candidate after which some configuration that runs
    still meets every bound with ROOM to spare (or, where no configuration has that much, with
    the most any has). `margin`: a configuration's true worst relative room over the SLO bounds
    (None: it does not run)."""
    room = {c: m for c in configs if (m := margin(c)) is not None}
    need = min(ROOM, max(room.values(), default=0.0))
    forms = candidates(configs, gpu, key, lambda c: c in room)
    for form in forms:
        if any(m >= need and m > 0 for c, m in room.items() if not form.fails(c)):
            return form
    return forms[-1] if forms else FailureForm("none", ())


def structures_of(table: Mapping[TrialConfig, Measurement]) -> tuple[Structure, ...]:
    """The failing structures of a table: the largest groups among one quantization, KV dtype
    or TP size, a pair of them, and batches from some size up, whose configurations never ran
    and mostly failed with `error` (OOM rows inside a group are memory, which fails first
    where it does); the `error` rows outside every such group are isolated failures, each its
    own structure."""
    quants = sorted({c.quantization for c in table})
    kvs = sorted({c.kv_cache_dtype for c in table})
    tps = sorted({c.tp for c in table})
    batches = sorted({c.max_batch_size for c in table})
    groups = [
        *(Structure(quantization=q) for q in quants),
        *(Structure(kv_cache_dtype=k) for k in kvs),
        *(Structure(tp=t) for t in tps),
        *(Structure(quantization=q, kv_cache_dtype=k) for q, k in itertools.product(quants, kvs)),
        *(Structure(quantization=q, tp=t) for q, t in itertools.product(quants, tps)),
        *(Structure(kv_cache_dtype=k, tp=t) for k, t in itertools.product(kvs, tps)),
        *(Structure(min_batch=b) for b in batches[1:]),
    ]

    def failing(s: Structure) -> bool:
        status = Counter(m.status for c, m in table.items() if s.contains(c))
        return status["ok"] == 0 and status["error"] >= 2 and status["error"] > status["oom"]

    found = [s for s in groups if failing(s)]
    largest = [s for s in found if not any(o != s and s.within(o) for o in found)]
    isolated = [
        Structure.single(c)
        for c, m in table.items()
        if m.status == "error" and not any(s.contains(c) for s in largest)
    ]
    return (*largest, *sorted(isolated, key=Structure.label))


def inside(structures: Iterable[Structure], cfg: TrialConfig) -> int:
    """How many of `structures` hold `cfg` (a failed trial counts once per structure)."""
    return sum(1 for s in structures if s.contains(cfg))


class Transient:
    """A pool whose every run fails with probability `p` with a transient error (TRANSIENT),
    drawn per (world, configuration, its run count here); a run right after a transient failure
    of the same configuration never fails so, so measuring a configuration again after one
    succeeds. Deterministic per world and order of runs."""

    def __init__(self, inner: BenchmarkBackend, p: float, world: str) -> None:
        self.inner, self.p, self.world = inner, p, world
        self.name = inner.name
        self.speedup = inner.speedup
        self._runs: Counter[TrialConfig] = Counter()
        self._failed: set[TrialConfig] = set()

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        n = self._runs[config]
        self._runs[config] += 1
        if config in self._failed:
            self._failed.discard(config)
        elif _uniform("transient", self.world, config.label(), n) < self.p:
            self._failed.add(config)
            reason, phase = _pick(list(TRANSIENT), "which", self.world, config.label(), n)
            return Measurement.failed("error", reason, phase)
        return self.inner.run(config, repeat=repeat)

    def close(self) -> None:
        self.inner.close()
