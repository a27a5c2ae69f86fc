"""Operator settings, read from the environment (the Helm chart sets them).

| variable                          | default                                                  |
|-----------------------------------|----------------------------------------------------------|
| INFERTUNE_OPERATOR_IMAGE          | infertune/operator:<version> (simulated tuner + simserver)|
| INFERTUNE_TUNER_IMAGE             | infertune/tuner:<version> (Triton + TRT-LLM + infertune)  |
| INFERTUNE_TRITON_IMAGE            | nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3       |
| INFERTUNE_DEFAULT_BACKEND         | triton (when spec.tuning.backend is unset)               |
| INFERTUNE_DEFAULT_MAX_TRIALS      | 40 (when spec.tuning.maxTrials is unset)                 |
| INFERTUNE_TUNER_STORAGE           | unset (Optuna RDB URL when spec.tuning.storage is unset)  |
| INFERTUNE_TUNER_STORAGE_SECRET    | unset (Secret, in each tuning namespace, with that URL)   |
| INFERTUNE_TUNER_STORAGE_SECRET_KEY| url (its key)                                             |
| INFERTUNE_TUNER_SERVICE_ACCOUNT   | infertune-tuner (created per namespace by the operator)   |
| INFERTUNE_TUNER_CLUSTERROLE       | infertune-tuner (bound in each namespace it tunes in)     |
| INFERTUNE_JOB_BACKOFF_LIMIT       | 2 (tuner pod retries before the Job fails)               |
| INFERTUNE_TRIAL_BENCHMARK_MINUTES | 30 (per-trial benchmark bound in the Job deadline)       |
| INFERTUNE_MODEL_STORAGE_PVC       | unset (download cache PVC at /model-cache, serving+tuner)|
| INFERTUNE_OBSERVE_INTERVAL_SECONDS| 30 (how often the serving pods' metrics are read)        |

The tuning defaults themselves (40 trials, the triton backend) live in
``infertune_tuner.defaults``; these variables override them for one operator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import get_args

from infertune_operator import __version__
from infertune_operator.api.types import Backend, InferenceDeployment
from infertune_tuner import defaults

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _positive(name: str, default: int, unit: str = "minutes") -> int:
    text = _env(name, str(default))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a whole number of {unit} >= 1, not {text!r}")
    return value


@dataclass(frozen=True)
class Settings:
    operator_image: str = f"infertune/operator:{__version__}"
    tuner_image: str = f"infertune/tuner:{__version__}"
    triton_image: str = DEFAULT_TRITON_IMAGE
    default_backend: str = defaults.CLUSTER_BACKEND
    default_max_trials: int = defaults.MAX_TRIALS
    tuner_storage: str | None = None
    tuner_storage_secret: str | None = None
    tuner_storage_secret_key: str = "url"
    tuner_service_account: str = "infertune-tuner"
    tuner_clusterrole: str = "infertune-tuner"
    job_backoff_limit: int = 2
    # The benchmark part of a trial's time bound (tuner_deadline.py): with the server start-up
    # bound it makes the tuner Job's deadline when spec.tuning.timeoutMinutes is unset.
    trial_benchmark_minutes: int = 30
    model_storage_pvc: str | None = None
    # How often the observer reads each Ready deployment's metrics: Prometheus' common scrape
    # interval is 15-60 s; a 15-minute window then rests on about 30 scrapes per pod.
    observe_interval_s: float = 30.0

    @classmethod
    def from_env(cls) -> Settings:
        d = cls()
        backend = _env("INFERTUNE_DEFAULT_BACKEND", d.default_backend)
        if backend not in get_args(Backend):
            raise ValueError(
                f"INFERTUNE_DEFAULT_BACKEND must be {' or '.join(get_args(Backend))}, "
                f"not {backend!r}"
            )
        return cls(
            operator_image=_env("INFERTUNE_OPERATOR_IMAGE", d.operator_image),
            tuner_image=_env("INFERTUNE_TUNER_IMAGE", d.tuner_image),
            triton_image=_env("INFERTUNE_TRITON_IMAGE", d.triton_image),
            default_backend=backend,
            default_max_trials=int(_env("INFERTUNE_DEFAULT_MAX_TRIALS", str(d.default_max_trials))),
            tuner_storage=os.environ.get("INFERTUNE_TUNER_STORAGE") or None,
            tuner_storage_secret=os.environ.get("INFERTUNE_TUNER_STORAGE_SECRET") or None,
            tuner_storage_secret_key=_env(
                "INFERTUNE_TUNER_STORAGE_SECRET_KEY", d.tuner_storage_secret_key
            ),
            tuner_service_account=_env("INFERTUNE_TUNER_SERVICE_ACCOUNT", d.tuner_service_account),
            tuner_clusterrole=_env("INFERTUNE_TUNER_CLUSTERROLE", d.tuner_clusterrole),
            job_backoff_limit=int(_env("INFERTUNE_JOB_BACKOFF_LIMIT", str(d.job_backoff_limit))),
            trial_benchmark_minutes=_positive(
                "INFERTUNE_TRIAL_BENCHMARK_MINUTES", d.trial_benchmark_minutes
            ),
            model_storage_pvc=os.environ.get("INFERTUNE_MODEL_STORAGE_PVC") or None,
            observe_interval_s=_positive(
                "INFERTUNE_OBSERVE_INTERVAL_SECONDS", int(d.observe_interval_s), "seconds"
            ),
        )

    def backend_for(self, obj: InferenceDeployment) -> str:
        """The backend a deployment tunes (and serves) on: its spec.tuning.backend, else this
        operator's default. `infertune render` and the operator both resolve it here."""
        return obj.spec.tuning.effective_backend(self.default_backend)

    def simulated(self, obj: InferenceDeployment) -> bool:
        return self.backend_for(obj) == "simulated"
