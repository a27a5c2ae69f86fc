"""How few trials `auto`'s posterior lets a search spend: explorations that know the truth.

The search's trial count has two parts: finding the optimum, and the proof after it (measuring
until P(an untried configuration beats the best) < 5 %, covering every structure that could hold
the optimum, confirming the winner). The oracle planner keeps everything of `auto` - the
posterior, the stop rule, coverage, confirmations, the confidence it claims - and changes one
thing: which candidate an exploration measures. It knows every configuration's truth:

- `find`: first the configuration that truly reaches the optimum (the best true tok/s/GPU among
  those that truly meet every bound), then the search's own choice (largest expected gain). Its
  trial counts are the search's proof alone: what remains when finding costs one trial.
- `lookahead`: `find`, then, among the candidates with the largest P(beats the best)
  (`LOOKAHEAD`) and the structures coverage still asks for, the one whose actual first-run
  measurement (the world's own, drawn as the search would draw it) leaves the least to prove:
  P(an untried configuration beats the best) in units of the stop threshold, plus one trial
  per structure still to cover once that chance is near the threshold. A greedy one-step
  choice, not the optimal sequence: an upper bound on the fewest trials any choice of what to
  measure needs with this posterior.

benchmarks/tuner_efficiency.py --oracle MODE scores it like `auto`. What it shows (the numbers
are in docs/search-experiments.md): how much of a family's trial count is the finding, and how
much the proof that no choice of trials could shorten without a posterior that doubts less.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from worldset import REACH, Truth

from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import TuningRequest
from infertune_tuner.run import PlannerFactory
from infertune_tuner.search.evidence import Known
from infertune_tuner.search.planner import Assessment, Planner
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace

Mode = Literal["find", "lookahead"]
MODES: tuple[Mode, ...] = ("find", "lookahead")
# Candidates the lookahead tries per exploration, by P(beats the best): 6 and 10 gave the same
# medians on mixed and dev-synthetic; each costs one posterior fit per exploration.
LOOKAHEAD = 10


class OraclePlanner(Planner):
    """`auto`'s planner whose explorations know the truth (module docstring)."""

    def __init__(
        self,
        truth: Truth,
        probe: BenchmarkBackend,
        mode: Mode,
        request: TuningRequest,
        space: SearchSpace,
        priors: dict[TrialConfig, Prediction],
        *,
        seed: int = 0,
        settings: SearchSettings | None = None,
    ) -> None:
        super().__init__(request, space, priors, seed=seed, settings=settings)
        self.truth = truth
        self.probe = probe  # the world's pool, to draw a candidate's first run as a trial would
        self.mode = mode

    def _reaches(self, cfg: TrialConfig | None) -> bool:
        got, ok, _ = self.truth.value(cfg)
        return ok and got >= REACH * self.truth.optimum

    def explore_pick(self, known: Known, a: Assessment) -> TrialConfig:
        if not self._reaches(a.best):
            found = [c for c in a.candidates if self._reaches(c)]
            if found:
                return max(found, key=lambda c: self.truth.value(c)[0])
        if self.mode == "find":
            return super().explore_pick(known, a)
        n = len(a.candidates)
        tries = [a.candidates[int(i)] for i in np.argsort(-a.p_beat[:n], kind="stable")]
        tries = tries[:LOOKAHEAD]
        tries += [g.target for g in self.gaps(known, a) if g.target not in tries]
        return min(tries, key=lambda c: self._left_to_prove(known, c))

    def _left_to_prove(self, known: Known, cfg: TrialConfig) -> float:
        """What is left to prove once `cfg` is measured (its first run): P(an untried
        configuration beats the best) in units of the stop threshold, plus the structures still
        to cover once that chance is within twice the threshold."""
        runs = {c: list(ms) for c, ms in known.runs.items()}
        runs[cfg] = [self.probe.run(cfg, repeat=0)]
        after = Known.build(self.request, runs, covers=known.covers)
        a = self.assess(after)
        stop = self.settings.stop_probability
        left = a.p_untried / stop
        if a.p_untried < 2 * stop:
            left += len(self.gaps(after, a))
        return left


def oracle_factory(truth: Truth, probe: BenchmarkBackend, mode: Mode) -> PlannerFactory:
    """A `tune(planner_factory=...)` that builds the oracle planner for one world."""

    def build(
        request: TuningRequest,
        space: SearchSpace,
        priors: dict[TrialConfig, Prediction],
        *,
        seed: int,
        settings: SearchSettings | None,
    ) -> Planner:
        return OraclePlanner(
            truth, probe, mode, request, space, priors, seed=seed, settings=settings
        )

    return build
