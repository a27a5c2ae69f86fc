"""The model-guided (`auto`) search: what to measure next, when to stop, how sure it is.

Every configuration the memory model does not rule out by a wide margin is a candidate. For the
untried candidates the posterior (model.py: the performance model as the mean, a Gaussian
process on the log-errors of the measurements) and the memory-fit model (memory_fit.py) are
sampled *jointly*; in each draw a candidate *succeeds* when it fits in memory and meets every
SLO bound, and *beats* the best when it also exceeds the best measured feasible tok/s/GPU by more
than `SearchSettings.improvement` (2 %). From the draws:

- confidence = P(no untried candidate beats the best): the probability the optimum was found;
- the next trial is the candidate with the largest expected gain E[(tok/s/GPU - best*1.02)+ *
  success];
- before it stops, every structure (TP x quantization) that could still hold the optimum, given
  how wrong the model has been on this run, is measured near its predicted best (coverage.py):
  the posterior's doubt rests on the model, and the model can be wrong about a whole structure;
- the search stops when P(some untried candidate beats the best) < `stop_probability` (5 %),
  after confirming the winner: the best configuration, and every finalist whose SLO margin is
  within measurement noise, is measured a second time and judged on its typical run.

While nothing feasible has been measured, "beats" means "succeeds"; the search measures at least
`min_probes` configurations (the ones most likely to meet the SLO) before it concludes that
nothing can, since the prior itself may be what is wrong. Every constant is a field of
`SearchSettings`, with its evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Literal

import numpy as np

from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Chances, ConfigOut
from infertune_tuner.search.belief import believed
from infertune_tuner.search.classify import Exclusion, Ruling, classify
from infertune_tuner.search.confirm import confirmations
from infertune_tuner.search.coverage import CoverageInput, Gap, gaps
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.joint import Posterior, log_bound
from infertune_tuner.search.memory_fit import FitModel, memory_margin, ruled_out
from infertune_tuner.search.plausibility import decode_bound
from infertune_tuner.search.residuals import bound_key, predicted, residuals, tie
from infertune_tuner.search.settings import SearchSettings, stop_probability_for
from infertune_tuner.space import SearchSpace
from infertune_tuner.stop import StopKind, StopReason

Purpose = Literal["explore", "confirm", "probe", "cover"]


@dataclass(frozen=True)
class Decision:
    """What to do next: measure `config` (for `purpose`), or stop (`stop`)."""

    config: TrialConfig | None
    purpose: Purpose = "explore"
    stop: StopReason | None = None
    confidence: float | None = None
    chances: Chances | None = None  # what the posterior gave `config` (recorded on its trial)


@dataclass
class Assessment:
    """The joint posterior over the configurations that could still change the answer.

    Indexes refer to `pool`: the untried candidates, then the in-flight configurations, then
    the measured feasible ones (whose true tok/s/GPU is known only up to measurement noise)."""

    best: TrialConfig | None
    best_tps: float
    candidates: list[TrialConfig]  # untried, not ruled out
    pool: list[TrialConfig]
    p_beat: np.ndarray  # P(succeeds and beats the incumbent by > settings.improvement)
    p_success: np.ndarray  # P(fits and meets every SLO bound); 1 for measured feasible ones
    p_fit: np.ndarray
    gain: np.ndarray  # expected gain over incumbent * (1 + settings.improvement)
    estimate: np.ndarray  # the posterior's median tok/s/GPU
    p_any: float  # P(some configuration, measured or not, beats the incumbent)
    p_untried: float  # P(some untried or in-flight configuration beats the incumbent)
    ruled: dict[TrialConfig, Ruling] = field(default_factory=dict)  # why no candidate

    @property
    def confidence(self) -> float:
        return 1.0 - self.p_any

    def of(self, cfg: TrialConfig) -> int | None:
        try:
            return self.pool.index(cfg)
        except ValueError:
            return None


class Planner:
    """Ranks candidates and applies the stop rule for one request (pure: no Optuna, no I/O)."""

    def __init__(
        self,
        request: TuningRequest,
        space: SearchSpace,
        priors: dict[TrialConfig, Prediction],
        *,
        seed: int = 0,
        settings: SearchSettings | None = None,
    ) -> None:
        self.request = request
        self.priors = priors
        self.seed = seed
        self.settings = settings if settings is not None else SearchSettings()
        if (confidence := request.tuning.confidence) is not None:  # the user's target wins
            self.settings = replace(
                self.settings, stop_probability=stop_probability_for(confidence)
            )
        gpu_mem = request.resolve_gpu().memory_gib
        self.margin = {c: memory_margin(priors[c], gpu_mem) for c in space.configs}
        self.universe = [c for c in space.configs if not ruled_out(self.margin[c])]
        self.keys = [bound_key(b) for b in request.slo]

    # -- the posterior

    def posterior(self, known: Known) -> Posterior:
        """The posterior of every quantity, given the run's valid measurements (joint.py)."""
        return Posterior.fit(residuals(self.request, self.priors, known), self.settings.hyperprior)

    def gaps(self, known: Known, a: Assessment) -> list[Gap]:
        """The structures that could hold the optimum and were not measured near their
        predicted best (coverage.py)."""
        r = residuals(self.request, self.priors, known)
        model, gpu = self.request.resolve_model(), self.request.resolve_gpu()
        data = CoverageInput(
            universe=self.universe,
            candidates=a.candidates,
            valid=frozenset(o.config for o in r.observations["tps"]),
            feasible=frozenset(known.feasible()),
            residuals=r.by_config(),
            own={k: {o.config: o.log_ratio for o in v} for k, v in r.own.items()},
            incumbent=a.best,
            incumbent_tps=a.best_tps,
            priors=self.priors,
            bounds=[
                (k, b, partial(predicted, b=b), tie(k))
                for k, b in zip(self.keys, self.request.slo, strict=True)
            ],
            decode_bound=lambda c: decode_bound(model, gpu, c),
            covers=known.covers,
        )
        st = self.settings
        return gaps(
            data, floor=st.coverage_floor, improvement=st.improvement, max_covers=st.max_covers
        )

    def believe(self, known: Known) -> Known:
        """`known`, with each configuration in flight believed measured at its posterior mean
        (the "kriging believer" of batch Bayesian optimisation; see belief.py). Parallel
        workers then propose jointly: each proposal treats the others' trials in flight as
        results, the incumbent they may set included, and looks elsewhere."""
        flying = sorted(c for c in known.in_flight - set(known.measured) if c in self.priors)
        if not flying:
            return known
        p_fit = self._fit_model(known).probability(np.array([self.margin[c] for c in flying]))
        return believed(self.request, known, flying, self.priors, self.posterior(known), p_fit)

    def _fit_model(self, known: Known) -> FitModel:
        """Fits = the KV cache held max-batch sequences: an OOM or a capped run says no."""
        outcomes = [
            (self.margin[c], m.status != "oom" and not m.capped(c.max_batch_size))
            for c, m in known.measured.items()
            if c in self.margin and m.status in ("ok", "oom")
        ]
        return FitModel.learn(outcomes)

    def ruling(self, cfg: TrialConfig, known: Known) -> Ruling | None:
        """Why `cfg` is not a candidate now, or None (classify.py decides)."""
        return classify(
            cfg, known, memory_ruled_out=ruled_out(self.margin[cfg]),
            memory_reason=self.priors[cfg].memory.reason,
            dominance_margin=self.settings.dominance_margin,
        )  # fmt: skip

    def admissible(self, known: Known) -> set[TrialConfig]:
        """What a wrapped Optuna sampler may propose: every configuration of the space that is
        a candidate (not ruled out, not measured, not in flight)."""
        return {c for c in self.margin if self.ruling(c, known) is None}

    def candidates(self, known: Known) -> tuple[list[TrialConfig], dict[TrialConfig, Ruling]]:
        """Untried candidates, and why every other unmeasured configuration of the memory
        model's universe is not one (a measured neighbour or twin rules it out).

        Args:
            known: What the study has measured and has in flight.
        """
        out, ruled = [], {}
        for c in self.universe:
            why = self.ruling(c, known)
            if why is None:
                out.append(c)
            elif why.exclusion not in (Exclusion.MEASURED, Exclusion.IN_FLIGHT):
                ruled[c] = why
        return out, ruled

    def _marginal(
        self, cands: list[TrialConfig], post: Posterior, fit: FitModel, threshold: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per candidate on its own (no correlation between candidates): P(success), P(fit)
        and P(succeeds and beats `threshold`)."""
        if not cands:
            z = np.zeros(0)
            return z, z, z
        log_prior = np.log([self.priors[c].output_tokens_per_s_per_gpu for c in cands])
        bounds: dict[str, np.ndarray] = {}
        for b, key in zip(self.request.slo, self.keys, strict=True):
            limit = log_bound(b.max_ms, np.array([predicted(self.priors[c], b) for c in cands]))
            bounds[key] = np.minimum(bounds[key], limit) if key in bounds else limit
        floor = self.request.min_output_tokens_per_s_per_gpu
        low = None if floor is None else math.log(floor) - log_prior
        p_fit = fit.probability(np.array([self.margin[c] for c in cands]))
        p_success = post.success(cands, bounds, low) * p_fit
        if threshold <= 0:
            return p_success, p_fit, p_success
        above = math.log(threshold) - log_prior
        above = above if low is None else np.maximum(above, low)
        return p_success, p_fit, post.success(cands, bounds, above) * p_fit

    def assess(self, known: Known, *, include_in_flight: bool = True) -> Assessment:
        """Sample the posterior jointly over the untried, in-flight and measured feasible.

        Candidates whose marginal chance to beat the incumbent is negligible (< `negligible`,
        with the incumbent's own noise allowed for) are left out of the joint draws; they keep
        their marginal probabilities.

        Args:
            known: What the study has measured and has in flight.
            include_in_flight: Count in-flight configurations as chances to beat the incumbent
                (a search must not stop while one may still win; the report leaves them out).

        Returns:
            An `Assessment`: per configuration of its pool (candidates, in flight, measured
            feasible) the probabilities to succeed, fit and beat the incumbent and the expected
            gain, and P(some configuration beats the incumbent) overall and among the untried.
        """
        st = self.settings
        cands, ruled = self.candidates(known)
        flying = sorted(known.in_flight - set(known.measured)) if include_in_flight else []
        best = known.best()
        feasible = sorted(known.feasible())
        post = self.posterior(known)
        fit_model = self._fit_model(known)
        slack = 0.0
        if best is not None:
            slack = 3 * float(post.tps.marginal([best])[1][0])
        threshold = known.best_tps() * (1 + st.improvement) * math.exp(-slack)
        m_success, m_fit, m_beat = self._marginal(cands, post, fit_model, threshold)
        order = np.argsort(-m_beat, kind="stable")
        keep = [i for i in order if m_beat[i] >= st.negligible] or list(order[:1])
        keep = sorted(set(keep) | set(order[: st.joint_at_least].tolist()))
        joint = [cands[i] for i in keep] + flying
        pool = joint + feasible
        n, m = st.draws, len(pool)
        rng = np.random.default_rng([self.seed, known.executed, m])
        prior_tps = np.array([self.priors[c].output_tokens_per_s_per_gpu for c in pool])
        tps_err, lat_err = post.sample(pool, n, rng, joint)
        tps = prior_tps * np.exp(tps_err)
        untested = len(joint)
        success = np.ones((n, m), dtype=bool)
        for b, key in zip(self.request.slo, self.keys, strict=True):
            pred = np.array([predicted(self.priors[c], b) for c in joint])
            success[:, :untested] &= pred * np.exp(lat_err[key]) <= b.max_ms
        if self.request.min_output_tokens_per_s_per_gpu is not None:
            success[:, :untested] &= (
                tps[:, :untested] >= self.request.min_output_tokens_per_s_per_gpu
            )
        margins = np.array([self.margin[c] for c in joint])
        delta = fit_model.sample(n, rng)
        success[:, :untested] &= (margins[None, :] + delta[:, None]) > 0
        if best is not None:
            inc = pool.index(best)
            line = (1 + st.improvement) * tps[:, inc : inc + 1]
            beats = success & (tps > line)
            beats[:, inc] = False
        else:
            line = np.zeros((n, 1))
            beats = success.copy()
        gain = np.where(beats, tps - line, 0.0).mean(axis=0)
        # Arrays over all candidates (marginal where not drawn jointly), then the rest of the pool.
        full = cands + flying + feasible
        p_beat = np.concatenate([m_beat, np.zeros(len(flying) + len(feasible))])
        p_success = np.concatenate([m_success, np.ones(len(flying) + len(feasible))])
        p_fit = np.concatenate([m_fit, np.ones(len(flying) + len(feasible))])
        g = np.zeros(len(full))
        for j, c in enumerate(pool):
            i = full.index(c) if j >= len(keep) else keep[j]
            p_beat[i], p_success[i], g[i] = beats[:, j].mean(), success[:, j].mean(), gain[j]
        return Assessment(
            best=best,
            best_tps=known.best_tps(),
            candidates=cands,
            pool=full,
            p_beat=p_beat,
            p_success=p_success,
            p_fit=p_fit,
            gain=g,
            estimate=np.array([self.priors[c].output_tokens_per_s_per_gpu for c in full])
            * np.exp(post.tps.marginal(full)[0]),
            p_any=float(beats.any(axis=1).mean()) if m else 0.0,
            p_untried=float(beats[:, :untested].any(axis=1).mean()) if untested else 0.0,
            ruled=ruled,
        )

    # -- the decision

    def _measure(self, a: Assessment, cfg: TrialConfig, purpose: Purpose) -> Decision:
        """Measure `cfg`, with the chances the posterior gives it (`a`) recorded."""
        i = a.of(cfg)
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

    def _confirmations(self, known: Known, a: Assessment) -> list[TrialConfig]:
        if a.best is None:
            return []
        chance = {c: float(a.p_beat[i]) for c in known.feasible() if (i := a.of(c)) is not None}
        rivals = {c for c, p in chance.items() if p >= self.settings.stop_probability}
        # The posterior holds these more likely than not the better: their runs' order is in doubt.
        doubted = {c for c in rivals if chance[c] >= self.settings.tie_doubt}
        return confirmations(self.request, known, a.best, rivals, self.settings, doubted)

    def explore_pick(self, known: Known, a: Assessment) -> TrialConfig:
        """The candidate to explore: the one with the largest expected gain. (The benchmark's
        oracle, benchmarks/oracle.py, overrides this with a choice that knows the truth.)"""
        return a.candidates[int(np.argmax(a.gain[: len(a.candidates)]))]

    def decide(self, known: Known, *, remaining: int | None = None) -> Decision:
        """The next trial, or why to stop.

        Args:
            known: What the study has measured and has in flight.
            remaining: Trials left in the budget (the last one confirms the incumbent).

        Returns:
            A `Decision`: a configuration and its purpose (`explore`, `probe`, `confirm`); or no
            configuration and a stop reason (converged, nothing plausibly meets the SLO, all
            ruled out); or neither, when only an in-flight trial may still change the answer.
            `confidence` is P(no configuration beats the incumbent by more than 2 %).
            Configurations in flight count as measured at their posterior mean (`believe`).
        """
        st = self.settings
        known = self.believe(known)
        a = self.assess(known)
        conf = a.confidence
        confirm = self._confirmations(known, a)
        n_cands = len(a.candidates)
        worth = st.min_expected_gain * a.best_tps
        explore = (
            a.p_untried >= st.stop_probability and n_cands > 0 and a.gain[:n_cands].max() > worth
        )
        if confirm and remaining == 1:
            return self._measure(a, confirm[0], "confirm")
        early = st.confirm_incumbent_after
        if (explore and early and a.best is not None and known.executed >= early
                and known.repeats(a.best) < 2 and a.best not in known.in_flight):  # fmt: skip
            # Exploration measures against the incumbent: a lucky first run of it would send the
            # search after configurations that beat noise. Its second run comes first.
            return self._measure(a, a.best, "confirm")
        if explore:
            return self._measure(a, self.explore_pick(known, a), "explore")
        if (holes := self.gaps(known, a)) and (remaining is None or remaining > 1):
            return self._measure(a, holes[0].target, "cover")
        if confirm:
            return self._measure(a, confirm[0], "confirm")
        if known.in_flight:
            return Decision(None, confidence=conf)  # wait: an in-flight trial may still win
        probes = sum(1 for m in known.measured.values() if m.status == "ok")
        if a.best is None and probes < st.min_probes and a.candidates:
            i = int(np.argmax(a.p_success[: len(a.candidates)]))
            return self._measure(a, a.candidates[i], "probe")
        if a.best is not None:
            return Decision(None, stop=StopReason(StopKind.CONVERGED, (
                f"P(an untried configuration beats {a.best_tps:.0f} tok/s/GPU by more than "
                f"{st.improvement:.0%}) = {a.p_untried:.1%} < {100 * st.stop_probability:.3g}%; "
                f"confidence the optimum was found: {conf:.1%}"
            )), confidence=conf)  # fmt: skip
        if not a.candidates and not known.measured:
            return Decision(None, stop=StopReason(
                StopKind.RULED_OUT, "every configuration that could fit is ruled out"
            ))  # fmt: skip
        return Decision(None, stop=StopReason(StopKind.INFEASIBLE, (
            "no untried configuration is plausibly able to meet the SLO "
            f"(P = {a.p_any:.1%}; the {probes} closest measured all missed it)"
        )), confidence=conf)  # fmt: skip
