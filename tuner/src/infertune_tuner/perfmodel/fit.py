"""The calibration: which factors are fitted to which points, the objective, and the fit's last,
deterministic phase. `benchmarks/calibrate.py` runs the whole fit (a global search from fixed
starts, then `polish`) and writes `fitted.py`; the tests re-run `polish` from the committed
factors and require it to stop where it starts, so the committed factors are exactly a point the
script's fit ends on.

Per stack, each fitted GPU generation gets its own bandwidth/compute fractions (`PER_GENERATION`)
and the stack's generations share the link and fixed costs (`SHARED`). Objective: squared log
error of every throughput (and, for closed-loop points, E2E latency), squared log error of every
FP8/FP16 speedup, a penalty for every pair of a source's points on one GPU that the prediction
orders against the published order (pairs closer than `TIE` count as ties), and a weak pull of
each factor towards a plausible prior value (`PRIOR`) so the optimum is unique even where the
points do not pin a factor down (the seven points of the 2023 sweep against twelve factors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.metrics import E2E
from infertune_tuner.perfmodel import perf_overview, quant_speedups, reference
from infertune_tuner.perfmodel.factors import Efficiency
from infertune_tuner.perfmodel.fitted import FITTED
from infertune_tuner.perfmodel.points import Point, SpeedupPoint

PER_GENERATION: dict[str, tuple[float, float]] = {
    "weight_bw": (0.3, 0.95),
    "kv_bw": (0.1, 0.95),
    "gemm": (0.05, 0.9),
    "prefill": (0.1, 0.9),
}
SHARED: dict[str, tuple[float, float]] = {
    "link": (0.2, 0.95),
    "allreduce_latency_us": (1.0, 60.0),
    "step_overhead_ms": (0.1, 12.0),
    "per_seq_overhead_us": (0.1, 80.0),
    "context_step_overhead_ms": (0.01, 30.0),
    "host_overlap": (0.01, 1.0),
    "low_precision": (0.4, 1.0),
}
# Where the ridge pulls: a well-tuned stack on any generation (not a measurement).
PRIOR: dict[str, float] = {
    "weight_bw": 0.8, "kv_bw": 0.6, "gemm": 0.5, "prefill": 0.6,
    "link": 0.6, "allreduce_latency_us": 10.0, "step_overhead_ms": 2.0, "per_seq_overhead_us": 5.0,
    "context_step_overhead_ms": 2.0, "host_overlap": 0.5, "low_precision": 0.8,
}  # fmt: skip
SPEEDUP_WEIGHT = 4.0  # few points, but they carry the quantization x batch shape
TIE = 0.05  # published values closer than this are a tie for the ranking
RIDGE = 1e-2
DIGITS = 4  # significant digits of a committed factor
STEPS = (0.05, 0.02, 0.01, 0.005, 0.002, 0.001)  # relative moves of the polish, coarse to fine

ALL_POINTS: tuple[Point, ...] = (
    *reference.POINTS, *perf_overview.POINTS, *quant_speedups.POINTS,
)  # fmt: skip


def round_sig(value: float, digits: int = DIGITS) -> float:
    return float(f"{value:.{digits}g}")


def generation(point: Point) -> str:
    return get_gpu(point.gpu).architecture


@dataclass(frozen=True)
class StackFit:
    stack: str
    generations: tuple[str, ...]
    fixed: tuple[tuple[str, float], ...] = ()  # shared factors held at a value, not fitted

    @cached_property
    def points(self) -> tuple[Point, ...]:
        return tuple(p for p in ALL_POINTS if p.source.stack == self.stack)

    @cached_property
    def fitted_points(self) -> tuple[Point, ...]:
        return tuple(p for p in self.points if p.source.role == "fit")

    @cached_property
    def names(self) -> tuple[str, ...]:
        per = tuple(f"{g}.{k}" for g in self.generations for k in PER_GENERATION)
        held = dict(self.fixed)
        return per + tuple(k for k in SHARED if k not in held)

    @cached_property
    def bounds(self) -> tuple[tuple[float, float], ...]:
        return tuple(SHARED.get(n) or PER_GENERATION[n.split(".", 1)[1]] for n in self.names)

    def factors(self, x: Sequence[float]) -> dict[str, Efficiency]:
        values = dict(self.fixed) | dict(zip(self.names, x, strict=True))
        shared = {k: values[k] for k in SHARED}
        return {
            g: Efficiency(**{k: values[f"{g}.{k}"] for k in PER_GENERATION}, **shared)
            for g in self.generations
        }

    def committed(self) -> tuple[float, ...]:
        """The factors in fitted.py, in `names` order."""
        table = FITTED[self.stack]
        out = []
        for n in self.names:
            g, _, k = n.rpartition(".")
            out.append(table[g or "shared"][k])
        return tuple(out)

    def table(self, x: Sequence[float]) -> dict[str, dict[str, float]]:
        """fitted.py's entry for this stack: the shared factors, then each generation's own."""
        effs = self.factors(x)
        first = effs[self.generations[0]]
        return {"shared": {k: getattr(first, k) for k in SHARED}} | {
            g: {k: getattr(e, k) for k in PER_GENERATION} for g, e in effs.items()
        }

    def loss(self, x: Sequence[float]) -> float:
        effs = self.factors(x)
        total = 0.0
        series: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for p in self.fitted_points:
            eff = effs[generation(p)]
            if isinstance(p, SpeedupPoint):
                total += SPEEDUP_WEIGHT * math.log(p.predict(eff) / p.speedup) ** 2
                continue
            pred = p.predict(eff)
            if pred is None:
                total += 25.0  # predicted not to fit at all: as bad as a 150x miss
                continue
            got = pred.output_tokens_per_s_per_gpu
            total += math.log(got / p.tokens_per_s_per_gpu) ** 2
            if p.published_latency_ms is not None:
                total += math.log(E2E.of(pred).p50 / p.published_latency_ms) ** 2
            series.setdefault((p.source.key, p.gpu), []).append((p.tokens_per_s_per_gpu, got))
        for pairs in series.values():
            total += sum(0.05 + math.log(b / a) ** 2 for _, a, b in discordant(pairs))
        for v, name in zip(x, self.names, strict=True):
            total += RIDGE * math.log(v / PRIOR[name.rpartition(".")[2]]) ** 2
        return total

    def polish(self, x: Sequence[float], steps: Sequence[float] = STEPS) -> tuple[float, ...]:
        """Coordinate pattern search on the committed-digits lattice: from each step size down,
        move one factor by +-step (rounded, inside its bounds) while that lowers the loss."""
        best = tuple(_clip(round_sig(v), b) for v, b in zip(x, self.bounds, strict=True))
        best_loss = self.loss(best)
        for step in steps:
            improved = True
            while improved:
                improved = False
                for i, (lo, hi) in enumerate(self.bounds):
                    for sign in (1.0, -1.0):
                        v = _clip(round_sig(best[i] * (1 + sign * step)), (lo, hi))
                        if v == best[i]:
                            continue
                        cand = (*best[:i], v, *best[i + 1 :])
                        cand_loss = self.loss(cand)
                        if cand_loss < best_loss:
                            best, best_loss, improved = cand, cand_loss, True
        return best


def discordant(pairs: Sequence[tuple[float, float]]) -> list[tuple[int, float, float]]:
    """(index, predicted of the published-higher point, predicted of the published-lower point)
    for every pair the prediction orders against the published order (ties excepted)."""
    out = []
    for i, (pub_a, got_a) in enumerate(pairs):
        for pub_b, got_b in pairs:
            if pub_a > pub_b * (1 + TIE) and got_a <= got_b:
                out.append((i, got_a, got_b))
    return out


def _clip(v: float, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return min(max(v, lo), hi)


FITS: dict[str, StackFit] = {
    "trtllm-1.2": StackFit("trtllm-1.2", ("hopper", "blackwell")),
    # Engine builds ran each step as one prebuilt TensorRT engine, host work strictly between
    # steps: no separate cost for steps with prefills, no host/GPU overlap.
    "trtllm-0.5": StackFit(
        "trtllm-0.5", ("hopper", "ampere"),
        (("context_step_overhead_ms", 0.0), ("host_overlap", 0.0)),
    ),
}  # fmt: skip
