"""Structural coverage: no confident stop while a TP size or quantization that could hold the
optimum has never been measured.

The posterior (model.py) carries what it learned where the run measured to where it did not.
That is its job, and it is also how a search becomes confidently wrong: a model that is visibly
2x off where it was measured cannot be trusted to 20 % at a TP size or quantization it never
saw. So before the search may stop on its posterior, every *structure* (each tensor-parallel
size, each weight quantization of the space) that could hold the optimum gets at least one valid
measurement near its predicted best - unless memory or physics rules it out outright.

"Could hold the optimum" is judged under the model error the run has seen, never assumed below
`floor` (the disagreement between two calibrated stacks, SearchSettings.coverage_floor): with
E = max(floor, the largest |log(measured / predicted)| of the run's valid measurements), a
candidate could beat the incumbent when

- its predicted tok/s/GPU, moved by the incumbent's own error and then by E in its favour,
  beats the incumbent by more than the improvement that counts;
- each bounded latency meets the bound in that same world: a latency Little's law ties to
  tok/s/GPU (E2E, ITL: residuals.tie) moves with the tok/s/GPU error assumed above, plus the
  median of its own part and the largest departure of its own part the run has seen; any other
  latency (TTFT) is moved by the median error measured for its bound and then by E in its
  favour. (Moving a tied latency on its own, by the median over the run's measurements, left a
  TP size whose measured E2E was 30 % shorter than the model's written off: the development
  world synthetic-04, where that TP size held the optimum.)
- the physical decode bound (plausibility.py) lets it beat the incumbent at all.

The target of a structure is its predicted best: of its candidates that could win, the one the
model predicts the most tok/s/GPU for. The structure is covered when the target was measured, or
a configuration of the structure within a factor 2 of the target's batch was measured (validly)
and either met every SLO bound or ran a batch no larger than the target's: a larger neighbour
that missed says where the structure stops working, not how well it works below that. A
structure gets at most `max_covers` coverage measurements (SearchSettings).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound
from infertune_tuner.search.evidence import twins

Dimension = Literal["tp", "quantization"]
# A measurement of the structure within this factor of the target's batch covers it: half a unit
# of the posterior's batch feature. A factor 4 (one unit) let one measurement at batch 64 cover
# batch 192, where the pool was 29 % faster than the posterior believed (±6 %) and held the
# optimum (development world synthetic-04: 3 of 5 seeds shipped 90 % of it at 97-99 %
# confidence).
NEAR_LOG = math.log(2.0)


@dataclass(frozen=True, order=True)
class Structure:
    """One tensor-parallel size or one weight quantization of the space."""

    dimension: Dimension
    value: str  # "4", "fp8", or twins such as "bf16/fp16"

    @classmethod
    def of(cls, cfg: TrialConfig) -> tuple[Structure, Structure]:
        # bf16 and fp16 weights are one structure (evidence.twins): a measurement of either
        # shows how the other runs. (Two structures sent a search to "cover" fp16 at batch 48
        # after bf16 at batch 24, same TP, had missed ITL by half: mixed mistral7b/A10 chat.)
        return cls("tp", str(cfg.tp)), cls("quantization", twins(cfg.quantization))

    def holds(self, cfg: TrialConfig) -> bool:
        return self in Structure.of(cfg)

    def label(self) -> str:
        return f"TP{self.value}" if self.dimension == "tp" else self.value


@dataclass(frozen=True)
class Gap:
    """A structure that could hold the optimum and has no valid measurement near its target."""

    structure: Structure
    target: TrialConfig


@dataclass(frozen=True)
class CoverageInput:
    """What the rule needs of a run (all pure data; the planner builds it)."""

    universe: Sequence[TrialConfig]  # configurations not ruled out by memory outright
    candidates: Sequence[TrialConfig]  # untried candidates (classify.py)
    valid: frozenset[TrialConfig]  # configurations with a valid measurement
    feasible: frozenset[TrialConfig]  # those that met every SLO bound
    residuals: Mapping[str, Mapping[TrialConfig, float]]  # 'tps' / bound key -> cfg -> log err
    # Per bound key, the part of its log error not tied to tok/s/GPU (residuals.Residuals.own).
    own: Mapping[str, Mapping[TrialConfig, float]]
    incumbent: TrialConfig | None
    incumbent_tps: float
    priors: Mapping[TrialConfig, Prediction]
    # key, bound, predicted, and the tie to the tok/s/GPU error (residuals.tie; 0: none)
    bounds: Sequence[tuple[str, SloBound, Callable[[Prediction], float], float]]
    decode_bound: Callable[[TrialConfig], float]
    covers: Sequence[TrialConfig] = ()  # configurations measured to cover a structure


def model_error(residuals: Mapping[TrialConfig, float], floor: float) -> float:
    """The error to allow: the largest |log(measured / predicted)| seen, at least `floor`."""
    return max([floor, *(abs(y) for y in residuals.values())])


def could_win(cfg: TrialConfig, data: CoverageInput, floor: float, improvement: float) -> bool:
    """Whether `cfg` could beat the incumbent under the model error the run has seen."""
    p = data.priors[cfg]
    shift: float | None = None  # the tok/s/GPU log error of the world considered
    if data.incumbent is not None:
        need = math.log(data.incumbent_tps * (1 + improvement))
        tps = data.residuals.get("tps", {})
        shift = tps.get(data.incumbent, 0.0) + model_error(tps, floor)
        if math.log(p.output_tokens_per_s_per_gpu) + shift <= need:
            return False
        if data.decode_bound(cfg) <= data.incumbent_tps * (1 + improvement):
            return False
    for key, bound, predicted, tie in data.bounds:
        seen = data.residuals.get(key, {})
        own = list(data.own.get(key, {}).values())
        if tie and shift is not None and own:
            center = statistics.median(own)
            error = tie * shift + center - max(abs(v - center) for v in own)
        else:
            center = statistics.median(seen.values()) if seen else 0.0
            error = center - model_error(seen, floor)
        if math.log(max(predicted(p), 1e-9)) + error > math.log(bound.max_ms):
            return False
    return True


def gaps(data: CoverageInput, *, floor: float, improvement: float, max_covers: int) -> list[Gap]:
    """Every structure that could hold the optimum and is not covered, with its target.

    Args:
        data: The run's evidence and candidates.
        floor: The least model error to allow (log scale).
        improvement: The gain over the incumbent that counts (0.02: 2 %).
        max_covers: Coverage measurements per structure, at most.

    Returns:
        The gaps, the most promising target first.
    """
    structures = sorted({s for c in data.universe for s in Structure.of(c)})

    def predicted(c: TrialConfig) -> float:
        return data.priors[c].output_tokens_per_s_per_gpu

    out = []
    for s in structures:
        if len({t.value for t in structures if t.dimension == s.dimension}) < 2:
            continue  # the only TP (quantization) of the space: nothing to compare it with
        if sum(1 for c in data.covers if s.holds(c)) >= max_covers:
            continue  # covered as far as the rule goes: the posterior judges the rest
        contenders = [
            c for c in data.candidates if s.holds(c) and could_win(c, data, floor, improvement)
        ]
        if not contenders:
            continue
        target = max(contenders, key=lambda c: (predicted(c), c))
        near = any(
            s.holds(m)
            and abs(math.log(m.max_batch_size / target.max_batch_size)) <= NEAR_LOG + 1e-9
            and (m in data.feasible or m.max_batch_size <= target.max_batch_size)
            for m in data.valid
        )
        if target not in data.valid and not near:
            out.append(Gap(s, target))
    return sorted(out, key=lambda g: (predicted(g.target), g.target), reverse=True)
