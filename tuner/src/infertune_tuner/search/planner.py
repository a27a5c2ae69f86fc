"""The decision: what to measure next, or why the search stops (pure: no Optuna, no I/O).

It reads an `Assessment` (posterior.py) and nothing else:

- **explore** the candidate with the largest expected gain E[(tok/s/GPU - best x 1.02)+ x
  success] while P(an untried configuration beats the best by more than `improvement`) is at
  least `stop_probability`; once `confirm_incumbent_after` trials ran, a new incumbent is
  measured a second time first (a lucky first run would send the search after noise);
- **cover** every structure (TP size, weight quantization) that could still hold the optimum
  under the model error the run has seen and was never measured near its predicted best
  (`gaps`): the posterior's doubt rests on the model, and the model can be wrong about a whole
  structure;
- **confirm** the winner before declaring it (`confirmations`): the best, every finalist whose
  SLO margin is within run-to-run noise, every measured rival with a real chance of beating it,
  and contenders whose two runs disagree on a bound, measured again and judged on their typical
  run;
- **probe**: with nothing feasible measured, the configurations most likely to meet the SLO,
  `min_probes` of them, before concluding that none can (the prior may be what is wrong);
- **stop** (`stop_reason`, the one place that decides it, for every sampler): the posterior's
  verdict (converged, nothing plausibly meets the SLO, everything ruled out), the budget, set-up
  errors, or nothing left to propose.

Every constant is a field of `SearchSettings`, with its evidence.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from infertune_tuner.config import TrialConfig
from infertune_tuner.pools import beats
from infertune_tuner.result import Chances, ConfigOut
from infertune_tuner.search.evidence import Decision, Evidence
from infertune_tuner.search.failures import atoms
from infertune_tuner.search.posterior import TPS, Assessment, Prior, QuantityKey
from infertune_tuner.stop import StopKind, StopReason, aborted, budget

if TYPE_CHECKING:
    from infertune_tuner.search.settings import SearchSettings
    from infertune_tuner.space import SearchSpace

Purpose = Literal["explore", "confirm", "probe", "cover"]


# ------------------------------------------------------------------ coverage


@dataclass(frozen=True, order=True)
class Structure:
    """One tensor-parallel size or one weight quantization of the space. bf16 and fp16 weights
    are one structure (their twins' name): a measurement of either shows how the other runs."""

    dimension: Literal["tp", "quantization"]
    value: str  # "4", "fp8", or twins such as "bf16/fp16"

    @classmethod
    def of(cls, cfg: TrialConfig, prior: Prior) -> tuple[Structure, Structure]:
        # A measured configuration is of the study's space (its request names the study); one
        # outside it would stand for its own quantization. A pool is no structure to cover: the
        # posterior gives a pool of another architecture its own error, whole (its kernel's
        # pool coordinates), so what covering would guard against is in P(beats) already
        # (measured: covering pools too cost a median trial more, benchmarks/pool_tuning.py,
        # and found nothing more).
        tp, weights = prior.structure.get(cfg, (str(cfg.tp), cfg.quantization))
        return cls("tp", tp), cls("quantization", weights)

    def label(self) -> str:
        return f"TP{self.value}" if self.dimension == "tp" else self.value


@dataclass(frozen=True)
class Gap:
    """A structure that could hold the optimum and has no valid measurement near its target."""

    structure: Structure
    target: TrialConfig


def model_error(residuals: Mapping[TrialConfig, float], floor: float) -> float:
    """The error to allow: the largest |log(measured / predicted)| seen, at least `floor`."""
    return max([floor, *(abs(y) for y in residuals.values())])


def could_win(
    cfg: TrialConfig,
    prior: Prior,
    settings: SearchSettings,
    *,
    best: TrialConfig | None,
    best_tps: float,
    errors: Mapping[QuantityKey, Mapping[TrialConfig, float]],
    own_errors: Mapping[QuantityKey, Mapping[TrialConfig, float]],
) -> bool:
    """Whether `cfg` could beat the incumbent `best` under the model error the run has seen
    (`errors`: log(measured / predicted) per quantity and configuration; `own_errors`: a tied
    bound's part of its own), never assumed below `coverage_floor`: its predicted tok/s/GPU moved
    by the incumbent's own error and then by that error in its favour beats the incumbent by more
    than the improvement (and the decode bound allows it); and each bounded latency meets its
    bound in that same world (a latency Little's law ties to tok/s/GPU moves with it, plus the
    median of its own part and the largest departure of its own part the run has seen; TTFT by
    the median error measured for its bound and then by the model error in its favour)."""
    floor, improvement = settings.coverage_floor, settings.improvement
    shift: float | None = None  # the tok/s/GPU log error of the world considered
    if best is not None:
        need = math.log(best_tps * (1 + improvement))
        tps = errors.get(TPS, {})
        shift = tps.get(best, 0.0) + model_error(tps, floor)
        if math.log(prior.objective[cfg]) + shift <= need:
            return False
        if prior.decode_bound[cfg] * prior.worth[cfg] <= best_tps * (1 + improvement):
            return False
    for b in prior.bounds:
        seen = errors.get(b.key, {})
        own = list(own_errors.get(b.key, {}).values())
        if b.tie and shift is not None and own:
            center = statistics.median(own)
            error = b.tie * shift + center - max(abs(v - center) for v in own)
        else:
            center = statistics.median(seen.values()) if seen else 0.0
            error = center - model_error(seen, floor)
        if math.log(max(b.predicted[cfg], 1e-9)) + error > math.log(b.bound.max_ms):
            return False
    return True


def gaps(a: Assessment, prior: Prior, settings: SearchSettings) -> list[Gap]:
    """Every structure that could hold the optimum and is not covered, with its target (the
    candidate of the structure the model predicts the most tok/s/GPU for, among those that
    could win and more likely than not run), the most promising target first.

    A structure is covered when its target was measured, or a configuration of it within
    `cover_batch_factor` of the target's batch was measured validly and either met every bound
    or ran a batch no larger than the target's (a larger neighbour that missed says where the
    structure stops working, not how well it works below that); it gets at most `max_covers`
    coverage measurements. A space with one TP (one quantization) has nothing to compare."""
    ev = a.evidence
    valid = frozenset(o.config for o in a.residuals.observations[TPS])
    near_log = math.log(settings.cover_batch_factor)
    structures = sorted({s for c in prior.universe for s in Structure.of(c, prior)})
    out = []
    for s in structures:
        if len({t.value for t in structures if t.dimension == s.dimension}) < 2:
            continue  # the only TP (quantization) of the space: nothing to compare it with
        if sum(1 for c in ev.covers if s in Structure.of(c, prior)) >= settings.max_covers:
            continue  # covered as far as the rule goes: the posterior judges the rest
        contenders = [
            c for c in a.candidates
            if s in Structure.of(c, prior)
            and a.failures.p_runs.get(c, 1.0) >= settings.cover_min_runs
            and could_win(
                c, prior, settings, best=a.best, best_tps=a.best_tps,
                errors=a.residuals.by_config, own_errors=a.residuals.own_by_config,
            )
        ]  # fmt: skip
        if not contenders:
            continue
        target = max(contenders, key=lambda c: (prior.objective[c], c))
        near = any(
            s in Structure.of(m, prior)
            and abs(math.log(m.max_batch_size / target.max_batch_size)) <= near_log + 1e-9
            and (m in ev.feasible or m.max_batch_size <= target.max_batch_size)
            for m in valid
        )
        if target not in valid and not near:
            out.append(Gap(s, target))
    return sorted(out, key=lambda g: (prior.objective[g.target], g.target), reverse=True)


# ------------------------------------------------------------------ confirmations


def confirmations(
    ev: Evidence,
    best: TrialConfig,
    rivals: set[TrialConfig],
    settings: SearchSettings,
    doubted: set[TrialConfig] | None = None,
) -> list[TrialConfig]:
    """The configurations to measure again, the incumbent first.

    One run is one draw from a configuration's distribution. Before the search stops it
    measures again: the incumbent; every finalist within `improvement` of it whose SLO margin is
    within `confirm_margin`; every measured rival with a real chance (>= `stop_probability`) of
    beating it (`rivals`). A contender whose two runs disagree on an SLO bound is measured a
    third time: its typical run decides which side it is on. A rival the posterior holds more
    likely than not the better (`doubted`: its runs and the incumbent's disagree with what their
    neighbours say) and the incumbent are measured until each has `tie_repeats` runs. A
    configuration another worker is measuring again is confirmed there."""
    best_tps = ev.best_tps  # the objective: tok/s/GPU (x its pool's worth: pools.py)
    runs = ev.counts
    out = [best] if runs.get(best, 0) < 2 and best not in ev.in_flight else []
    for cfg in ev.feasible:
        if cfg == best or runs.get(cfg, 0) >= 2 or cfg in ev.in_flight:
            continue
        if cfg in rivals:
            out.append(cfg)
            continue
        if ev.values[cfg] * (1 + settings.improvement) < best_tps:
            continue
        if ev.room[cfg] < settings.confirm_margin:
            out.append(cfg)
    out += [c for c in straddlers(ev, best_tps, settings) if c not in out]
    if doubted:
        for cfg in [best, *sorted(doubted)]:
            short = runs.get(cfg, 0) < settings.tie_repeats
            if short and cfg not in out and cfg not in ev.in_flight:
                out.append(cfg)
    return out


def straddlers(ev: Evidence, best_tps: float, settings: SearchSettings) -> list[TrialConfig]:
    """Contenders measured twice whose repeats disagree on an SLO bound: a third run decides."""
    out = []
    for cfg, meets in ev.runs_meet.items():
        if len(meets) != 2 or None in meets or cfg in ev.in_flight:
            continue
        if ev.values[cfg] * (1 + settings.improvement) < best_tps:
            continue
        if len(set(meets)) == 2:
            out.append(cfg)
    return out


# ------------------------------------------------------------------ the stop rule


def remaining(ev: Evidence, max_trials: int) -> int:
    """Trials left in the budget: executed ones and those in flight taken off."""
    return max_trials - ev.executed - len(ev.in_flight)


def stop_reason(
    ev: Evidence,
    *,
    space: SearchSpace,
    max_trials: int,
    settings: SearchSettings,
    wants_trial: bool,
    verdict: StopReason | None = None,
) -> StopReason | None:
    """Why the search stops now, or None: decided here for every sampler.

    Args:
        ev: What the study has measured and has in flight.
        space: The search space (what structures the failures could share).
        max_trials: The budget.
        settings: `abort_after_errors`.
        wants_trial: Whether the sampler would start a trial now (a configuration to measure);
            False while it waits for trials in flight.
        verdict: The sampler's own reason (the posterior's: converged, nothing plausibly meets
            the SLO, everything ruled out; a guarded sampler's: nothing left to propose). It
            comes first.
    """
    statuses = [m.status for m in ev.measured.values()]
    if len(statuses) >= settings.abort_after_errors and all(s == "error" for s in statuses):
        # Failures that share a structure are that structure's (failures.py): the search goes
        # on without it. Failures across structures, or a search that would end with nothing
        # ever run, are the set-up's.
        shared = frozenset.intersection(*(atoms(c, space) for c in ev.measured))
        if not shared or verdict is not None:
            last = [m for ms in ev.runs.values() for m in ms][-1].reason
            return aborted(len(statuses), last)
    if verdict is not None:
        return verdict
    if (wants_trial and remaining(ev, max_trials) <= 0) or ev.executed >= max_trials:
        return budget(max_trials)
    return None


# ------------------------------------------------------------------ the decision


class Planner:
    """Decides the next trial of one study from an assessment.

    Args:
        prior: The space's predictions and fixed facts.
        settings: The search's constants (the request's confidence target applied).
        max_trials: The budget (executed trials, confirmations included).
        pool: The one GPU pool this worker measures on (a tuner Job per pool, workers of one
            study); "" measures every pool.
    """

    def __init__(
        self, prior: Prior, settings: SearchSettings, *, max_trials: int, pool: str = ""
    ) -> None:
        self.prior = prior
        self.settings = settings
        self.max_trials = max_trials
        self.pool = pool

    def decide(self, ev: Evidence, a: Assessment) -> Decision:
        """The next trial, or why to stop.

        Args:
            ev: What the study has measured and has in flight (the budget counts it).
            a: The assessment of that evidence (trials in flight believed).

        Returns:
            A `Decision`: a configuration and its purpose; or no configuration and a stop
            reason; or neither (wait: only an in-flight trial may still change the answer).
        """
        d = self._next(a, remaining(ev, self.max_trials))
        if self.pool and d.config is not None and d.config.gpu != self.pool:
            # The study's next trial is another pool's (its worker takes it): this worker
            # measures what its own pool most needs meanwhile, or waits.
            d = self._next(a, remaining(ev, self.max_trials), mine=self.pool)
        why = stop_reason(
            ev, space=self.prior.space, max_trials=self.max_trials, settings=self.settings,
            wants_trial=d.config is not None, verdict=d.stop,
        )  # fmt: skip
        return Decision(None, stop=why, confidence=a.confidence) if why is not None else d

    def _measure(self, a: Assessment, cfg: TrialConfig, purpose: Purpose) -> Decision:
        """Measure `cfg`, with the chances the posterior gives it recorded."""
        i = a.index.get(cfg)
        chances = None
        if i is not None:
            chances = Chances(
                p_success=round(float(a.p_success[i]), 4),
                p_beat=round(float(a.p_beat[i]), 4),
                incumbent=ConfigOut.of(a.best) if a.best is not None else None,
                to_beat_tps=round(a.best_tps * (1 + self.settings.improvement), 3),
                estimate_tps=round(float(a.estimate[i]), 3),
                confidence=round(a.confidence, 4),
            )
        return Decision(cfg, purpose, confidence=a.confidence, chances=chances)

    def _confirmations(self, a: Assessment) -> list[TrialConfig]:
        if a.best is None:
            return []
        ev, st = a.evidence, self.settings
        chance = {c: float(a.p_beat[i]) for c in ev.feasible if (i := a.index.get(c)) is not None}
        rivals = {c for c, p in chance.items() if p >= st.stop_probability}
        doubted = {c for c in rivals if chance[c] >= st.tie_doubt}
        return confirmations(ev, a.best, rivals, st, doubted)

    def explore_pick(self, a: Assessment, mine: str = "") -> TrialConfig:
        """The candidate to explore: the one with the largest expected gain (of pool `mine`
        when given). (The benchmark's oracle, benchmarks/oracle.py, overrides this with a
        choice that knows the truth.)"""
        gain = a.gain[: len(a.candidates)]
        if mine:
            gain = np.where([c.gpu == mine for c in a.candidates], gain, -np.inf)
        return a.candidates[int(np.argmax(gain))]

    def _next(self, a: Assessment, left: int, mine: str = "") -> Decision:
        """The next trial; with `mine`, the next of that pool only (wait when it has none)."""
        st, ev = self.settings, a.evidence
        conf = a.confidence
        confirm = [c for c in self._confirmations(a) if not mine or c.gpu == mine]
        n_cands = len(a.candidates)
        worth = st.min_expected_gain * a.best_tps
        gain = a.gain[:n_cands]
        if mine:
            gain = gain[[c.gpu == mine for c in a.candidates]]
        explore = a.p_untried >= st.stop_probability and gain.size > 0 and gain.max() > worth
        if confirm and left == 1:
            return self._measure(a, confirm[0], "confirm")
        early = st.confirm_incumbent_after
        if (explore and early and a.best is not None and ev.counted_runs >= early
                and ev.counts.get(a.best, 0) < 2 and a.best not in ev.in_flight
                and (not mine or a.best.gpu == mine)):  # fmt: skip
            # Exploration measures against the incumbent: a lucky first run of it would send the
            # search after configurations that beat noise. Its second run comes first.
            return self._measure(a, a.best, "confirm")
        if explore:
            return self._measure(a, self.explore_pick(a, mine), "explore")
        holes = [g for g in gaps(a, self.prior, st) if not mine or g.target.gpu == mine]
        if holes and left > 1:
            return self._measure(a, holes[0].target, "cover")
        if confirm:
            return self._measure(a, confirm[0], "confirm")
        if ev.in_flight or mine:
            # wait: an in-flight trial may still win (or, for one pool's worker, the study's
            # next trial is another pool's)
            return Decision(None, confidence=conf)
        probes = sum(1 for m in ev.measured.values() if m.status == "ok")
        if a.best is None and probes < st.min_probes and a.candidates:
            i = int(np.argmax(a.p_success[: len(a.candidates)]))
            return self._measure(a, a.candidates[i], "probe")
        if a.best is not None:
            return Decision(None, stop=StopReason(StopKind.CONVERGED, (
                f"P(an untried configuration {beats(self.prior.request, a.best_tps)} by more than "
                f"{st.improvement:.0%}) = {a.p_untried:.1%} < {100 * st.stop_probability:.3g}%; "
                f"confidence the optimum was found: {conf:.1%}"
            )), confidence=conf)  # fmt: skip
        if not a.candidates and not ev.measured:
            return Decision(None, stop=StopReason(
                StopKind.RULED_OUT, "every configuration that could fit is ruled out"
            ))  # fmt: skip
        return Decision(None, stop=StopReason(StopKind.INFEASIBLE, (
            "no untried configuration is plausibly able to meet the SLO "
            f"(P = {a.p_any:.1%}; the {probes} closest measured all missed it)"
        )), confidence=conf)  # fmt: skip
