"""What a valid manifest will probably trip over: warnings, not errors (`validate` prints them,
the operator posts them as Warning events when it starts a tuning).

- **TokenMissing**: a Triton trial or serving pod downloads weights from a gated Hugging Face
  repository (catalog.llms.GATED_HF_ORGS) and `spec.model.source.tokenSecretRef` names no
  token: every download would be refused (401/403) and every trial fail.
- **LargeModelCache**: the tuner pod would keep every downloaded checkpoint in node-local
  ephemeral storage and needs more than `EPHEMERAL_CACHE_LIMIT_GIB` of it; many GPU nodes have
  less, and the pod then never schedules (or is evicted mid-download). A PVC
  (`spec.tuning.modelCacheClaim`, or the chart's `modelStorage.pvc`) holds the cache instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_tuner import defaults
from infertune_tuner.catalog.llms import is_gated
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.weights import cache_gib, hub_repo, trial_weights, uses_model_cache

TOKEN_MISSING = "TokenMissing"
LARGE_MODEL_CACHE = "LargeModelCache"
# Node-local ephemeral storage is the node's root filesystem: GKE's default node boot disk is
# 100 GB and an EKS managed node group's root volume 20 GiB unless the pool was made with more.
# A tuner pod asking for more than this is a bet on how the GPU nodes were provisioned.
EPHEMERAL_CACHE_LIMIT_GIB = 100


@dataclass(frozen=True)
class Advisory:
    reason: str  # the event's reason
    message: str


def advisories(
    obj: InferenceDeployment, *, default_backend: str = defaults.CLUSTER_BACKEND,
    model_storage_pvc: str | None = None,
) -> list[Advisory]:  # fmt: skip
    """Every warning for a valid InferenceDeployment (see the module doc).

    Args:
        obj: The validated manifest.
        default_backend: The backend when spec.tuning leaves it unset (the operator's default).
        model_storage_pvc: The operator's model-storage PVC (the chart's modelStorage.pvc).
    """
    request = to_request(obj, default_backend=default_backend)
    if request.tuning.backend != "triton":
        return []
    return [*_token(obj, request), *_cache(obj, request, model_storage_pvc)]


def _cache(obj: InferenceDeployment, request: TuningRequest, pvc: str | None) -> list[Advisory]:
    if obj.spec.tuning.model_cache_claim or pvc:
        return []
    uris = trial_weights(request)
    need = cache_gib(request, request.search.quantization) if uses_model_cache(uris) else 0
    if need <= EPHEMERAL_CACHE_LIMIT_GIB:
        return []
    return [Advisory(LARGE_MODEL_CACHE, (
        f"the tuner pod would keep {need} GiB of downloaded weights in node-local ephemeral "
        f"storage (more than {EPHEMERAL_CACHE_LIMIT_GIB} GiB: many GPU nodes have less, and the "
        "pod would not schedule); create a PersistentVolumeClaim of at least that size and set "
        "spec.tuning.modelCacheClaim (or the chart's modelStorage.pvc)"
    ))]  # fmt: skip


def _token(obj: InferenceDeployment, request: TuningRequest) -> list[Advisory]:
    source = obj.spec.model.source
    if source is not None and source.token_secret_ref is not None:
        return []
    gated: list[str] = []
    for uri in trial_weights(request):
        repo = hub_repo(uri)
        if repo is not None and is_gated(repo) and repo not in gated:
            gated.append(repo)
    if not gated:
        return []
    where = (
        "spec.model.source.tokenSecretRef: {name: hf-token}"
        if obj.spec.model.source is not None
        else f"spec.model.source: {{uri: hf://{gated[0]}, tokenSecretRef: {{name: hf-token}}}}"
    )
    return [Advisory(TOKEN_MISSING, (
        f"{', '.join(gated)} {'is' if len(gated) == 1 else 'are'} gated on the Hugging Face Hub "
        "and no token is given (spec.model.source.tokenSecretRef): every download would be "
        "refused. Create a Secret with the token of an account that accepted the model's terms "
        f"(kubectl create secret generic hf-token --from-literal=HF_TOKEN=hf_...) and set {where}"
    ))]  # fmt: skip
