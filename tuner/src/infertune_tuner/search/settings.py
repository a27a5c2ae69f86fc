"""Every constant the search decides with, in one value the sampler is built with.

`SearchSettings()` holds the defaults, each with the evidence it rests on; a benchmark or a test
builds the sampler with others (benchmarks/tuner_efficiency.py scores each world family with the
hyperprior fitted on the *other* families). The decisions read their thresholds from here; what
describes the models themselves (the memory-fit prior in memory_fit.py, the posterior's noise
and mixture size in model.py, the coverage neighbourhood in coverage.py) stays a constant of
its module, with its evidence beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infertune_tuner import defaults
from infertune_tuner.search.hyperprior import Hyperprior, default_hyperprior


def stop_probability_for(confidence: float) -> float:
    """The stop rule's threshold for a confidence target: P(an untried configuration beats the
    best) below 1 - confidence (rounded: 1 - 0.95 is 0.05, not 0.050000000000000044)."""
    return round(1 - confidence, 12)


@dataclass(frozen=True)
class SearchSettings:
    # How large and how smooth the performance model's errors are (hyperprior.py): fitted across
    # world families by benchmarks/fit_hyperprior.py; `hyperprior.json` names the worlds.
    hyperprior: Hyperprior = field(default_factory=default_hyperprior)
    # Gains under 2 % are within a tok/s/GPU measurement's run-to-run noise (3 %, NOISE in
    # model.py): not worth a GPU trial, and not what "the optimum was found" has to resolve.
    improvement: float = 0.02
    # The search stops when P(an untried configuration beats the best by more than
    # `improvement`) falls below this; a confidence >= 1 - this is a claim the benchmark checks.
    # A request's `tuning.confidence` replaces it (Planner): the default is defaults.CONFIDENCE.
    stop_probability: float = stop_probability_for(defaults.CONFIDENCE)
    # Once this many trials ran, a new incumbent is measured a second time before exploration goes
    # on (0: only when the search is about to stop). Earlier costs trials, later costs reach: on
    # mixed / dev-synthetic, 2 took the median to 12 / 14.5 (from 11.5 / 13.5), 6 and 0 took
    # dev-synthetic's runs at the optimum from 97 % to 95 % and 92 % (docs/search-experiments.md).
    confirm_incumbent_after: int = 4
    # A candidate is worth a trial when its expected gain over the incumbent is at least this
    # share of the incumbent's tok/s/GPU.
    min_expected_gain: float = 0.0
    # With nothing feasible measured, the configurations most likely to meet the SLO measured
    # before concluding that none can: the prior itself may be what is wrong.
    min_probes: int = 3
    # An SLO margin under 5 % is within the run-to-run noise of a p95/p99 (NOISE: 6-9 %): such a
    # finalist is measured twice before it is declared.
    confirm_margin: float = 0.05
    # A measured rival the posterior gives at least this chance of beating the incumbent is more
    # likely than not the better one: the incumbent won on its runs' noise or the rival lost on
    # its own (the posterior's smooth shape across neighbours disagrees with their runs' order).
    # Both are measured until each has `tie_repeats` runs (confirm.py). Without it the noisy
    # family's misses shipped 91-97 % of the optimum after two runs each, at 0-67 % confidence
    # (one: a batch measured +6 % and +10 % over its truth beating the optimum at -1 % and -2 %);
    # with it 97 % of noisy runs reach the optimum (95 % before) at the same median and p90
    # trials everywhere (benchmarks/tuner_efficiency.py, docs/tuning.md).
    tie_doubt: float = 0.5
    tie_repeats: int = 3
    # Joint posterior draws per decision: P(some candidate beats the best) at 5 % has a Monte
    # Carlo error of sqrt(0.05 * 0.95 / 768) = 0.8 %.
    draws: int = 768
    # Candidates whose marginal chance to beat the incumbent is below this are not drawn
    # jointly (they keep their marginal probabilities); at least `joint_at_least` always are.
    negligible: float = 1e-3
    joint_at_least: int = 8
    # A latency miss (or a tok/s/GPU floor miss) by more than 10 % rules out larger (smaller)
    # batches of the same TP and precision. Not less: real pools are not perfectly monotonic (a
    # batch size without a captured CUDA graph can be slower than the next larger one).
    dominance_margin: float = 0.10
    # Structural coverage (coverage.py): the model's relative error is never assumed below the
    # disagreement between two calibrated stacks of the same software on the same
    # configurations: TensorRT-LLM 0.5's and 1.x's factors rank the configurations of the
    # benchmark's 12 scenarios differently by 0.41-0.66 (log, 5-95 % range; half: +-0.27),
    # benchmarks/fit_hyperprior.py prints it.
    coverage_floor: float = 0.27
    # Coverage measurements per structure, at most: the first shows how the structure does near
    # its predicted best, a second where the first missed the SLO; below that the posterior decides.
    # Not one: real vLLM tables fall off a cliff the posterior does not foresee (vllm-01, TP1: E2E
    # 2.3x over the bound at batch 32, under it at batch 16, where the optimum is; the posterior
    # gave batch 16 no chance). With one cover per structure dev-vllm reached the optimum in 90 %
    # of runs (100 % with two) and 91 % of its confident claims were right; mixed went from a
    # median of 11.5 trials to 10 (benchmarks/tuner_efficiency.py --set max_covers=1).
    max_covers: int = 2
    # A measurement is physically implausible (plausibility.py) when its tok/s/GPU exceeds what
    # streaming the weights once per decode step at the GPU's peak memory bandwidth allows by
    # more than this factor (peak bandwidth is a datasheet ceiling; 10 % covers rounding of
    # the datasheet and a throughput window's edges).
    plausible_margin: float = 1.10
    # A run whose responses averaged more than this share below the requested output length
    # measured a shorter workload (the model stopped early, EOS): not evidence.
    short_output: float = 0.05
    # The first trials all failing with `error` (not OOM) means the set-up is broken (server
    # not found, no checkpoint, no GPU): stop instead of burning the budget on the same failure.
    abort_after_errors: int = 3
    # The report's grouping of untried candidates (untried.py): "unlikely" below 5 %, a "real
    # chance" the search did not reach from 1 %.
    unlikely: float = 0.05
    real_chance: float = 0.01

    @property
    def log_improvement(self) -> float:
        return math.log1p(self.improvement)
