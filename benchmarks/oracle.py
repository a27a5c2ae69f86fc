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

from typing import Any, Literal

import numpy as np
from worldset import REACH, Truth

from infertune_tuner import defaults
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.search.evidence import Evidence
from infertune_tuner.search.planner import Planner, gaps
from infertune_tuner.search.posterior import Assessment, assess
from infertune_tuner.search.sampler import PlannerFactory

Mode = Literal["find", "lookahead"]
MODES: tuple[Mode, ...] = ("find", "lookahead")
# Candidates the lookahead tries per exploration, by P(beats the best), besides the coverage
# targets. Each costs a posterior fit: 10 makes the 585-run benchmark take 18 minutes on 2
# cores. A first version trying 6 and no coverage targets gave medians 9 and 11 on mixed and
# dev-synthetic (8.5 and 10 with these).
LOOKAHEAD = 10


class OraclePlanner(Planner):
    """`auto`'s planner whose explorations know the truth (module docstring); built by
    `oracle_factory`, which gives it the world's truth, its pool and the mode."""

    truth: Truth
    probe: BenchmarkBackend  # the world's pool, to draw a candidate's first run as a trial would
    mode: Mode

    def _reaches(self, cfg: TrialConfig | None) -> bool:
        got, ok, _ = self.truth.value(cfg)
        return ok and got >= REACH * self.truth.optimum

    def explore_pick(self, a: Assessment, mine: str = "") -> TrialConfig:
        if mine:  # one pool's worker: the oracle knows one study of one process only
            return super().explore_pick(a, mine)
        if not self._reaches(a.best):
            found = [c for c in a.candidates if self._reaches(c)]
            if found:
                return max(found, key=lambda c: self.truth.value(c)[0])
        if self.mode == "find":
            return super().explore_pick(a)
        n = len(a.candidates)
        tries = [a.candidates[int(i)] for i in np.argsort(-a.p_beat[:n], kind="stable")]
        tries = tries[:LOOKAHEAD]
        tries += [g.target for g in gaps(a, self.prior, self.settings) if g.target not in tries]
        return min(tries, key=lambda c: self._left_to_prove(a.evidence, c))

    def _left_to_prove(self, ev: Evidence, cfg: TrialConfig) -> float:
        """What is left to prove once `cfg` is measured (its first run): P(an untried
        configuration beats the best) in units of the stop threshold, plus the structures still
        to cover once that chance is within twice the threshold."""
        runs = {**ev.runs, cfg: (self.probe.run(cfg, repeat=0),)}
        after = Evidence(
            self.prior.request, runs, covers=ev.covers, transient_retries=ev.transient_retries
        )
        seed = self.prior.request.tuning.seed
        a = assess(after, self.prior, self.settings, seed=defaults.SEED if seed is None else seed)
        stop = self.settings.stop_probability
        left = a.p_untried / stop
        if a.p_untried < 2 * stop:
            left += len(gaps(a, self.prior, self.settings))
        return left


def oracle_factory(truth: Truth, probe: BenchmarkBackend, mode: Mode) -> PlannerFactory:
    """A `tune(planner_factory=...)` that builds the oracle planner for one world: `Planner`'s
    own arguments, and what the oracle knows."""

    def build(*args: Any, **kwargs: Any) -> Planner:
        planner = OraclePlanner(*args, **kwargs)
        planner.truth, planner.probe, planner.mode = truth, probe, mode
        return planner

    return build
