"""What the evidence says about every configuration of the space: ruled out, and why; or what
it could do, under a posterior that uses the performance model as its mean.

One entry, `assess(evidence, prior, settings)`, answers a decision's whole question in one pass:

1. **Belief.** Configurations in flight are believed measured at their posterior mean (the
   "kriging believer" of batch Bayesian optimisation): parallel workers then propose jointly,
   each treating the others' trials in flight as results (the incumbent they may set included)
   and looking elsewhere. A believed result only steers proposals: it is never recorded.
2. **Verdicts.** `verdicts` classifies every configuration of the space, here and nowhere else:
   a candidate (None), or the typed reason it is not (`Ruling`): the memory model rules it out
   by a wide margin; it is measured or in flight; it is at least as large in every memory
   dimension as one that ran out of memory or whose KV cache held fewer sequences than its
   batch; a measured neighbour of the same TP and precision missed a latency bound at a smaller
   batch (or the tok/s/GPU floor at a larger one) by more than the dominance margin; or the model
   cannot tell it from a measured configuration (bf16 and fp16 weights: its *twin*). The
   planner, the guarded Optuna samplers, the report and its untried groups all read this.
3. **The posterior.** For tok/s/GPU and every bounded latency percentile, log(measured /
   predicted) is a Gaussian process over configuration features (`FEATURES`):

       k(x, x') = sigma_global^2                         an error the whole pool shares
                + sigma_local^2 * E(x, x')                an error in the curves' shape
                + sum_j trend_j^2 * u_j(x) u_j(x')        a slope along batch (j=0), TP (j=1)
       E(x, x') = exp(-sum_d (x_d - x'_d)^2 / (2 l_d^2))

   plus run-to-run noise (divided by the repeats; learned from them, never below the prior).
   Where the request lists several GPU pools, k is multiplied by the pools' correlation
   (`pool_coordinates`): 1 on one pool, `pool_correlation` within a GPU architecture, 0 across.
   No hyperparameter is fixed: a run weighs settings spread over the hyperprior (hyperprior.py,
   fitted across worlds of many forms) by the marginal likelihood of its own measurements and
   predicts with the mixture. Under the closed-loop load, Little's law ties latency to
   throughput: an E2E or ITL bound's log-error is `tie` x the tok/s/GPU log-error plus a part of
   its own (`Prior.bounds`; the evidence is in the metric registry and docs/tuning.md), so a
   configuration the model is pessimistic about is both faster and quicker in every draw.
   Whether a configuration fits in memory is a posterior too (`MemoryFit`): the memory model's
   error on this pool, learned from what ran and what ran out of memory.
4. **The assessment.** The untried candidates, the configurations in flight and the measured
   feasible ones are sampled jointly; in each draw a candidate *succeeds* when it fits and meets
   every bound and *beats* the best when it also exceeds the best measured tok/s/GPU by more than
   `improvement`. From the draws: P(beats), P(success), the expected gain, and the confidence
   that the optimum was found (`Assessment`).

Every constant is a field of `SearchSettings`, with its evidence, but the kernel's coordinates
(`FEATURES`, `TREND_CENTRE`), in which the hyperprior is fitted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import ndtr, ndtri

from infertune_tuner import pools
from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.catalog.quantization import KV_DTYPE_BYTES, QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES, latency_metric
from infertune_tuner.perfmodel.latency import Percentiles, Prediction
from infertune_tuner.perfmodel.memory import FREE_GPU_MEMORY_FRACTION
from infertune_tuner.request import SloBound, TuningRequest
from infertune_tuner.result import Check, FloorCheck
from infertune_tuner.search.evidence import Evidence, decode_bound
from infertune_tuner.search.failures import FailureModel
from infertune_tuner.space import SearchSpace

if TYPE_CHECKING:
    from infertune_tuner.search.settings import SearchSettings

# ------------------------------------------------------------------ the prior: fixed per space

# Features are scaled so that one unit means "quite different": a 4x batch change, a TP
# doubling, a weight width halving, a change of tensor-core path, a KV-cache width halving. The
# hyperprior is fitted in these units (hyperprior.py).
FEATURES = ("batch", "tp", "weight width", "compute path", "kv width")
_COMPUTE_LEVEL = {"bf16": 0.0, "fp8": -1.0, "fp4": -2.0}
TREND_FEATURES = (0, 1)  # batch, TP
TREND_CENTRE = np.array(
    [2.0, 1.0]
)  # the features of batch 16 and TP 2: a slope adds doubt both ways
_JITTER = 1e-9  # numerical: keeps a covariance positive definite


def features(cfg: TrialConfig) -> np.ndarray:
    """The coordinates a configuration has in the posterior's kernel (see FEATURES)."""
    q = QUANTIZATIONS[cfg.quantization]
    return np.array(
        [
            math.log2(cfg.max_batch_size) / 2.0,
            math.log2(cfg.tp),
            math.log2(q.weight_bytes),
            _COMPUTE_LEVEL[q.compute],
            math.log2(KV_DTYPE_BYTES[cfg.kv_cache_dtype]),
        ]
    )


def feature_rows(configs: Sequence[TrialConfig]) -> np.ndarray:
    """The configurations' coordinates, one row each (len(configs) x len(FEATURES))."""
    return np.array([features(c) for c in configs]).reshape(len(configs), len(FEATURES))


def kernels(quantization: str) -> tuple[object, ...]:
    """Weight quantizations that run the same kernels at the same width (bf16 and fp16) share
    this key: the model cannot tell them apart, and neither can a measurement's shape."""
    q = QUANTIZATIONS[quantization]
    return (q.weight_bytes, q.compute)


def twins(quantization: str) -> str:
    """The weight quantizations that share `quantization`'s kernels, as one name ("bf16/fp16")."""
    key = kernels(quantization)
    return "/".join(sorted(n for n in QUANTIZATIONS if kernels(n) == key))


def memory_dims(c: TrialConfig) -> tuple[float, float, float, float]:
    """Larger in every dimension = needs more memory per GPU: -TP, batch, weight and KV bytes."""
    return (
        -c.tp,
        c.max_batch_size,
        QUANTIZATIONS[c.quantization].weight_bytes,
        KV_DTYPE_BYTES[c.kv_cache_dtype],
    )


def twin(c: TrialConfig) -> tuple[object, ...]:
    """Configurations the model cannot tell apart (bf16 vs fp16 weights, on one pool) share a
    twin key."""
    return (c.tp, c.max_batch_size, *kernels(c.quantization), c.kv_cache_dtype, c.gpu)


def memory_margin(prediction: Prediction, gpu_memory_gib: float) -> float:
    """log(GPU memory / needed memory) as the memory model sees it (>= 0: predicted to fit):
    weights, activations, reserve, and the KV cache for max-batch sequences at full context,
    grossed up by the share of free memory the KV cache may take."""
    m = prediction.memory
    need = (
        m.weights_gib_per_gpu
        + m.activations_gib_per_gpu
        + m.reserve_gib_per_gpu
        + m.kv_cache_gib_per_gpu / FREE_GPU_MEMORY_FRACTION
    )
    return math.log(gpu_memory_gib / max(need, 1e-9))


@dataclass(frozen=True, order=True)
class QuantityKey:
    """A quantity the posterior models: tok/s/GPU (`TPS`), or one percentile of a latency
    metric (an SLO bound's, e.g. e2e_ms at p95)."""

    metric: str  # "tps", or a latency metric's key
    percentile: str  # "mean" for tok/s/GPU

    @classmethod
    def of_check(cls, c: Check) -> QuantityKey:
        """The quantity an SLO check measures (the tok/s/GPU floor's is TPS)."""
        return TPS if isinstance(c, FloorCheck) else cls(c.metric, c.percentile)

    def __str__(self) -> str:
        return self.metric if self == TPS else f"{self.metric}/{self.percentile}"


TPS = QuantityKey("tps", "mean")


@dataclass(frozen=True)
class Bound:
    """One SLO bound as the posterior sees it: its quantity, the metric's tie to the tok/s/GPU
    error (0: none), and the model's prediction of it per configuration."""

    key: QuantityKey
    bound: SloBound
    tie: float
    predicted: Mapping[TrialConfig, float]


def _predicted(p: Prediction, b: SloBound) -> float:
    """What the performance model predicts for the quantity bound `b` limits."""
    return max(float(latency_metric(b.metric).of(p).get(b.percentile)), 1e-6)


@dataclass(frozen=True)
class Prior:
    """What is known of every configuration before any trial: computed once per study."""

    request: TuningRequest
    space: SearchSpace
    predictions: Mapping[TrialConfig, Prediction]
    margin: Mapping[TrialConfig, float]  # memory_margin
    universe: tuple[TrialConfig, ...]  # not ruled out by the memory model's wide margin
    tps: Mapping[TrialConfig, float]  # predicted tok/s/GPU
    features: Mapping[TrialConfig, np.ndarray]
    structure: Mapping[TrialConfig, tuple[str, str]]  # its TP and its weights' twins name
    decode_bound: Mapping[TrialConfig, float]  # evidence.decode_bound
    bounds: tuple[Bound, ...]
    particles: Mapping[QuantityKey, tuple[Hyper, ...]]  # hyperparameter settings per quantity
    # What a tok/s/GPU of it is worth (pools.worth): the objective is tok/s/GPU x worth.
    worth: Mapping[TrialConfig, float]
    # The predicted objective: predicted tok/s/GPU x worth (the tok/s/GPU itself on one pool).
    objective: Mapping[TrialConfig, float]

    @classmethod
    def build(
        cls,
        request: TuningRequest,
        space: SearchSpace,
        predictions: Mapping[TrialConfig, Prediction],
        settings: SearchSettings,
    ) -> Prior:
        model = request.resolve_model()
        configs = space.configs
        gpu = {c: pools.gpu_of(request, c) for c in configs}
        worth = {c: pools.worth(request, c) for c in configs}
        margin = {c: memory_margin(predictions[c], gpu[c].memory_gib) for c in configs}
        coords = pool_coordinates(
            [get_gpu(p) for p in space.gpus], settings.pool_correlation
        )  # fmt: skip
        feats = {
            c: np.concatenate([features(c), coords[c.gpu]]) if c.gpu else features(c)
            for c in configs
        }
        bounds = tuple(
            Bound(
                QuantityKey(b.metric, b.percentile),
                b,
                latency_metric(b.metric).throughput_tie,
                {c: _predicted(predictions[c], b) for c in configs},
            )
            for b in request.slo
        )
        keys = [TPS, *(b.key for b in bounds)]
        hp = settings.hyperprior
        return cls(
            request=request,
            space=space,
            predictions=predictions,
            margin=margin,
            universe=tuple(c for c in configs if margin[c] >= -settings.wide_margin),
            tps={c: predictions[c].output_tokens_per_s_per_gpu for c in configs},
            features=feats,
            structure={c: (str(c.tp), twins(c.quantization)) for c in configs},
            decode_bound={c: decode_bound(model, gpu[c], c) for c in configs},
            worth=worth,
            objective={c: predictions[c].output_tokens_per_s_per_gpu * worth[c] for c in configs},
            bounds=bounds,
            particles={k: hp.of(k.metric).particles(settings.particles) for k in keys},
        )


# ------------------------------------------------------------------ verdicts


class Exclusion(StrEnum):
    MEMORY = "memory"
    MEASURED = "measured"
    IN_FLIGHT = "in-flight"
    OUT_OF_MEMORY = "out-of-memory"
    KV_CAPPED = "kv-capped"
    SLO_MISS = "slo-miss"
    TWIN = "twin"
    FAILED = "failed"


@dataclass(frozen=True)
class Ruling:
    """Why a configuration is not a candidate."""

    exclusion: Exclusion
    by: TrialConfig | None = None  # the measured configuration that rules it out
    bound: str | None = None  # the SLO bound `by` missed ("E2E p95 <= 25600 ms")
    detail: str | None = None  # the memory arithmetic, or the sequences a KV cache held

    @property
    def unmeasured(self) -> bool:
        """Whether it rules out a configuration nobody measured (not measured, not in flight)."""
        return self.exclusion not in (Exclusion.MEASURED, Exclusion.IN_FLIGHT)

    @property
    def predicted_infeasible(self) -> bool:
        """Whether the report lists it as a trial the evidence or the model made unnecessary
        (a twin is covered by its measured twin instead: the report's untried groups say so; a
        configuration whose structure failed is listed with the failures: it could not run)."""
        return self.unmeasured and self.exclusion not in (Exclusion.TWIN, Exclusion.FAILED)

    def text(self) -> str:
        by = self.by.label() if self.by else ""
        match self.exclusion:
            case Exclusion.MEMORY:
                return self.detail or "does not fit in GPU memory"
            case Exclusion.MEASURED:
                return "measured"
            case Exclusion.IN_FLIGHT:
                return "being measured"
            case Exclusion.OUT_OF_MEMORY:
                return f"at least as large in memory as {by}, which ran out of memory"
            case Exclusion.KV_CAPPED:
                return f"at least as large in memory as {by}, whose KV cache {self.detail}"
            case Exclusion.SLO_MISS:
                side = "smaller" if self.detail == "floor" else "larger"
                return f"{side} batch than {by}, which missed {self.bound}"
            case Exclusion.TWIN:
                return f"the model cannot tell it from {by}, which was measured"
            case Exclusion.FAILED:
                return f"of a structure that failed to run: {by} failed ({self.detail})"


def _clear_miss(ch: Check, margin: float) -> bool:
    if ch.ok:
        return False
    if isinstance(ch, FloorCheck):
        return ch.value_tps < ch.limit_tps * (1 - margin)
    return ch.value_ms > ch.limit_ms * (1 + margin)


def _ruled_by_neighbours(
    cfg: TrialConfig, ev: Evidence, prior: Prior, dominance_margin: float
) -> Ruling | None:
    """Why `cfg` need not run, given what was measured (out of memory, KV-capped, SLO miss,
    twin), or None. A measurement that was not valid rules nothing out."""
    dims = memory_dims(cfg)
    for other, m in ev.measured.items():
        if m.status == "invalid" or other.gpu != cfg.gpu:  # another pool's GPUs rule nothing here
            continue
        larger = all(a >= b for a, b in zip(dims, memory_dims(other), strict=True))
        if m.status == "oom" and larger:
            return Ruling(Exclusion.OUT_OF_MEMORY, other)
        if larger and cfg.max_batch_size >= other.max_batch_size and m.capped(other.max_batch_size):
            held = f"held only {m.concurrency:.0f} of its {other.max_batch_size} sequences"
            return Ruling(Exclusion.KV_CAPPED, other, detail=held)
        same = (other.tp, kernels(other.quantization), other.kv_cache_dtype) == (
            cfg.tp, kernels(cfg.quantization), cfg.kv_cache_dtype,
        )  # fmt: skip
        if m.status != "ok" or not same:
            continue
        for ch in ev.checks.get(other, []):
            if not _clear_miss(ch, dominance_margin):
                continue
            if isinstance(ch, FloorCheck):
                if cfg.max_batch_size < other.max_batch_size:
                    return Ruling(Exclusion.SLO_MISS, other, ch.bound, "floor")
            elif cfg.max_batch_size > other.max_batch_size:
                return Ruling(Exclusion.SLO_MISS, other, ch.bound)
    key = twin(cfg)
    for other, m in ev.measured.items():
        if other != cfg and m.status != "invalid" and twin(other) == key:
            return Ruling(Exclusion.TWIN, other)
    return None


def verdicts(
    ev: Evidence,
    prior: Prior,
    settings: SearchSettings,
    failures: FailureModel | None = None,
) -> dict[TrialConfig, Ruling | None]:
    """Every configuration of the space: None when it is a candidate, else why it is not
    (`failures`: the failure model of `ev`, when already learnt)."""
    if failures is None:
        failures = FailureModel.learn(ev, prior.space, settings)
    out: dict[TrialConfig, Ruling | None] = {}
    excluded = failures.excluded
    for cfg in prior.space.configs:
        if prior.margin[cfg] < -settings.wide_margin:
            out[cfg] = Ruling(Exclusion.MEMORY, detail=prior.predictions[cfg].memory.reason)
        elif cfg in ev.measured:
            out[cfg] = Ruling(Exclusion.MEASURED)
        elif cfg in ev.in_flight:
            out[cfg] = Ruling(Exclusion.IN_FLIGHT)
        else:
            out[cfg] = _ruled_by_neighbours(cfg, ev, prior, settings.dominance_margin)
            if out[cfg] is None and cfg in excluded:
                sig, by = excluded[cfg]
                out[cfg] = Ruling(Exclusion.FAILED, by, detail=sig.label())
    return out


# ------------------------------------------------------------------ the kernel


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter setting of the kernel: the shared error, the shape error and its
    length per feature, and the size of the slope along each trend feature (empty: none)."""

    sigma_global: float
    sigma_local: float
    lengths: tuple[float, ...]
    trends: tuple[float, ...] = ()

    def as_log(self) -> np.ndarray:
        return np.log([self.sigma_global, self.sigma_local, *self.lengths, *self.trends])

    @classmethod
    def from_log(cls, v: Sequence[float]) -> Hyper:
        e = [float(math.exp(x)) for x in v]
        n = len(FEATURES)
        return cls(e[0], e[1], tuple(e[2 : 2 + n]), tuple(e[2 + n :]))


def trend_coordinates(x: np.ndarray) -> np.ndarray:
    """Feature rows' distances from TREND_CENTRE along the trend features."""
    return np.asarray(x)[:, list(TREND_FEATURES)] - TREND_CENTRE


@dataclass(frozen=True)
class Terms:
    """The kernel's parts between rows a and b, kept apart for the hyperprior fit's gradient."""

    diff2: np.ndarray  # (A, B, features): (a_d - b_d)^2
    shape: np.ndarray  # (A, B): E
    trend: tuple[np.ndarray, ...]  # per trend feature j: u_j(a) u_j(b), without trend_j^2


def terms(a: np.ndarray, b: np.ndarray, lengths: Sequence[float], n_trends: int) -> Terms:
    diff2 = (a[:, None, :] - b[None, :, :]) ** 2
    shape = np.exp(-0.5 * (diff2 / np.asarray(lengths) ** 2).sum(axis=2))
    ua, ub = trend_coordinates(a), trend_coordinates(b)
    trend = tuple(np.outer(ua[:, j], ub[:, j]) for j in range(n_trends))
    return Terms(diff2, shape, trend)


def kernel(a: np.ndarray, b: np.ndarray, h: Hyper) -> np.ndarray:
    """k(a_i, b_j) for feature rows `a` and `b` under setting `h`; rows with pool coordinates
    (`pool_coordinates`) multiply it by the pools' correlation, their coordinates' product."""
    n = len(FEATURES)
    t = terms(a[:, :n], b[:, :n], h.lengths, len(h.trends))
    k = h.sigma_global**2 + h.sigma_local**2 * t.shape
    for s, part in zip(h.trends, t.trend, strict=True):
        k = k + s**2 * part
    if a.shape[1] > n and b.shape[1] > n:
        k = k * (a[:, n:] @ b[:, n:].T)
    return k


def pool_coordinates(gpus: Sequence[Gpu], correlation: float) -> dict[str, np.ndarray]:
    """Per pool, coordinates whose products are the correlation of the model's error between
    two pools: 1 on one pool, `correlation` between two products of one architecture (the same
    kernels, the same software), 0 across architectures (other kernels: the model's error on
    one says nothing of the other). sqrt(c) x one-hot(architecture) ++ sqrt(1 - c) x
    one-hot(product): a valid (positive semi-definite) correlation for any c in [0, 1]."""
    archs = sorted({g.architecture for g in gpus})
    keys = [g.key for g in gpus]
    out = {}
    for g in gpus:
        arch = np.array([a == g.architecture for a in archs], dtype=float)
        own = np.array([k == g.key for k in keys], dtype=float)
        out[g.key] = np.concatenate(
            [math.sqrt(correlation) * arch, math.sqrt(1 - correlation) * own]
        )
    return out


def prior_variance(x: np.ndarray, h: Hyper) -> np.ndarray:
    """k(x_i, x_i): the kernel's diagonal at feature rows `x`."""
    var = np.full(len(x), h.sigma_global**2 + h.sigma_local**2)
    if h.trends:
        st = np.asarray(h.trends)
        var = var + ((trend_coordinates(x)[:, : len(st)] * st) ** 2).sum(axis=1)
    return var


# ------------------------------------------------------------------ one quantity's posterior


@dataclass(frozen=True)
class Observation:
    """One measured configuration: log(measured / predicted) and how many runs it averages."""

    config: TrialConfig
    log_ratio: float
    repeats: int = 1


@dataclass(frozen=True)
class _Component:
    """The GP under one hyperparameter setting, conditioned on the observations."""

    hyper: Hyper
    weight: float
    chol: np.ndarray | None
    alpha: np.ndarray


def _condition(x: np.ndarray, y: np.ndarray, noise_var: np.ndarray, h: Hyper) -> tuple[
    float, np.ndarray, np.ndarray
]:  # fmt: skip
    """(log marginal likelihood, Cholesky factor, alpha) of the observations under `h`."""
    k = kernel(x, x, h) + np.diag(noise_var + _JITTER)
    chol = np.linalg.cholesky(k)
    z = np.linalg.solve(chol, y)
    alpha = np.linalg.solve(chol.T, z)
    ll = (
        -0.5 * float(z @ z)
        - float(np.log(np.diag(chol)).sum())
        - 0.5 * len(y) * math.log(2 * math.pi)
    )
    return ll, chol, alpha


def noise_of(key: QuantityKey, run_noise: Mapping[str, float]) -> float:
    """Prior run-to-run noise of a quantity (`run_noise` by 'tps' and by percentile)."""
    return run_noise["tps"] if key == TPS else run_noise.get(key.percentile, run_noise["p95"])


def learned_noise(
    key: QuantityKey,
    repeats: Sequence[Sequence[float]],
    run_noise: Mapping[str, float],
    weight: float,
) -> float:
    """Noise of `key` learned from repeated measurements (log values per configuration): the
    pooled within-configuration variance, shrunk towards the prior (a scaled inverse-chi-square
    posterior mean with `weight` degrees of freedom), never below the prior: a pool may be
    noisier than assumed, and a few lucky repeats must not make the search over-confident."""
    prior = noise_of(key, run_noise)
    ss = sum(float(np.sum((np.asarray(r) - np.mean(r)) ** 2)) for r in repeats if len(r) > 1)
    dof = sum(len(r) - 1 for r in repeats if len(r) > 1)
    pooled = math.sqrt((weight * prior**2 + ss) / (weight + dof))
    return max(prior, pooled)


@dataclass
class Quantity:
    """The posterior of one quantity's log-residual: a mixture over hyperparameter settings."""

    key: QuantityKey
    train_x: np.ndarray
    components: tuple[_Component, ...]
    noise: float

    @classmethod
    def fit(
        cls,
        key: QuantityKey,
        x: np.ndarray,
        observations: Sequence[Observation],
        *,
        particles: Sequence[Hyper],
        noise: float,
        keep_mass: float,
        max_components: int,
    ) -> Quantity:
        """Condition the quantity's GP on its observations (feature rows `x`), weighing the
        settings `particles` by their marginal likelihood; the mixture keeps the heaviest
        settings holding `keep_mass` of the weight, at most `max_components`."""
        if not observations:
            comps = tuple(_Component(h, 1.0 / len(particles), None, np.zeros(0)) for h in particles)
            return cls(key, np.zeros((0, len(FEATURES))), _prune(comps, keep_mass, max_components), noise)  # fmt: skip
        y = np.array([o.log_ratio for o in observations])
        noise_var = np.array([noise**2 / max(o.repeats, 1) for o in observations])
        fitted, lls = [], []
        for h in particles:
            try:
                ll, chol, alpha = _condition(x, y, noise_var, h)
            except np.linalg.LinAlgError:
                continue
            if not math.isfinite(ll):
                continue
            fitted.append((h, chol, alpha))
            lls.append(ll)
        if not fitted:  # the noise on the diagonal keeps every setting positive definite
            raise ValueError(f"{key}: no hyperparameter setting gives a finite likelihood")
        w = np.exp(np.array(lls) - max(lls))
        w /= w.sum()
        comps = tuple(
            _Component(h, float(wi), c, a) for (h, c, a), wi in zip(fitted, w, strict=True)
        )
        return cls(key, x, _prune(comps, keep_mass, max_components), noise)

    def _moments(self, x: np.ndarray, c: _Component) -> tuple[np.ndarray, np.ndarray]:
        prior_var = prior_variance(x, c.hyper)
        if c.chol is None:
            return np.zeros(len(x)), prior_var
        cross = kernel(self.train_x, x, c.hyper)
        v = np.linalg.solve(c.chol, cross)
        return cross.T @ c.alpha, np.clip(prior_var - (v * v).sum(axis=0), 1e-12, None)

    def moments(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per mixture component: its weight (C), and its mean and standard deviation at each
        feature row (C x len(x))."""
        weights = np.array([c.weight for c in self.components])
        pairs = [self._moments(x, c) for c in self.components]
        mean = np.array([mu for mu, _ in pairs]).reshape(len(pairs), len(x))
        sd = np.sqrt(np.array([var for _, var in pairs])).reshape(len(pairs), len(x))
        return weights, mean, sd

    def marginal(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the mixture (no joint structure)."""
        if not len(x):
            return np.zeros(0), np.zeros(0)
        mean, second = np.zeros(len(x)), np.zeros(len(x))
        for c in self.components:
            mu, var = self._moments(x, c)
            mean += c.weight * mu
            second += c.weight * (var + mu**2)
        return mean, np.sqrt(np.clip(second - mean**2, 0.0, None))

    def probability(self, x: np.ndarray, bound: np.ndarray | float, *, below: bool) -> np.ndarray:
        """P(log-residual < bound) (`below`) or > bound at each feature row, under the mixture."""
        if not len(x):
            return np.zeros(0)
        out = np.zeros(len(x))
        for c in self.components:
            mu, var = self._moments(x, c)
            z = (np.asarray(bound) - mu) / np.sqrt(var)
            out += c.weight * ndtr(z if below else -z)
        return out

    def sample(self, x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` joint draws of the log-residual at feature rows `x` (n x len(x)): each draw picks
        a setting by its weight, then draws from that setting's posterior. Equal rows (twins)
        share their draws."""
        if not len(x):
            return np.zeros((n, 0))
        keys = [tuple(row) for row in x]
        unique = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(unique)}
        ux = np.array(unique)
        weights = np.array([c.weight for c in self.components])
        which = rng.choice(len(self.components), size=n, p=weights / weights.sum())
        draws = np.zeros((n, len(unique)))
        for i, c in enumerate(self.components):
            rows = np.flatnonzero(which == i)
            if not len(rows):
                continue
            mean, cov = self._joint(ux, c)
            scale = float(prior_variance(ux, c.hyper).max())
            try:
                root = np.linalg.cholesky(cov + np.eye(len(ux)) * 1e-9 * scale)
            except np.linalg.LinAlgError:  # numerically not positive definite: fall back
                vals, vecs = np.linalg.eigh(cov)
                root = vecs * np.sqrt(np.clip(vals, 0.0, None))
            draws[rows] = mean + rng.standard_normal((len(rows), len(ux))) @ root.T
        return draws[:, [where[k] for k in keys]]

    def _joint(self, x: np.ndarray, c: _Component) -> tuple[np.ndarray, np.ndarray]:
        prior = kernel(x, x, c.hyper)
        if c.chol is None:
            return np.zeros(len(x)), prior
        cross = kernel(self.train_x, x, c.hyper)
        v = np.linalg.solve(c.chol, cross)
        return cross.T @ c.alpha, prior - v.T @ v

    def shape_error(self) -> float:
        """The posterior's shape-error scale: the weighted mean of sigma_local."""
        return float(sum(c.weight * c.hyper.sigma_local for c in self.components))


def _prune(
    comps: tuple[_Component, ...], keep_mass: float, max_components: int
) -> tuple[_Component, ...]:
    """The heaviest settings holding `keep_mass` of the weight (at most `max_components`),
    renormalised."""
    ordered = sorted(comps, key=lambda c: -c.weight)
    kept, mass = [], 0.0
    for c in ordered:
        kept.append(c)
        mass += c.weight
        if mass >= keep_mass or len(kept) >= max_components:
            break
    total = sum(c.weight for c in kept)
    return tuple(_Component(c.hyper, c.weight / total, c.chol, c.alpha) for c in kept)


# ------------------------------------------------------------------ the run's residuals


@dataclass(frozen=True)
class Residuals:
    """Per quantity (TPS and each bound's), the observations log(measured / predicted)
    and each one's repeats (log scale); `own` and `own_repeats` hold, per bound key, the part
    not tied to tok/s/GPU (all of it when untied). A KV-capped run says how much memory there
    was, not how fast the shapes are: memory evidence, not an observation here."""

    observations: dict[QuantityKey, list[Observation]]
    repeats: dict[QuantityKey, list[list[float]]]
    own: dict[QuantityKey, list[Observation]]
    own_repeats: dict[QuantityKey, list[list[float]]]
    by_config: dict[QuantityKey, dict[TrialConfig, float]]  # the observations, by configuration
    own_by_config: dict[QuantityKey, dict[TrialConfig, float]]


def residuals(ev: Evidence, prior: Prior) -> Residuals:
    """The observations of every quantity from the evidence's valid runs."""
    keys = [b.key for b in prior.bounds]
    obs: dict[QuantityKey, list[Observation]] = {TPS: []}
    obs.update({k: [] for k in keys})
    reps: dict[QuantityKey, list[list[float]]] = {k: [] for k in obs}
    own: dict[QuantityKey, list[Observation]] = {k: [] for k in keys}
    own_reps: dict[QuantityKey, list[list[float]]] = {k: [] for k in keys}

    def add(into: dict[QuantityKey, list[Observation]], runs_into: dict[QuantityKey, list[list[float]]],
            key: QuantityKey, cfg: TrialConfig, logs: list[float]) -> None:  # fmt: skip
        runs_into[key].append(logs)
        into[key].append(Observation(cfg, sum(logs) / len(logs), len(logs)))

    for cfg, runs in ev.runs.items():
        ok = [m for m in runs if m.status == "ok" and m.output_tokens_per_s_per_gpu]
        tps = prior.tps.get(cfg)
        if not ok or tps is None or ev.measured[cfg].status != "ok":
            continue
        if any(m.capped(cfg.max_batch_size) for m in ok):
            continue  # queueing behind a full KV cache, not the model's shape: memory evidence
        tps_logs = [math.log((m.output_tokens_per_s_per_gpu or 0.0) / tps) for m in ok]
        add(obs, reps, TPS, cfg, tps_logs)
        for b in prior.bounds:
            pairs = [
                (math.log(max(pm.get(b.bound.percentile), 1e-6) / b.predicted[cfg]), t)
                for m, t in zip(ok, tps_logs, strict=True)
                if (pm := m.percentiles(b.bound.metric))
            ]
            if pairs:
                add(obs, reps, b.key, cfg, [v for v, _ in pairs])
                add(own, own_reps, b.key, cfg, [v - b.tie * t for v, t in pairs])
    return Residuals(
        obs, reps, own, own_reps,
        by_config={k: {o.config: o.log_ratio for o in v} for k, v in obs.items()},
        own_by_config={k: {o.config: o.log_ratio for o in v} for k, v in own.items()},
    )  # fmt: skip


# ------------------------------------------------------------------ the joint posterior


@cache
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.legendre.leggauss(n)
    return nodes, weights


@dataclass(frozen=True)
class Posterior:
    """tok/s/GPU's posterior and, per SLO bound key, the posterior of its own part; a
    configuration's features come from the prior."""

    tps: Quantity
    own: Mapping[QuantityKey, Quantity]
    ties: Mapping[QuantityKey, float]
    features: Mapping[TrialConfig, np.ndarray]
    nodes: int  # Gauss-Legendre nodes of `success`

    @classmethod
    def fit(cls, r: Residuals, prior: Prior, settings: SearchSettings) -> Posterior:
        """Condition every quantity on the run's residuals."""
        feats = prior.features

        def quantity(
            key: QuantityKey, obs: Sequence[Observation], repeats: Sequence[Sequence[float]]
        ) -> Quantity:
            x = np.array([feats[o.config] for o in obs])
            return Quantity.fit(
                key, x, obs, particles=prior.particles[key],
                noise=learned_noise(key, repeats, settings.run_noise, settings.noise_prior_weight),
                keep_mass=settings.keep_mass, max_components=settings.max_components,
            )  # fmt: skip

        return cls(
            tps=quantity(TPS, r.observations[TPS], r.repeats[TPS]),
            own={k: quantity(k, v, r.own_repeats[k]) for k, v in r.own.items()},
            ties={b.key: b.tie for b in prior.bounds},
            features=feats,
            nodes=settings.legendre_nodes,
        )

    def x(self, configs: Sequence[TrialConfig]) -> np.ndarray:
        width = len(next(iter(self.features.values()), np.zeros(len(FEATURES))))
        return np.array([self.features[c] for c in configs]).reshape(len(configs), width)

    def mean(self, key: QuantityKey, configs: Sequence[TrialConfig]) -> np.ndarray:
        """Posterior mean log-error of a quantity (TPS or a bound's) at `configs`."""
        x = self.x(configs)
        tps = self.tps.marginal(x)[0]
        if key == TPS:
            return tps
        return self.ties[key] * tps + self.own[key].marginal(x)[0]

    def sample(
        self, configs: Sequence[TrialConfig], n: int, rng: np.random.Generator,
        bounded: Sequence[TrialConfig],
    ) -> tuple[np.ndarray, dict[QuantityKey, np.ndarray]]:  # fmt: skip
        """Joint draws: the tok/s/GPU log-error at `configs` (n x len(configs)) and each bound
        quantity's at `bounded`, the first len(bounded) of `configs` (n x len(bounded))."""
        tps = self.tps.sample(self.x(configs), n, rng)
        k = len(bounded)
        xb = self.x(bounded)
        lat = {
            key: self.ties[key] * tps[:, :k] + q.sample(xb, n, rng) for key, q in self.own.items()
        }
        return tps, lat

    def success(
        self, configs: Sequence[TrialConfig], log_bounds: Mapping[QuantityKey, np.ndarray],
        tps_above: np.ndarray | None,
    ) -> np.ndarray:  # fmt: skip
        """Per configuration, P(every bound quantity's log-error < its log bound, and the
        tok/s/GPU log-error > `tps_above` where given), each configuration on its own.

        Integrates over the tok/s/GPU error (each mixture component on Gauss-Legendre nodes of
        its probability scale above `tps_above`); given it, the bounds' own parts are
        independent mixtures."""
        n = len(configs)
        if n == 0:
            return np.zeros(0)
        nodes, node_weights = _legendre(self.nodes)
        x = self.x(configs)
        w, mu, sd = self.tps.moments(x)  # (C,), (C, n), (C, n)
        low = np.full(n, -np.inf) if tps_above is None else np.asarray(tps_above, dtype=float)
        u0 = ndtr((low[None, :] - mu) / sd)  # (C, n): P(below the threshold) per component
        u = u0[..., None] + (1 - u0[..., None]) * (nodes + 1) / 2  # (C, n, J)
        r = mu[..., None] + sd[..., None] * ndtri(np.clip(u, 1e-12, 1 - 1e-12))
        given = np.ones_like(r)
        for key, bound in log_bounds.items():
            ow, om, osd = self.own[key].moments(x)  # (E,), (E, n), (E, n)
            limit = np.asarray(bound, dtype=float)[None, :, None] - self.ties[key] * r  # (C, n, J)
            z = (limit[None] - om[:, None, :, None]) / osd[:, None, :, None]  # (E, C, n, J)
            given *= np.tensordot(ow, ndtr(z), axes=1)
        inner = (given * (node_weights / 2)).sum(axis=-1)  # (C, n)
        return np.clip(w @ ((1 - u0) * inner), 0.0, 1.0)


def log_bound(bound_ms: float, predicted_ms: np.ndarray) -> np.ndarray:
    """The log-error at which a prediction just meets a bound."""
    return math.log(bound_ms) - np.log(predicted_ms)


# ------------------------------------------------------------------ the memory frontier


@dataclass
class MemoryFit:
    """The posterior of delta, the memory model's error on this pool, on a grid: a
    configuration fits when margin + delta > 0. A priori N(0, prior^2); every measured outcome
    updates it (a configuration that ran says delta > -margin, an out-of-memory or a KV-capped
    run says delta < -margin), with a soft step for the allocator's rounding."""

    grid: np.ndarray
    weights: np.ndarray
    softness: float

    @classmethod
    def learn(cls, outcomes: Iterable[tuple[float, bool]], settings: SearchSettings) -> MemoryFit:
        """The posterior of delta given measured outcomes: (memory margin, fitted) for every
        measured configuration (`memory_outcomes`)."""
        grid = np.linspace(
            -settings.memory_grid_half_width,
            settings.memory_grid_half_width,
            settings.memory_grid_points,
        )
        logp = -0.5 * (grid / settings.memory_error_prior) ** 2
        for margin, ran in outcomes:
            z = (margin + grid) / settings.memory_softness
            like = ndtr(z) if ran else ndtr(-z)
            logp = logp + np.log(np.clip(like, 1e-300, None))
        w = np.exp(logp - logp.max())
        return cls(grid, w / w.sum(), settings.memory_softness)

    def probability(self, margins: np.ndarray) -> np.ndarray:
        """P(fits) for each margin."""
        z = (margins[:, None] + self.grid[None, :]) / self.softness
        return np.asarray(ndtr(z) @ self.weights)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` draws of delta (fit of a configuration in draw s: margin + delta_s > 0)."""
        return np.asarray(rng.choice(self.grid, size=n, p=self.weights))


def memory_outcomes(ev: Evidence, prior: Prior) -> list[tuple[float, bool]]:
    """(memory margin, fitted) of every measured configuration that ran or ran out of memory:
    fitted is False for an out-of-memory and for a run whose KV cache capped its batch."""
    return [
        (prior.margin[c], m.status != "oom" and not m.capped(c.max_batch_size))
        for c, m in ev.measured.items()
        if c in prior.margin and m.status in ("ok", "oom")
    ]


# ------------------------------------------------------------------ belief

BELIEVED = "believed: a trial in flight, at its posterior mean"


def _believe(ev: Evidence, prior: Prior, settings: SearchSettings) -> Evidence:
    """`ev` with a believed run for each unmeasured configuration in flight: its prediction
    corrected by the posterior mean (an OOM where it more likely does not fit); still in flight."""
    flying = sorted(c for c in ev.in_flight - set(ev.measured) if c in prior.predictions)
    if not flying:
        return ev
    p_fit = MemoryFit.learn(memory_outcomes(ev, prior), settings).probability(
        np.array([prior.margin[c] for c in flying])
    )
    post = Posterior.fit(residuals(ev, prior), prior, settings)
    runs = dict(ev.runs)
    tps_shift = post.mean(TPS, flying)
    shifts = {key: post.mean(key, flying) for key in post.own}
    for i, cfg in enumerate(flying):
        if p_fit[i] < 0.5:
            runs[cfg] = (Measurement.failed("oom", BELIEVED),)
            continue
        p = prior.predictions[cfg]
        latency: dict[str, Percentiles | None] = {}
        for metric in LATENCY_METRICS:
            base = metric.of(p)
            latency[metric.key] = Percentiles(*(
                base.get(q) * math.exp(float(shifts[k][i]) if (k := QuantityKey(metric.key, q)) in shifts else 0.0)
                for q in PERCENTILES
            ))  # fmt: skip
        runs[cfg] = (
            Measurement.ok(
                latency,
                output_tokens_per_s_per_gpu=p.output_tokens_per_s_per_gpu * math.exp(tps_shift[i]),
                concurrency=cfg.max_batch_size,
                reason=BELIEVED,
            ),
        )
    return Evidence(prior.request, runs, ev.in_flight, ev.covers, ev.transient_retries)


# ------------------------------------------------------------------ the assessment


@dataclass(frozen=True)
class Assessment:
    """The joint posterior over the configurations that could still change the answer.

    Arrays are indexed like `pool`: the untried candidates, then the in-flight configurations,
    then the measured feasible ones (whose true tok/s/GPU is known only up to noise)."""

    evidence: Evidence  # what the assessment rests on (trials in flight believed)
    verdicts: Mapping[TrialConfig, Ruling | None]  # every configuration of the space
    failures: FailureModel  # which configurations can run, from the failures seen
    residuals: Residuals
    best: TrialConfig | None
    best_tps: float
    candidates: list[TrialConfig]  # untried, not ruled out
    pool: list[TrialConfig]
    index: Mapping[TrialConfig, int]  # position in `pool`
    p_beat: np.ndarray  # P(succeeds and beats the incumbent by > improvement)
    p_success: np.ndarray  # P(fits and meets every SLO bound); 1 for measured feasible ones
    p_fit: np.ndarray
    gain: np.ndarray  # expected gain over incumbent * (1 + improvement), in the objective
    estimate: np.ndarray  # the posterior's median objective (tok/s/GPU on one pool)
    p_any: float  # P(some configuration, measured or not, beats the incumbent)
    p_untried: float  # P(some untried or in-flight configuration beats the incumbent)
    confidence: float  # 1 - p_any: the optimum was found


def _marginal(
    cands: list[TrialConfig],
    post: Posterior,
    fit: MemoryFit,
    threshold: float,
    prior: Prior,
    runs: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate on its own (no correlation between candidates): P(success), P(fit) and
    P(succeeds and beats `threshold`); `runs`: each candidate's chance to run."""
    if not cands:
        z = np.zeros(0)
        return z, z, z
    log_prior = np.log([prior.tps[c] for c in cands])
    log_worth = np.log([prior.worth[c] for c in cands])
    bounds: dict[QuantityKey, np.ndarray] = {}
    for b in prior.bounds:
        limit = log_bound(b.bound.max_ms, np.array([b.predicted[c] for c in cands]))
        bounds[b.key] = np.minimum(bounds[b.key], limit) if b.key in bounds else limit
    floor = prior.request.min_output_tokens_per_s_per_gpu
    low = None if floor is None else math.log(floor) - log_prior
    p_fit = fit.probability(np.array([prior.margin[c] for c in cands]))
    p_success = post.success(cands, bounds, low) * p_fit * runs
    if threshold <= 0:
        return p_success, p_fit, p_success
    above = math.log(threshold) - log_prior - log_worth  # the threshold is an objective
    above = above if low is None else np.maximum(above, low)
    return p_success, p_fit, post.success(cands, bounds, above) * p_fit * runs


def assess(
    ev: Evidence,
    prior: Prior,
    settings: SearchSettings,
    *,
    seed: int = 0,
    include_in_flight: bool = True,
    failures: FailureModel | None = None,
) -> Assessment:
    """Believe what is in flight, classify every configuration, fit the posterior and sample it
    jointly over the untried, in-flight and measured feasible configurations.

    Candidates whose marginal chance to beat the incumbent is negligible (< `negligible`, with
    the incumbent's own noise allowed for) are left out of the joint draws; they keep their
    marginal probabilities.

    Args:
        ev: What the study has measured and has in flight.
        prior: The space's predictions and fixed facts.
        settings: The search's constants.
        seed: The study's seed (the draws are seeded by it, the runs that count and the pool).
        include_in_flight: Believe and count in-flight configurations (a search must not stop
            while one may still win; the report leaves them out).
        failures: The failure model of `ev` (failures.py), when already learnt.
    """
    st = settings
    # What ran and what failed; a trial in flight is not believed to run (its structure may be
    # the one that fails).
    if failures is None:
        failures = FailureModel.learn(ev, prior.space, st, seed=seed)
    ev = _believe(ev, prior, st) if include_in_flight else ev
    ruled = verdicts(ev, prior, st, failures)
    cands = [c for c in prior.universe if ruled[c] is None]
    flying = sorted(ev.in_flight - set(ev.measured)) if include_in_flight else []
    best = ev.best
    feasible = sorted(ev.feasible)
    r = residuals(ev, prior)
    post = Posterior.fit(r, prior, st)
    fit_model = MemoryFit.learn(memory_outcomes(ev, prior), st)
    slack = 0.0
    if best is not None:
        slack = st.incumbent_slack_sds * float(post.tps.marginal(post.x([best]))[1][0])
    threshold = ev.best_tps * (1 + st.improvement) * math.exp(-slack)
    m_success, m_fit, m_beat = _marginal(
        cands, post, fit_model, threshold, prior, np.array([failures.p_runs[c] for c in cands])
    )
    order = np.argsort(-m_beat, kind="stable")
    keep = [i for i in order if m_beat[i] >= st.negligible] or list(order[:1])
    keep = sorted(set(keep) | set(order[: st.joint_at_least].tolist()))
    joint = [cands[i] for i in keep] + flying
    pool = joint + feasible
    n, m = st.draws, len(pool)
    rng = np.random.default_rng([seed, ev.counted_runs, m])
    prior_tps = np.array([prior.tps[c] for c in pool])
    tps_err, lat_err = post.sample(pool, n, rng, joint)
    tps = prior_tps * np.exp(tps_err)
    value = tps * np.array([prior.worth[c] for c in pool])[None, :]  # the objective
    untested = len(joint)
    success = np.ones((n, m), dtype=bool)
    for b in prior.bounds:
        pred = np.array([b.predicted[c] for c in joint])
        success[:, :untested] &= pred * np.exp(lat_err[b.key]) <= b.bound.max_ms
    if prior.request.min_output_tokens_per_s_per_gpu is not None:
        success[:, :untested] &= tps[:, :untested] >= prior.request.min_output_tokens_per_s_per_gpu
    margins = np.array([prior.margin[c] for c in joint])
    delta = fit_model.sample(n, rng)
    success[:, :untested] &= (margins[None, :] + delta[:, None]) > 0
    if failures.draws is not None:  # configurations of one broken structure fail together
        column = {c: i for i, c in enumerate(prior.space.configs)}
        success[:, :untested] &= failures.draws[:, [column[c] for c in joint]]
    if best is not None:
        inc = pool.index(best)
        line = (1 + st.improvement) * value[:, inc : inc + 1]
        beats = success & (value > line)
        beats[:, inc] = False
    else:
        line = np.zeros((n, 1))
        beats = success.copy()
    gain = np.where(beats, value - line, 0.0).mean(axis=0)
    # Arrays over all candidates (marginal where not drawn jointly), then the rest of the pool.
    full = cands + flying + feasible
    p_beat = np.concatenate([m_beat, np.zeros(len(flying) + len(feasible))])
    p_success = np.concatenate([m_success, np.ones(len(flying) + len(feasible))])
    p_fit = np.concatenate([m_fit, np.ones(len(flying) + len(feasible))])
    g = np.zeros(len(full))
    for j, c in enumerate(pool):
        i = full.index(c) if j >= len(keep) else keep[j]
        p_beat[i], p_success[i], g[i] = beats[:, j].mean(), success[:, j].mean(), gain[j]
    p_any = float(beats.any(axis=1).mean()) if m else 0.0
    return Assessment(
        evidence=ev,
        verdicts=ruled,
        failures=failures,
        residuals=r,
        best=best,
        best_tps=ev.best_tps,
        candidates=cands,
        pool=full,
        index={c: i for i, c in enumerate(full)},
        p_beat=p_beat,
        p_success=p_success,
        p_fit=p_fit,
        gain=g,
        estimate=np.array([prior.objective[c] for c in full])
        * np.exp(post.tps.marginal(post.x(full))[0]),
        p_any=p_any,
        p_untried=float(beats[:, :untested].any(axis=1).mean()) if untested else 0.0,
        confidence=1.0 - p_any,
    )
