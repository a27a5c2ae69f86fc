"""What a valid manifest will probably trip over: warnings, not errors (`validate` prints them,
the operator posts them as Warning events when it starts a tuning).

- **TokenMissing**: a Triton trial or serving pod downloads weights from a gated Hugging Face
  repository (catalog.models.GATED_HF_ORGS) and `spec.model.source.tokenSecretRef` names no
  token: every download would be refused (401/403) and every trial fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from infertune_operator.api.models import InferenceDeployment
from infertune_operator.api.to_request import to_request
from infertune_tuner import defaults
from infertune_tuner.catalog.models import is_gated
from infertune_tuner.config import TrialConfig
from infertune_tuner.runtime.weights import (
    MissingCheckpoint,
    model_path_for,
    split_pvc,
    weights_uri,
)

TOKEN_MISSING = "TokenMissing"


@dataclass(frozen=True)
class Advisory:
    reason: str  # the event's reason
    message: str


def advisories(
    obj: InferenceDeployment, *, default_backend: str = defaults.CLUSTER_BACKEND
) -> list[Advisory]:
    """Every warning for a valid InferenceDeployment (see the module doc).

    Args:
        obj: The validated manifest.
        default_backend: The backend when spec.tuning leaves it unset (the operator's default).
    """
    request = to_request(obj, default_backend=default_backend)
    if request.tuning.backend != "triton" or (
        obj.spec.model.source is not None and obj.spec.model.source.token_secret_ref is not None
    ):
        return []
    gated: list[str] = []
    for q in request.search.quantization:
        try:
            uri = weights_uri(request, TrialConfig(1, 1, q, "auto"))
        except MissingCheckpoint:
            continue
        if split_pvc(uri) is None and not uri.startswith("file://"):
            repo = model_path_for(uri)
            if is_gated(repo) and repo not in gated:
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
