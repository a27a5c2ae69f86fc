"""What failed trials say: which configurations can run (pure: no Optuna, no I/O).

A real pool fails by structure: a quantization whose kernels do not load on this GPU and
TensorRT-LLM version, TP 8 whose NCCL set-up dies, the FP8 KV cache with one attention backend,
batches above what an engine was built for. A failure is evidence about every configuration
that shares its structure, and the search should stop paying for what cannot run.

**The model.** A *group* is a structure a cause could live in: one value of a dimension
(quantization `fp8`, KV cache `fp8`, `TP8`, `TP>1`, `batch >= 128`) or a pair of values of two
dimensions (`w4a16_awq` at `TP>1`, `fp8` with KV `fp8`). A group is *broken* when every
configuration in it fails with one signature (signatures.py: the normalised first error line and
the phase it died in). A priori a configuration sits in a broken group with `failure_prior`,
spread over its groups by family: each dimension weighs one (its values share it: the batch
thresholds one weight between them, `TPn` and `TP>1` one), a pair of dimensions `pair_prior`;
a configuration of working groups fails on its own with
`isolated_failure`; and two causes leaving the same signature is a coincidence of
`same_signature`. A group in which something ran (measured, out of memory, or failed with
another signature) is not broken. Per signature, the failures and the groups that could explain
them are enumerated exactly (the groups that cover the same failures form one pattern): the
posterior says which failures one structure explains, and how likely each untried configuration
is to lie in a broken group. Failures that share a signature and a structure make that structure
implausible; an isolated failure is evidence against its own configuration mostly, and against
its neighbours only as far as nothing near them ran.

**What the search does with it.** Each candidate's chance to succeed is multiplied by its chance
to run (`FailureModel.p_runs`), in the joint draws too (`FailureModel.sample`: configurations of
one broken group fail together). A configuration whose chance to run, counting only structures
that two or more failures of one signature point at, is below `exclude_below` is excluded, with
the failures that exclude it (posterior.verdicts). A structure is presumed to run until a failure
in it is seen: with no failure the model changes nothing.

Transient failures (a load that timed out, a reset connection, an evicted pod: signatures.py)
are not evidence until the configuration failed so `transient_retries` + 1 times
(evidence.Evidence): the search re-runs it first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from infertune_tuner.config import TrialConfig
from infertune_tuner.signatures import Signature
from infertune_tuner.space import SearchSpace

if TYPE_CHECKING:
    from infertune_tuner.search.evidence import Evidence
    from infertune_tuner.search.settings import SearchSettings

Atom = tuple[str, str]  # (dimension, value): ("quantization", "fp8"), ("batch", ">=128")
Group = frozenset[Atom]  # one atom, or two of different dimensions
# Patterns enumerated per signature (2^n subsets): beyond it the least-covering are dropped.
MAX_PATTERNS = 10


def atoms(cfg: TrialConfig, space: SearchSpace) -> frozenset[Atom]:
    """The values of `cfg` a cause could be tied to. A dimension with one value in the space
    names no structure (its failures are the whole space's: a broken set-up, which the stop
    rule handles); batch thresholds are `>= b` for each larger batch of the space (an engine
    built for batches up to some limit fails above it)."""
    out: set[Atom] = set()
    if len(space.quantization) > 1:
        out.add(("quantization", cfg.quantization))
    if len(space.kv_cache_dtype) > 1:
        out.add(("kv", cfg.kv_cache_dtype))
    if len(space.tensor_parallel) > 1:
        out.add(("tp", str(cfg.tp)))
        if cfg.tp > 1 and sum(1 for t in space.tensor_parallel if t > 1) > 1:
            out.add(("tp", ">1"))
    out.update(
        ("batch", f">={b}") for b in sorted(space.max_batch_size)[1:] if cfg.max_batch_size >= b
    )
    if len(space.gpus) > 1:  # a pool's nodes (their driver, their image) can break alone
        out.add(("gpu", cfg.gpu))
    return frozenset(out)


def groups_of(a: frozenset[Atom]) -> frozenset[Group]:
    """Every group a configuration with atoms `a` belongs to: each atom, each pair of atoms of
    two dimensions."""
    singles = {frozenset({x}) for x in a}
    pairs = {frozenset({x, y}) for x, y in itertools.combinations(sorted(a), 2) if x[0] != y[0]}
    return frozenset(singles | pairs)


def group_label(g: Group) -> str:
    """`w4a16_awq`, `TP8`, `KV fp8`, `batch >= 128`, `fp8 + KV fp8`, `w4a16_awq at TP>1`."""
    order = {"quantization": 0, "kv": 1, "tp": 2, "batch": 3, "gpu": 4}
    parts = []
    for dim, value in sorted(g, key=lambda x: order[x[0]]):
        parts.append({"quantization": value, "kv": f"KV {value}", "tp": f"TP{value}",
                      "batch": f"batch {value.replace('>=', '>= ')}",
                      "gpu": f"on {value}"}[dim])  # fmt: skip
    return " + ".join(parts)


@dataclass(frozen=True)
class Cause:
    """Failures of one signature that one structure explains, and what it rules out."""

    signature: Signature
    failed: tuple[TrialConfig, ...]  # the failures it explains (two or more)
    structure: str  # the likeliest structure that explains them, as a label ("w4a16_awq")
    probability: float  # that one broken structure explains them


@dataclass(frozen=True)
class _Pattern:
    covers: np.ndarray  # bool over the signature's failures
    groups: tuple[Group, ...]


@dataclass(frozen=True)
class _Signature:
    """One signature's failures, the patterns that could explain them and their posterior."""

    signature: Signature
    failed: tuple[TrialConfig, ...]
    patterns: tuple[_Pattern, ...]
    subsets: np.ndarray  # (2^P, P) bool: which patterns are active
    weights: np.ndarray  # posterior of each subset


@dataclass(frozen=True)
class FailureModel:
    """P(runs) per configuration of the space, learned from the study's failures."""

    space: SearchSpace
    prior: Mapping[Group, float]  # per group of the space's configurations (failures seen)
    signatures: tuple[_Signature, ...] = ()
    p_runs: Mapping[TrialConfig, float] = field(default_factory=dict)
    # P(runs) counting only structures that two or more failures of one signature point at.
    p_runs_structural: Mapping[TrialConfig, float] = field(default_factory=dict)
    # The configurations excluded (that P below `exclude_below`), each with the signature and
    # one failed configuration of the structure that rules it out.
    excluded: Mapping[TrialConfig, tuple[Signature, TrialConfig]] = field(default_factory=dict)
    # `settings.draws` joint draws over the space's configurations (columns in its order) of
    # whether each runs: configurations of one broken group fail together. None: all run.
    draws: np.ndarray | None = None
    _atoms: Mapping[TrialConfig, frozenset[Atom]] = field(default_factory=dict)

    @classmethod
    def learn(
        cls, ev: Evidence, space: SearchSpace, settings: SearchSettings, *, seed: int = 0
    ) -> FailureModel:
        """The model of `ev`'s failures over `space` (no failure: every configuration runs;
        `seed`: the study's, for the draws)."""
        configs = space.configs
        at = {c: atoms(c, space) for c in configs}
        for c in ev.measured:
            at.setdefault(c, atoms(c, space))
        if not ev.failures:  # nothing to learn (and no group's prior to weigh)
            ones = {c: 1.0 for c in configs}
            return cls(space, {}, p_runs=ones, p_runs_structural=ones, _atoms=at)
        prior = group_priors(at.values(), space, settings)
        ran_groups: dict[Group, set[Signature | None]] = {}
        for c in ev.measured:
            sig = ev.failures.get(c)
            for g in groups_of(at[c]):
                ran_groups.setdefault(g, set()).add(sig)
        by_sig: dict[Signature, list[TrialConfig]] = {}
        for c, sig in sorted(ev.failures.items()):
            by_sig.setdefault(sig, []).append(c)
        sigs = tuple(
            _posterior(sig, tuple(failed), at, ran_groups, prior, settings)
            for sig, failed in sorted(by_sig.items(), key=lambda kv: kv[1][0])
        )
        p_runs = np.ones(len(configs))
        p_struct = np.ones(len(configs))
        for s in sigs:
            every, structural = _not_blocked(s, configs, at, prior)
            p_runs *= every
            p_struct *= structural
        model = cls(
            space, prior, sigs,
            p_runs=dict(zip(configs, p_runs.tolist(), strict=True)),
            p_runs_structural=dict(zip(configs, p_struct.tolist(), strict=True)),
            _atoms=at,
        )  # fmt: skip
        excluded = {}
        for c, p in model.p_runs_structural.items():
            low = p < settings.exclude_below and c not in ev.measured
            if low and (why := model._blocker(c)) is not None:
                excluded[c] = why
        rng = np.random.default_rng([seed, ev.counted_runs, len(sigs)])
        return replace(model, excluded=excluded, draws=model._sample(configs, settings.draws, rng))

    def _sample(
        self, configs: Sequence[TrialConfig], n: int, rng: np.random.Generator
    ) -> np.ndarray | None:
        """Joint draws (n x len(configs), bool) of whether each configuration runs: one draw
        breaks whole groups, so configurations of one structure fail together."""
        if not self.signatures or not configs:
            return None
        out = np.ones((n, len(configs)), dtype=bool)
        for s in self.signatures:
            picks = rng.choice(len(s.weights), size=n, p=s.weights)
            for j, pattern in enumerate(s.patterns):
                active = s.subsets[picks, j]
                if not active.any():
                    continue
                priors = np.array([self.prior[g] for g in pattern.groups])
                broken = _broken_groups(priors, int(active.sum()), rng)
                member = np.array(
                    [[g <= self._atoms.get(c, frozenset()) for c in configs] for g in pattern.groups]
                )  # fmt: skip
                blocked = (broken.astype(np.int32) @ member.astype(np.int32)) > 0
                out[np.flatnonzero(active)] &= ~blocked
        return out

    def causes(self, threshold: float = 0.5) -> list[Cause]:
        """The structures that explain two or more failures of one signature with probability
        at least `threshold`, the most likely first; each named by its likeliest group (the one
        with the largest prior among those that explain the same failures)."""
        out = []
        for s in self.signatures:
            for j, pattern in enumerate(s.patterns):
                if pattern.covers.sum() < 2:
                    continue
                p = float(s.weights[s.subsets[:, j]].sum())
                if p < threshold:
                    continue
                failed = tuple(c for c, hit in zip(s.failed, pattern.covers, strict=True) if hit)
                likeliest = max(pattern.groups, key=lambda g: (self.prior[g], sorted(g)))
                out.append(Cause(s.signature, failed, group_label(likeliest), round(p, 4)))
        return sorted(out, key=lambda c: (-c.probability, c.failed))

    def _blocker(self, cfg: TrialConfig) -> tuple[Signature, TrialConfig] | None:
        """The signature and one failed configuration whose structure rules `cfg` out most."""
        best: tuple[float, Signature, TrialConfig] | None = None
        a = self._atoms.get(cfg) or atoms(cfg, self.space)
        for s in self.signatures:
            for j, pattern in enumerate(s.patterns):
                if pattern.covers.sum() < 2:
                    continue
                share = sum(1 for g in pattern.groups if g <= a) / len(pattern.groups)
                p = float(s.weights[s.subsets[:, j]].sum()) * share
                if best is None or p > best[0]:
                    first = next(c for c, hit in zip(s.failed, pattern.covers, strict=True) if hit)
                    best = (p, s.signature, first)
        return (best[1], best[2]) if best else None


def group_priors(
    configs_atoms: Iterable[frozenset[Atom]], space: SearchSpace, settings: SearchSettings
) -> dict[Group, float]:
    """Each group's prior chance to be broken: a family's weight (1 per dimension, shared by
    its values in one configuration: the batch thresholds, TPn and TP>1; `pair_prior` times
    that for a pair) scaled so that a typical configuration sits in a broken group with
    `failure_prior`."""
    per_dim = {
        "quantization": 1, "kv": 1, "tp": 2 if sum(1 for t in space.tensor_parallel if t > 1) > 1 else 1,
        "batch": max(len(space.max_batch_size) - 1, 1), "gpu": 1,
    }  # fmt: skip

    def weight(g: Group) -> float:
        w = settings.pair_prior if len(g) == 2 else 1.0
        for dim, _ in g:
            w /= per_dim[dim]
        return w

    weights: dict[Group, float] = {}
    totals = []
    for a in configs_atoms:
        gs = groups_of(a)
        for g in gs:
            weights.setdefault(g, weight(g))
        totals.append(sum(weights[g] for g in gs))
    typical = sorted(totals)[len(totals) // 2] if totals else 1.0
    rate = -math.log1p(-settings.failure_prior) / max(typical, 1e-9)
    return {g: -math.expm1(-rate * w) for g, w in weights.items()}


def _posterior(
    sig: Signature,
    failed: tuple[TrialConfig, ...],
    at: Mapping[TrialConfig, frozenset[Atom]],
    ran_groups: Mapping[Group, set[Signature | None]],
    prior: Mapping[Group, float],
    settings: SearchSettings,
) -> _Signature:
    """The posterior over which patterns of groups explain `failed` (one signature's)."""
    candidates: dict[Group, list[bool]] = {}
    for i, c in enumerate(failed):
        for g in groups_of(at[c]):
            if ran_groups.get(g, set()) - {sig}:
                continue  # something in it ran, or failed otherwise: not broken with `sig`
            candidates.setdefault(g, [False] * len(failed))[i] = True
    by_cover: dict[tuple[bool, ...], list[Group]] = {}
    for g, cover in candidates.items():
        by_cover.setdefault(tuple(cover), []).append(g)
    ranked = sorted(by_cover.items(), key=lambda kv: (-sum(kv[0]), -len(kv[1]), kv[0]))
    patterns = tuple(
        _Pattern(np.array(cover), tuple(sorted(gs, key=sorted))) for cover, gs in ranked[:MAX_PATTERNS]
    )  # fmt: skip
    n_p = len(patterns)
    subsets = np.array(list(itertools.product([False, True], repeat=n_p)), dtype=bool)
    subsets = subsets.reshape(2**n_p, n_p)
    q = np.array([1 - math.prod(1 - prior[g] for g in p.groups) for p in patterns])
    log_prior = (subsets * np.log(q) + ~subsets * np.log1p(-q)).sum(axis=1) if n_p else np.zeros(1)
    matrix = np.array([p.covers for p in patterns]).reshape(n_p, len(failed))
    covered = (subsets.astype(np.int32) @ matrix.astype(np.int32)) > 0
    uncovered = len(failed) - covered.sum(axis=1)
    causes = subsets.sum(axis=1) + uncovered
    log_lik = uncovered * math.log(settings.isolated_failure) + np.maximum(causes - 1, 0) * (
        math.log(settings.same_signature)
    )
    logw = log_prior + log_lik
    w = np.exp(logw - logw.max())
    return _Signature(sig, failed, patterns, subsets, w / w.sum())


def _not_blocked(
    s: _Signature,
    configs: Sequence[TrialConfig],
    at: Mapping[TrialConfig, frozenset[Atom]],
    prior: Mapping[Group, float],
) -> tuple[np.ndarray, np.ndarray]:
    """Per configuration, P(no broken group of `s` holds it): counting every pattern, and
    counting only patterns that explain two or more failures."""
    if not s.patterns:
        ones = np.ones(len(configs))
        return ones, ones
    log_no = np.zeros((len(s.patterns), len(configs)))
    for j, p in enumerate(s.patterns):
        # P(no group of p holding c is broken | some group of p is), per configuration c.
        keep = np.array([1 - prior[g] for g in p.groups])
        member = np.array([[g <= at[c] for c in configs] for g in p.groups])
        log_keep = np.log(keep)
        held = np.exp(member.T.astype(float) @ log_keep)  # none of c's groups broken
        rest = np.exp((~member).T.astype(float) @ log_keep)  # none of the others broken
        none = held * (1 - rest) / (1 - float(np.prod(keep)))
        log_no[j] = np.log(np.maximum(none, 1e-300))
    sub = s.subsets.astype(float)
    every = s.weights @ np.exp(sub @ log_no)
    structural = np.array([p.covers.sum() >= 2 for p in s.patterns])
    struct = s.weights @ np.exp(sub @ (log_no * structural[:, None]))
    return every, struct


def _broken_groups(priors: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws (n x m, bool) of which of a pattern's m groups are broken, given at least one:
    the first broken one from its law (group k first: its prior times none before it), each
    later one with its prior."""
    m = len(priors)
    before = np.concatenate([[1.0], np.cumprod(1 - priors)[:-1]])
    first_p = priors * before
    first = rng.choice(m, size=n, p=first_p / first_p.sum())
    out = rng.random((n, m)) < priors[None, :]
    idx = np.arange(m)[None, :]
    out &= idx > first[:, None]
    out[np.arange(n), first] = True
    return out
