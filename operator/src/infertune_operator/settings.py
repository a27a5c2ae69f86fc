"""Operator settings, read from the environment (the Helm chart sets them).

| variable                          | default                                                  |
|-----------------------------------|----------------------------------------------------------|
| INFERTUNE_OPERATOR_IMAGE          | infertune/operator:<version> (simulated tuner + simserver)|
| INFERTUNE_TUNER_IMAGE             | infertune/tuner:<version> (Triton + TRT-LLM + infertune)  |
| INFERTUNE_TRITON_IMAGE            | nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3       |
| INFERTUNE_DEFAULT_BACKEND         | triton (when spec.tuning.backend is unset)               |
| INFERTUNE_DEFAULT_MAX_TRIALS      | 40 (when spec.tuning.maxTrials is unset)                 |
| INFERTUNE_TUNER_STORAGE           | unset (Optuna RDB URL when spec.tuning.storage is unset)  |
| INFERTUNE_TUNER_SERVICE_ACCOUNT   | infertune-tuner (created per namespace by the operator)   |
| INFERTUNE_TUNER_CLUSTERROLE       | infertune-tuner (bound in each namespace it tunes in)     |
| INFERTUNE_JOB_BACKOFF_LIMIT       | 2 (tuner pod retries before the Job fails)               |
| INFERTUNE_MODEL_STORAGE_PVC       | unset (PVC mounted at /models in serving pods)           |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from infertune_operator import __version__

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


@dataclass(frozen=True)
class Settings:
    operator_image: str = f"infertune/operator:{__version__}"
    tuner_image: str = f"infertune/tuner:{__version__}"
    triton_image: str = DEFAULT_TRITON_IMAGE
    default_backend: str = "triton"
    default_max_trials: int = 40
    tuner_storage: str | None = None
    tuner_service_account: str = "infertune-tuner"
    tuner_clusterrole: str = "infertune-tuner"
    job_backoff_limit: int = 2
    model_storage_pvc: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Settings:
        d = cls()
        backend = _env("INFERTUNE_DEFAULT_BACKEND", d.default_backend)
        if backend not in ("triton", "simulated"):
            raise ValueError(
                f"INFERTUNE_DEFAULT_BACKEND must be triton or simulated, not {backend!r}"
            )
        return cls(
            operator_image=_env("INFERTUNE_OPERATOR_IMAGE", d.operator_image),
            tuner_image=_env("INFERTUNE_TUNER_IMAGE", d.tuner_image),
            triton_image=_env("INFERTUNE_TRITON_IMAGE", d.triton_image),
            default_backend=backend,
            default_max_trials=int(_env("INFERTUNE_DEFAULT_MAX_TRIALS", str(d.default_max_trials))),
            tuner_storage=os.environ.get("INFERTUNE_TUNER_STORAGE") or None,
            tuner_service_account=_env("INFERTUNE_TUNER_SERVICE_ACCOUNT", d.tuner_service_account),
            tuner_clusterrole=_env("INFERTUNE_TUNER_CLUSTERROLE", d.tuner_clusterrole),
            job_backoff_limit=int(_env("INFERTUNE_JOB_BACKOFF_LIMIT", str(d.job_backoff_limit))),
            model_storage_pvc=os.environ.get("INFERTUNE_MODEL_STORAGE_PVC") or None,
        )
