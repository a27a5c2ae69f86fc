"""The model-guided (`auto`) search: what to measure next, when to stop, how sure it is.

Every configuration the memory model does not rule out by a wide margin is a candidate. For the
untried candidates the posterior (model.py: the performance model as the mean, a Gaussian
process on the log-errors of the measurements) and the memory-fit model (memory_fit.py) are
sampled *jointly*; in each draw a candidate *succeeds* when it fits in memory and meets every
SLO bound, and *beats* the best when it also exceeds the best measured feasible tok/s/GPU by more
than `IMPROVEMENT` (2 %). From the draws:

- confidence = P(no untried candidate beats the best): the probability the optimum was found;
- the next trial is the candidate with the largest expected gain E[(tok/s/GPU - best*1.02)+ *
  success];
- the search stops when P(some untried candidate beats the best) < `STOP_PROBABILITY` (5 %),
  after confirming the winner: the best configuration, and every finalist whose SLO margin is
  within measurement noise, is measured a second time and judged on its worse repeat.

While nothing feasible has been measured, "beats" means "succeeds"; the search measures at least
`MIN_PROBES` configurations (the ones most likely to meet the SLO) before it concludes that
nothing can, since the prior itself may be what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from infertune_tuner import slo
from infertune_tuner.config import TrialConfig
from infertune_tuner.metrics import OBJECTIVE, latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.search.belief import believed
from infertune_tuner.search.coverage import CoverageInput, Gap, gaps
from infertune_tuner.search.evidence import Known, implied_infeasible, measured_twin
from infertune_tuner.search.memory_fit import FitModel, memory_margin, ruled_out
from infertune_tuner.search.model import Observation, Quantity, learned_noise
from infertune_tuner.search.plausibility import decode_bound
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace

IMPROVEMENT = 0.02  # gains under 2 % are within measurement noise: not worth a GPU trial
STOP_PROBABILITY = 0.05
MIN_PROBES = 3
CONFIRM_MARGIN = 0.05  # an SLO margin under this is within the noise of a p95/p99
DRAWS = 768
# Candidates whose marginal chance to beat the incumbent is below this are not drawn jointly.
NEGLIGIBLE = 1e-3
JOINT_AT_LEAST = 8

Purpose = Literal["explore", "confirm", "probe", "cover"]


def bound_key(b: SloBound) -> str:
    """The posterior quantity of one SLO bound, e.g. 'e2e_ms/p95'."""
    return f"{b.metric}/{b.percentile}"


def _predicted(p: Prediction, b: SloBound) -> float:
    return max(float(latency_metric(b.metric).of(p).get(b.percentile)), 1e-6)


@dataclass(frozen=True)
class Decision:
    """What to do next: measure `config` (for `purpose`), or stop (`stop_reason`)."""

    config: TrialConfig | None
    purpose: Purpose = "explore"
    stop_reason: str | None = None
    confidence: float | None = None


@dataclass
class Assessment:
    """The joint posterior over the configurations that could still change the answer.

    Indexes refer to `pool`: the untried candidates, then the in-flight configurations, then
    the measured feasible ones (whose true tok/s/GPU is known only up to measurement noise)."""

    best: TrialConfig | None
    best_tps: float
    candidates: list[TrialConfig]  # untried, not ruled out
    pool: list[TrialConfig]
    p_beat: np.ndarray  # P(succeeds and beats the incumbent by > IMPROVEMENT)
    p_success: np.ndarray  # P(fits and meets every SLO bound); 1 for measured feasible ones
    p_fit: np.ndarray
    gain: np.ndarray  # expected gain over incumbent * (1 + IMPROVEMENT)
    p_any: float  # P(some configuration, measured or not, beats the incumbent)
    p_untried: float  # P(some untried or in-flight configuration beats the incumbent)
    ruled: dict[TrialConfig, str] = field(default_factory=dict)  # why a config is no candidate

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
        draws: int = DRAWS,
        settings: SearchSettings | None = None,
    ) -> None:
        self.request = request
        self.priors = priors
        self.seed = seed
        self.draws = draws
        self.settings = settings if settings is not None else SearchSettings()
        gpu_mem = request.resolve_gpu().memory_gib
        self.margin = {c: memory_margin(priors[c], gpu_mem) for c in space.configs}
        self.universe = [c for c in space.configs if not ruled_out(self.margin[c])]
        self.keys = [bound_key(b) for b in request.slo]

    # -- the posterior

    def _quantities(self, known: Known) -> dict[str, Quantity]:
        obs, reps = self._observations(known)
        hp = self.settings.hyperprior
        return {
            k: Quantity.fit(k, v, prior=hp.of(k), noise=learned_noise(k, reps[k]))
            for k, v in obs.items()
        }

    def _observations(
        self, known: Known
    ) -> tuple[dict[str, list[Observation]], dict[str, list[list[float]]]]:
        """Per quantity, log(measured / predicted) of every valid measurement (and its repeats)."""
        obs: dict[str, list[Observation]] = {"tps": []}
        obs.update({k: [] for k in self.keys})
        reps: dict[str, list[list[float]]] = {k: [] for k in obs}
        for cfg, runs in known.runs.items():
            ok = [m for m in runs if m.status == "ok" and m.output_tokens_per_s_per_gpu]
            p = self.priors.get(cfg)
            if not ok or p is None or known.measured[cfg].status != "ok":
                continue
            if any(m.capped(cfg.max_batch_size) for m in ok):
                continue  # queueing behind a full KV cache, not the model's shape: memory evidence
            logs = [
                math.log((m.output_tokens_per_s_per_gpu or 0.0) / p.output_tokens_per_s_per_gpu)
                for m in ok
            ]
            reps["tps"].append(logs)
            obs["tps"].append(Observation(cfg, sum(logs) / len(logs), len(logs)))
            for b, key in zip(self.request.slo, self.keys, strict=True):
                vals = [pm.get(b.percentile) for m in ok if (pm := m.percentiles(b.metric))]
                if vals:
                    logs = [math.log(max(v, 1e-6) / _predicted(p, b)) for v in vals]
                    reps[key].append(logs)
                    obs[key].append(Observation(cfg, sum(logs) / len(logs), len(logs)))
        return obs, reps

    def gaps(self, known: Known, a: Assessment) -> list[Gap]:
        """The structures that could hold the optimum and were not measured near their
        predicted best (coverage.py)."""
        obs, _ = self._observations(known)
        model, gpu = self.request.resolve_model(), self.request.resolve_gpu()
        data = CoverageInput(
            universe=self.universe,
            candidates=a.candidates,
            valid=frozenset(o.config for o in obs["tps"]),
            feasible=frozenset(known.feasible()),
            residuals={k: {o.config: o.log_ratio for o in v} for k, v in obs.items()},
            incumbent=a.best,
            incumbent_tps=a.best_tps,
            priors=self.priors,
            bounds=[
                (k, b, lambda p, b=b: _predicted(p, b))
                for k, b in zip(self.keys, self.request.slo, strict=True)
            ],
            decode_bound=lambda c: decode_bound(model, gpu, c),
            covers=known.covers,
        )
        return gaps(data, floor=self.settings.coverage_floor, improvement=IMPROVEMENT)

    def believe(self, known: Known) -> Known:
        """`known`, with each configuration in flight believed measured at its posterior mean
        (the "kriging believer" of batch Bayesian optimisation; see belief.py). Parallel
        workers then propose jointly: each proposal treats the others' trials in flight as
        results, the incumbent they may set included, and looks elsewhere."""
        flying = sorted(c for c in known.in_flight - set(known.measured) if c in self.priors)
        if not flying:
            return known
        p_fit = self._fit_model(known).probability(np.array([self.margin[c] for c in flying]))
        return believed(self.request, known, flying, self.priors, self._quantities(known), p_fit)

    def _fit_model(self, known: Known) -> FitModel:
        """Fits = the KV cache held max-batch sequences: an OOM or a capped run says no."""
        outcomes = [
            (self.margin[c], m.status != "oom" and not m.capped(c.max_batch_size))
            for c, m in known.measured.items()
            if c in self.margin and m.status in ("ok", "oom")
        ]
        return FitModel.learn(outcomes)

    def candidates(self, known: Known) -> tuple[list[TrialConfig], dict[TrialConfig, str]]:
        """Untried candidates, and why every other unmeasured configuration is not one.

        Args:
            known: What the study has measured and has in flight.

        Returns:
            The configurations of the space that are neither ruled out by a wide memory margin,
            nor measured, nor in flight, nor ruled out by a measured neighbour or twin; and for
            each configuration ruled out by a neighbour or twin, the reason.
        """
        out, ruled = [], {}
        for c in self.universe:
            if c in known.measured or c in known.in_flight:
                continue
            why = implied_infeasible(c, known)
            if why is None and (t := measured_twin(c, known)) is not None:
                why = f"the model cannot tell it from {t.label()}, which was measured"
            if why is None:
                out.append(c)
            else:
                ruled[c] = why
        return out, ruled

    def _marginal(
        self, cands: list[TrialConfig], qs: dict[str, Quantity], fit: FitModel, threshold: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per candidate, ignoring correlations: P(success), P(fit) and P(beats `threshold`)."""
        if not cands:
            z = np.zeros(0)
            return z, z, z
        log_prior = np.log([self.priors[c].output_tokens_per_s_per_gpu for c in cands])
        p = np.ones(len(cands))
        for b, key in zip(self.request.slo, self.keys, strict=True):
            pred = np.log([_predicted(self.priors[c], b) for c in cands])
            p *= qs[key].probability(cands, math.log(b.max_ms) - pred, below=True)
        floor = self.request.min_output_tokens_per_s_per_gpu
        if floor is not None:
            p *= qs["tps"].probability(cands, math.log(floor) - log_prior, below=False)
        p_fit = fit.probability(np.array([self.margin[c] for c in cands]))
        p_success = p * p_fit
        if threshold <= 0:
            return p_success, p_fit, p_success
        above = qs["tps"].probability(cands, math.log(threshold) - log_prior, below=False)
        return p_success, p_fit, p_success * above

    def assess(self, known: Known, *, include_in_flight: bool = True) -> Assessment:
        """Sample the posterior jointly over the untried, in-flight and measured feasible.

        Candidates whose marginal chance to beat the incumbent is negligible (< `NEGLIGIBLE`,
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
        cands, ruled = self.candidates(known)
        flying = sorted(known.in_flight - set(known.measured)) if include_in_flight else []
        best = known.best()
        feasible = sorted(known.feasible())
        qs = self._quantities(known)
        fit_model = self._fit_model(known)
        slack = 0.0
        if best is not None:
            slack = 3 * float(qs["tps"].marginal([best])[1][0])
        threshold = known.best_tps() * (1 + IMPROVEMENT) * math.exp(-slack)
        m_success, m_fit, m_beat = self._marginal(cands, qs, fit_model, threshold)
        order = np.argsort(-m_beat, kind="stable")
        keep = [i for i in order if m_beat[i] >= NEGLIGIBLE] or list(order[:1])
        keep = sorted(set(keep) | set(order[:JOINT_AT_LEAST].tolist()))
        joint = [cands[i] for i in keep] + flying
        pool = joint + feasible
        n, m = self.draws, len(pool)
        rng = np.random.default_rng([self.seed, known.executed, m])
        prior_tps = np.array([self.priors[c].output_tokens_per_s_per_gpu for c in pool])
        tps = prior_tps * np.exp(qs["tps"].sample(pool, n, rng))
        untested = len(joint)
        success = np.ones((n, m), dtype=bool)
        for b, key in zip(self.request.slo, self.keys, strict=True):
            pred = np.array([_predicted(self.priors[c], b) for c in joint])
            lat = pred * np.exp(qs[key].sample(joint, n, rng))
            success[:, :untested] &= lat <= b.max_ms
        if self.request.min_output_tokens_per_s_per_gpu is not None:
            success[:, :untested] &= (
                tps[:, :untested] >= self.request.min_output_tokens_per_s_per_gpu
            )
        margins = np.array([self.margin[c] for c in joint])
        delta = fit_model.sample(n, rng)
        success[:, :untested] &= (margins[None, :] + delta[:, None]) > 0
        if best is not None:
            inc = pool.index(best)
            line = (1 + IMPROVEMENT) * tps[:, inc : inc + 1]
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
            p_any=float(beats.any(axis=1).mean()) if m else 0.0,
            p_untried=float(beats[:, :untested].any(axis=1).mean()) if untested else 0.0,
            ruled=ruled,
        )

    # -- the decision

    def _confirmations(self, known: Known, a: Assessment) -> list[TrialConfig]:
        """What to re-measure (once) before declaring: the incumbent; every finalist within 2 %
        of it whose SLO margin is within noise; every measured rival that noise may hide as
        better than the incumbent (P(beats it) >= STOP_PROBABILITY)."""
        if a.best is None:
            return []
        # A configuration another worker is measuring again is confirmed there.
        out = [a.best] if known.repeats(a.best) < 2 and a.best not in known.in_flight else []
        for cfg, m in known.feasible().items():
            if cfg == a.best or known.repeats(cfg) >= 2 or cfg in known.in_flight:
                continue
            i = a.of(cfg)
            if i is not None and a.p_beat[i] >= STOP_PROBABILITY:
                out.append(cfg)
                continue
            if (m.output_tokens_per_s_per_gpu or 0.0) * (1 + IMPROVEMENT) < a.best_tps:
                continue
            margins = [
                (c.limit_ms - c.value_ms) / c.limit_ms
                if c.metric != OBJECTIVE.key
                else (c.value_ms - c.limit_ms) / c.limit_ms
                for c in known.checks.get(cfg, [])
            ]
            if margins and min(margins) < CONFIRM_MARGIN:
                out.append(cfg)
        out += [c for c in self._straddling(known, a) if c not in out]
        return out

    def _straddling(self, known: Known, a: Assessment) -> list[TrialConfig]:
        """Contenders measured twice whose repeats disagree on an SLO bound (one met it, one
        missed): a third measurement decides which side their typical run is on."""
        out = []
        for cfg, runs in known.runs.items():
            ok = [m for m in runs if m.status == "ok"]
            if len(runs) != 2 or len(ok) != 2 or cfg in known.in_flight:
                continue
            if (known.measured[cfg].output_tokens_per_s_per_gpu or 0.0) * (
                1 + IMPROVEMENT
            ) < a.best_tps:
                continue
            verdicts = {all(c.ok for c in slo.check(self.request, m)) for m in ok}
            if len(verdicts) == 2:
                out.append(cfg)
        return out

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
        known = self.believe(known)
        a = self.assess(known)
        conf = a.confidence
        confirm = self._confirmations(known, a)
        n_cands = len(a.candidates)
        worth = self.settings.min_expected_gain * a.best_tps
        explore = a.p_untried >= STOP_PROBABILITY and n_cands > 0 and a.gain[:n_cands].max() > worth
        if confirm and remaining == 1:
            return Decision(confirm[0], "confirm", confidence=conf)
        early = self.settings.confirm_incumbent_after
        if (explore and early and a.best is not None and known.executed >= early
                and known.repeats(a.best) < 2 and a.best not in known.in_flight):  # fmt: skip
            # Exploration measures against the incumbent: a lucky first run of it would send the
            # search after configurations that beat noise. Its second run comes first.
            return Decision(a.best, "confirm", confidence=conf)
        if explore:
            i = int(np.argmax(a.gain[:n_cands]))
            return Decision(a.candidates[i], "explore", confidence=conf)
        if (holes := self.gaps(known, a)) and (remaining is None or remaining > 1):
            return Decision(holes[0].target, "cover", confidence=conf)
        if confirm:
            return Decision(confirm[0], "confirm", confidence=conf)
        if known.in_flight:
            return Decision(None, confidence=conf)  # wait: an in-flight trial may still win
        probes = sum(1 for m in known.measured.values() if m.status == "ok")
        if a.best is None and probes < MIN_PROBES and a.candidates:
            i = int(np.argmax(a.p_success[: len(a.candidates)]))
            return Decision(a.candidates[i], "probe", confidence=conf)
        if a.best is not None:
            return Decision(None, stop_reason=(
                f"converged: P(an untried configuration beats {a.best_tps:.0f} tok/s/GPU by more "
                f"than {IMPROVEMENT:.0%}) = {a.p_untried:.1%} < {STOP_PROBABILITY:.0%}; "
                f"confidence the optimum was found: {conf:.1%}"
            ), confidence=conf)  # fmt: skip
        if not a.candidates and not known.measured:
            return Decision(None, stop_reason="every configuration that could fit is ruled out")
        return Decision(None, stop_reason=(
            "no untried configuration is plausibly able to meet the SLO "
            f"(P = {a.p_any:.1%}; the {probes} closest measured all missed it)"
        ), confidence=conf)  # fmt: skip
