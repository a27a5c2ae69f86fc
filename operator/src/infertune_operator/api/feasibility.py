"""What `tune` would refuse, found without running a trial (`validate` and `tune` share it).

A manifest can pass the schema and still leave nothing to tune: a search space emptied by the
GPU, the accuracy allowance, the model's heads or missing checkpoints; no configuration that fits
in GPU memory; a storage URL that is no database URL or whose driver is not installed.
"""

from __future__ import annotations

from infertune_operator.api.manifest import Problem
from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_tuner.errors import InputError
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.weights import unloadable
from infertune_tuner.storage import storage_url_problem

# The backend whose trials and serving pods load real weights (triton:simulated and triton:torch
# serve infertune's own model and load none).
WEIGHTS_BACKEND = "triton"


def weights_problem(request: TuningRequest, backend: str) -> Problem | None:
    """Why the request's weights cannot be loaded on `backend`, or None (`validate`, `tune` and
    the operator ask the same)."""
    if backend != WEIGHTS_BACKEND or (why := unloadable(request)) is None:
        return None
    return Problem("spec.model.source.uri", why)


def feasibility_problems(obj: InferenceDeployment, *, backend: str | None = None) -> list[Problem]:
    """Every reason ``obj`` cannot be tuned on ``backend`` (default: the spec's, else the
    operator's default), no configuration that fits in GPU memory included."""
    from infertune_tuner import pools
    from infertune_tuner.perfmodel.memory import estimate_memory
    from infertune_tuner.space import search_space

    problems: list[Problem] = []
    storage = obj.spec.tuning.storage
    if storage is not None and (why := storage_url_problem(storage)) is not None:
        problems.append(Problem("spec.tuning.storage", why))
    request = to_request(obj) if backend is None else to_request(obj, default_backend=backend)
    backend = backend or request.tuning.backend
    if (weights := weights_problem(request, backend)) is not None:
        problems.append(weights)
    model = request.resolve_model()
    try:
        space = search_space(request, model, backend)
    except InputError as exc:
        # Each exclusion says what and why; what to do, once for all of them:
        problems.append(Problem("spec.search", (
            f"{exc}; add a value that none of these reasons excludes, or use another "
            "spec.gpu.product")))  # fmt: skip
        return problems
    # The memory estimate alone (what `predict` says of memory), up to the first
    # configuration that fits: the operator asks this before every tuning it starts.
    fits = any(
        estimate_memory(model, pools.gpu_of(request, c), space.effective(c), request.work).fits
        for c in space.configs
    )
    if not fits:
        smallest = min(space.configs, key=lambda c: (-c.tp, c.max_batch_size))
        gpu = pools.gpu_of(request, smallest)
        why = estimate_memory(model, gpu, space.effective(smallest), request.work).reason
        problems.append(Problem("spec.search", (
            f"no configuration fits in {gpu.key} memory; even {smallest.label()}: {why}; "
            "allow a larger tensorParallel, a smaller maxBatchSize or a quantization")))  # fmt: skip
    return problems
