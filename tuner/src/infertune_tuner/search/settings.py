"""Every constant the search decides with: the one argument the samplers are built with.

`SearchSettings()` holds the defaults, each with its evidence in one line (the measurements
behind them, and the alternatives measured and not kept: docs/search-experiments.md). A
benchmark or a test builds the sampler with others (benchmarks/tuner_efficiency.py scores each
world family with the hyperprior fitted on the *other* families, and `--set NAME=VALUE` any
field). Besides these the search fixes only the posterior's coordinates (posterior.FEATURES and
the trend's centre), which the hyperprior is fitted in, and numerical guards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from infertune_tuner import defaults
from infertune_tuner.search.hyperprior import Hyperprior, default_hyperprior


def stop_probability_for(confidence: float) -> float:
    """The stop rule's threshold for a confidence target: P(an untried configuration beats the
    best) below 1 - confidence (rounded: 1 - 0.95 is 0.05, not 0.050000000000000044)."""
    return round(1 - confidence, 12)


@dataclass(frozen=True)
class SearchSettings:
    # -- the posterior (posterior.py)
    # How large and smooth the model's errors are: fitted across world families (hyperprior.json).
    hyperprior: Hyperprior = field(default_factory=default_hyperprior)
    # Run-to-run noise prior per quantity; a study learns its own from repeats, never below it.
    run_noise: Mapping[str, float] = field(default_factory=lambda: dict(defaults.RUN_NOISE))
    # The prior noise counts as this many degrees of freedom against a study's own repeats.
    noise_prior_weight: float = 3.0
    # Hyperparameter settings weighed per quantity (Sobol points through the hyperprior).
    particles: int = 64
    # The mixture keeps the heaviest settings holding this much weight, at most `max_components`.
    keep_mass: float = 0.999
    max_components: int = 24
    # Gauss-Legendre nodes of P(success): integrate well under the draws' Monte Carlo error.
    legendre_nodes: int = 16
    # Joint draws per decision: P = 5 % has a Monte Carlo error of sqrt(.05 * .95 / 768) = 0.8 %.
    draws: int = 768
    # Candidates below this marginal P(beats) are not drawn jointly; at least `joint_at_least` are.
    negligible: float = 1e-3
    joint_at_least: int = 8
    # That pre-filter allows the incumbent's own noise: its bar is lowered by this many sds.
    incumbent_slack_sds: float = 3.0
    # How much of the model's error two pools of one GPU architecture share (posterior.py's
    # pool_coordinates; other architectures share none). A judgement, not a fit: TensorRT-LLM
    # runs the same kernels on both (H100 and H200, B200 and B300), so the efficiency the model
    # misses is largely common; what differs, memory size and bandwidth, the model reads from
    # the datasheets. No data set here pairs two products of one architecture outside the
    # held-out H200 rows. What it costs when wrong: benchmarks/pool_tuning.py
    # --pool-correlation (its simulated pools draw every pool's error independently).
    pool_correlation: float = 0.8
    # -- the memory frontier (posterior.py)
    # Needing 15 % more memory than the GPU has is beyond any workspace/reserve error seen.
    wide_margin: float = math.log(1.15)
    # The memory model's error on a pool, a priori N(0, 0.05^2) in log memory.
    memory_error_prior: float = 0.05
    # Allocator rounding: outcomes this close (log) to the frontier say little.
    memory_softness: float = 0.01
    # The memory error's grid: +-0.3 in log memory, 241 points.
    memory_grid_half_width: float = 0.3
    memory_grid_points: int = 241
    # -- what the measurements rule out (posterior.verdicts)
    # A miss by more than 10 % rules out larger batches: real pools are not perfectly monotonic.
    dominance_margin: float = 0.10
    # -- which measurements are evidence (evidence.py)
    # Above the decode bound (peak bandwidth, weights once per step) by 10 %: not a real run.
    plausible_margin: float = 1.10
    # Responses averaging 5 % short of the requested length measured a shorter workload.
    short_output: float = 0.05
    # -- the decision (planner.py)
    # Gains under 2 % are within a tok/s/GPU run's noise (3 %): not worth a GPU trial.
    improvement: float = 0.02
    # Stop when P(an untried configuration beats the best by `improvement`) < this.
    stop_probability: float = stop_probability_for(defaults.CONFIDENCE)
    # A new incumbent is measured again before exploring on after this many trials (2 and 6 cost).
    confirm_incumbent_after: int = 4
    # A candidate is worth a trial when its expected gain is at least this share of the best.
    min_expected_gain: float = 0.0
    # With nothing feasible measured, the likeliest configurations measured before giving up.
    min_probes: int = 3
    # An SLO margin under 5 % is within a p95/p99's run-to-run noise (6-9 %): measure it twice.
    confirm_margin: float = 0.05
    # A measured rival more likely than not the better is measured until each has 3 runs.
    tie_doubt: float = 0.5
    tie_repeats: int = 3
    # Coverage: model error never assumed below two calibrated stacks' disagreement (+-0.27 log).
    coverage_floor: float = 0.27
    # Coverage measurements per structure: one missed real cliffs (dev-vllm 90 % reach vs 100 %).
    max_covers: int = 2
    # A measurement within a factor 2 of a structure's target batch covers it (4 missed one).
    cover_batch_factor: float = 2.0
    # The first 3 trials all failing with `error` (not OOM), and no structure they share, mean
    # the set-up is broken: stop.
    abort_after_errors: int = 3
    # -- failures (failures.py)
    # A priori, a configuration sits in a structure that cannot run with 10 %: 552 of 983 trials
    # failed on the no-INT4-kernels worlds, and healthy pools fail none; spread over its groups.
    failure_prior: float = 0.10
    # A pair of values (AWQ at TP>1, fp8 weights with the fp8 KV cache) failing together is
    # half as likely a priori as one value: one of the five failing forms seen is a pair.
    pair_prior: float = 0.5
    # A configuration of working structures fails on its own (a flaky node, a one-off crash)
    # with 5 %.
    isolated_failure: float = 0.05
    # Two unrelated causes leaving the same normalised error line: 10 %.
    same_signature: float = 0.10
    # Below a 10 % chance to run, counting structures two failures of one signature point
    # at, a configuration is excluded (not tried further).
    exclude_below: float = 0.30
    # A coverage target must be more likely than not to run: coverage asks how well a structure
    # works, not whether it starts.
    cover_min_runs: float = 0.5
    # A transient failure (signatures.py) is re-run once before it counts.
    transient_retries: int = 1
    # -- the report's grouping of untried candidates
    unlikely: float = 0.05  # "unlikely" below 5 %
    real_chance: float = 0.01  # a chance the search did not reach from 1 %
    # -- Optuna's own samplers, guarded (sampler.py)
    # TPE's random start before its density model: Optuna's default of 10 is a quarter of a run.
    tpe_startup_trials: int = 5

    @property
    def log_improvement(self) -> float:
        return math.log1p(self.improvement)

    def with_confidence(self, confidence: float | None) -> SearchSettings:
        """These settings under a request's confidence target (None: unchanged)."""
        if confidence is None:
            return self
        return replace(self, stop_probability=stop_probability_for(confidence))
