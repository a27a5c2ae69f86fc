"""spec.serving: how the winner is served, verified after rollout, and watched while it serves.

* ``replicas``, ``image``, ``resources``, ``startupTimeoutMinutes``: the serving Deployment;
* ``verification``: a short, bounded load test of the rolled-out configuration (the tuner's
  load generator against the Service, the spec's workload at the tuned concurrency), on by
  default; ``enabled: false`` for services that must never see synthetic load;
* ``observe``: reading the live workload from what the serving pods expose (or a Prometheus
  server), for ``status.observedWorkload`` and the drift conditions; read-only, on by default.

None of it is part of the tuning hash: changing it never tunes again (docs/operator.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from infertune_operator.api.base import ApiModel
from infertune_operator.api.formats import Quantity
from infertune_tuner import defaults

# A verification is a trial's benchmark; its Job is bounded by this (activeDeadlineSeconds).
DEFAULT_VERIFICATION_SECONDS = 600
DEFAULT_WINDOW_MINUTES = 15


class ResourceOverrides(ApiModel):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class VerificationSpec(ApiModel):
    """The load test after every rollout (docs/operator.md, *Verification*)."""

    enabled: bool = Field(
        default=True,
        description="Run a short load test against the Service after every rollout (default "
        "true). false: the service never sees synthetic load.",
    )
    requests: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        default=None,
        description="Measured requests (default: as many as a tuning trial of the configuration "
        "measured, so the tuner's measurement noise applies to the comparison).",
    )
    duration_seconds: Annotated[int, Field(ge=30, le=24 * 3600)] = Field(
        default=DEFAULT_VERIFICATION_SECONDS,
        description="The longest the verification may take, warm-up included (the Job's "
        "activeDeadlineSeconds; the load generator stops there).",
    )


class PrometheusSource(ApiModel):
    url: str = Field(
        pattern=r"^https?://[^\s]+$",
        description="The Prometheus server's base URL (http://prometheus.monitoring:9090); "
        "it must scrape the serving pods' metrics port.",
    )


class ObserveSpec(ApiModel):
    """Reading the live workload (docs/operator.md, *The observed workload*)."""

    enabled: bool = Field(
        default=True,
        description="Read the live workload (request rate, concurrency, token lengths, TTFT) "
        "into status.observedWorkload and watch it for drift (default true).",
    )
    source: Literal["pods", "prometheus"] = Field(
        default="pods",
        description="pods: each serving pod's metrics endpoint (port 8002), read through the "
        "API server; prometheus: the server in observe.prometheus.",
    )
    prometheus: PrometheusSource | None = None
    window_minutes: Annotated[int, Field(ge=1, le=24 * 60)] = Field(
        default=DEFAULT_WINDOW_MINUTES,
        description="The rolling window of the summary, and how long the workload must stay "
        "away from the tuned one before WorkloadDrifted or SloAtRisk turns True.",
    )

    @model_validator(mode="after")
    def _named_server(self) -> ObserveSpec:
        if self.source == "prometheus" and self.prometheus is None:
            raise ValueError("source prometheus needs prometheus.url")
        return self


class ServingSpec(ApiModel):
    replicas: Annotated[int, Field(ge=0)] = 1
    image: str | None = Field(
        default=None, description="Serving image; defaults to the Triton TRT-LLM image."
    )
    resources: ResourceOverrides | None = None
    startup_timeout_minutes: Annotated[int, Field(ge=1, le=24 * 60)] = Field(
        default=defaults.STARTUP_TIMEOUT_MINUTES,
        description="How long a server may take to download and load the model before it must "
        "be ready (the serving pod's startup probe, and every tuning trial).",
    )
    verification: VerificationSpec = VerificationSpec()
    observe: ObserveSpec = ObserveSpec()
