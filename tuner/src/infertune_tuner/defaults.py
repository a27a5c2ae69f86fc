"""Every default of a tuning run, in one place (the API models, the request, the operator's
settings and the CLI all read them here).

The one default that depends on where infertune runs is the backend: on a cluster an unset
``spec.tuning.backend`` means real trials (:data:`CLUSTER_BACKEND`, overridable for a whole
operator with ``INFERTUNE_DEFAULT_BACKEND``), while ``infertune tune`` on a laptop has no GPU to
run them on and uses the simulated pool (:data:`LOCAL_BACKEND`).
"""

from __future__ import annotations

from typing import Final

MAX_TRIALS: Final = 40  # a cap on executed trials, not a target
# The most trials one study may ask for, on the command line and in a manifest alike: the report
# of the largest such study (1000 trials over 4480 configurations, 7.8 MB of JSON) still fits a
# ConfigMap gzipped (0.55 MB; tests/operator_tests/test_deadline_and_size.py).
MAX_TRIALS_LIMIT: Final = 1000
# The `auto` search stops once it is this sure that no untried configuration beats the best by
# more than 2 % (SearchSettings.stop_probability = 1 - this; docs/tuning.md measures what a lower
# target saves and costs). A request may ask for another within CONFIDENCE_RANGE: below 0.5 the
# claim is "more likely wrong than right"; above 0.99 the stop rule's Monte Carlo estimate (768
# joint draws, SearchSettings.draws) cannot resolve a probability under 1 % (its sd: 0.36 points).
CONFIDENCE: Final = 0.95
CONFIDENCE_RANGE: Final = (0.5, 0.99)
PARALLELISM: Final = 1
SAMPLER: Final = "auto"  # model-guided (search/planner.py)
CLUSTER_BACKEND: Final = "triton"
LOCAL_BACKEND: Final = "simulated"
SEED: Final = 0
# How long a server may take to become ready (download + load + CUDA graph capture): the first
# download of a 70B model (140 GB) and its load can take well over half an hour. The serving
# pod's startup probe and every real trial wait this long.
STARTUP_TIMEOUT_MINUTES: Final = 60
# Run-to-run noise of one benchmark run (log standard deviation) per quantity: tok/s/GPU and each
# latency percentile. The search's posterior starts from it and learns a study's own from repeats
# (never below it), so a pool noisier than this is found out; the operator's drift and
# verification checks read the tok/s/GPU entry (docs/tuning.md, the posterior's noise).
RUN_NOISE: Final = {"tps": 0.03, "p50": 0.04, "p95": 0.06, "p99": 0.09}

MAX_GPUS_PER_REPLICA: Final = 8
MAX_ACCURACY_LOSS_PERCENT: Final = 1.0
# The search space when spec.search leaves a dimension out. fp16 is left out: the model cannot
# tell it from bf16, and it never wins on the same GPU.
TENSOR_PARALLEL: Final = (1, 2, 4, 8)
MAX_BATCH_SIZE: Final = (1, 4, 8, 16, 32, 64, 128, 256)
QUANTIZATION: Final = ("bf16", "fp8", "w4a16_awq", "w4a8_awq", "nvfp4")
KV_CACHE_DTYPE: Final = ("auto", "fp8")
