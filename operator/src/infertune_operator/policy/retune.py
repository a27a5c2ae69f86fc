"""A retune (pure): tune again with the observed workload, and whether its result is worth
rolling out (``spec.tuning.retune: OnDrift``).

The retune is the tuning of the spec with one change, ``workload``: the observed mean input and
output tokens (two significant digits, ``drift.significant``). It runs as a tuner Job of its own
(``<name>-retune-<hash>``, request ``…-request``), writes its report into
``<name>-retune-report`` (the tuning's own report stays), and the serving configuration keeps
serving meanwhile. Its hash covers the tuning hash and the observed workload, so the same drift
never starts a second Job, and a spec change (a new tuning hash) supersedes it.

The verdict (:func:`verdict`), per the new report, on the configuration serving now (C):

* the report found nothing that meets the SLO, or C itself is still its best: keep C;
* C was measured in the retune and misses the SLO under the observed workload: roll out the best;
* C was measured and meets it: roll out only when the best beats it by more than the noise
  (``noise.beats`` with both configurations' repeats: 6.2 % with two runs each);
* C could not serve the observed workload (predicted not to fit, OOM, failed): roll out;
* C was not measured (the search ruled it out as unlikely to beat its best): keep C. infertune
  rolls a configuration out on a measured margin only; the message says so.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from infertune_operator.api.types import InferenceDeployment
from infertune_operator.naming import (
    ANNOTATION_RETUNE_HASH,
    COMPONENT_RETUNE,
    LABEL_COMPONENT,
    Body,
    retune_job_name,
    retune_report_name,
    retune_request_name,
)
from infertune_operator.objects.tuner_job import (
    REQUEST_KEY,
    request_configmap,
    tuner_job,
    tuning_request,
)
from infertune_operator.policy import noise
from infertune_operator.settings import Settings
from infertune_tuner import pools
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest, WorkloadShape
from infertune_tuner.result import Report


@dataclass(frozen=True)
class Workload:
    input_tokens: int
    output_tokens: int


def retune_hash(th: str, workload: Workload) -> str:
    canonical = json.dumps([th, workload.input_tokens, workload.output_tokens])
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:7]


def retune_request(obj: InferenceDeployment, settings: Settings, w: Workload) -> TuningRequest:
    """The spec's request with the observed workload (no stddev: the observation has none)."""
    request = tuning_request(obj, settings)
    shape = WorkloadShape(input_tokens=w.input_tokens, output_tokens=w.output_tokens)
    return request.model_copy(update={"workload": shape})


def retune_objects(
    obj: InferenceDeployment,
    body: Mapping[str, Any],
    th: str,
    w: Workload,
    settings: Settings,
) -> tuple[Body, Body]:
    """(request ConfigMap, Job) of the retune: the tuner Job of the tuning, renamed, with the
    observed workload in its request, writing ``<name>-retune-report``. With several GPU pools
    the retune tunes the pool that serves (on its nodes): the workload moved, not the prices,
    and one Job of one pool needs no shared study."""
    name = body["metadata"]["name"]
    rhash = retune_hash(th, w)
    job_name, cm_name = retune_job_name(name, rhash), retune_request_name(name, rhash)
    request = retune_request(obj, settings, w)
    request = request.model_copy(
        update={"tuning": request.tuning.model_copy(update={"storage": None})}
    )
    cm = request_configmap(obj, body, th, settings)
    products = obj.spec.gpu.products
    pool = None
    if len(products) > 1:
        serving = (((body.get("status") or {}).get("bestConfig")) or {}).get("gpu")
        pool = products.index(serving) if serving in products else 0
        request = pools.single(request, products[pool])
    job = tuner_job(obj, body, th, settings, pool=pool)
    for o, new_name in ((cm, cm_name), (job, job_name)):
        meta = o["metadata"]
        meta["name"] = new_name
        meta["labels"][LABEL_COMPONENT] = COMPONENT_RETUNE
        meta["annotations"][ANNOTATION_RETUNE_HASH] = rhash
    cm["data"] = {REQUEST_KEY: request.to_json()}
    template = job["spec"]["template"]
    template["metadata"]["labels"][LABEL_COMPONENT] = COMPONENT_RETUNE
    pod = template["spec"]
    for volume in pod["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["name"] = cm_name
    command = copy.deepcopy(pod["containers"][0]["command"])
    command[command.index("--report-configmap") + 1] = retune_report_name(name)
    pod["containers"][0]["command"] = [*command, "--retune-hash", rhash]
    return cm, job


# ------------------------------------------------------------------ the verdict

Decision = Literal["RolledOut", "KeptCurrent"]


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    message: str
    best: TrialConfig | None = None  # the retune's best (None: nothing met the SLO)
    best_tps: float | None = None
    current_tps: float | None = None  # the serving configuration, measured in the retune
    margin: float | None = None  # the improvement rolling out required


def verdict(report: Report, current: TrialConfig, w: Workload) -> Verdict:
    """Roll out the retune's best, or keep ``current`` (see the module docstring)."""
    at = f"at {w.input_tokens} in / {w.output_tokens} out"
    if report.best is None:
        return Verdict("KeptCurrent", f"the retune found no configuration that meets the SLO {at}; "
                       f"{current.label()} keeps serving")  # fmt: skip
    best = report.best.config.to_config()
    best_tps = report.best.metrics.output_tokens_per_s_per_gpu
    if best == current:
        return Verdict("KeptCurrent", f"{current.label()} is still the best {at} "
                       f"({best_tps:.0f} tok/s/GPU)", best, best_tps, best_tps)  # fmt: skip
    measured = next((m for m in report.measured if m.config.to_config() == current), None)
    if measured is not None and measured.state == "complete" and measured.metrics is not None:
        tps = measured.metrics.output_tokens_per_s_per_gpu
        runs = (report.best.repeats, len(measured.trials))
        margin = noise.improvement_margin(*runs)
        said = (f"{best.label()} {best_tps:.0f} tok/s/GPU vs {current.label()} {tps:.0f} {at} "
                f"(needed +{margin * 100:.1f}%, the noise of {runs[0]} and {runs[1]} runs)")  # fmt: skip
        if measured.slo_ok is False:
            return Verdict("RolledOut", f"{current.label()} misses the SLO {at}; {said}",
                           best, best_tps, tps, margin)  # fmt: skip
        if noise.beats(best_tps, tps, *runs):
            return Verdict("RolledOut", said, best, best_tps, tps, margin)
        return Verdict("KeptCurrent", f"within measurement noise: {said}",
                       best, best_tps, tps, margin)  # fmt: skip
    failed = next((t for t in report.trials if t.config.to_config() == current), None)
    if failed is not None and failed.state in ("infeasible_predicted", "oom", "failed"):
        return Verdict("RolledOut", f"{current.label()} cannot serve {at} ({failed.state}: "
                       f"{failed.reason or 'see the retune report'}); {best.label()} "
                       f"{best_tps:.0f} tok/s/GPU", best, best_tps)  # fmt: skip
    return Verdict("KeptCurrent", f"the retune did not measure {current.label()} {at} (its "
                   f"search judged it unlikely to beat {best.label()} {best_tps:.0f} tok/s/GPU); "
                   "infertune rolls out on a measured margin only", best, best_tps)  # fmt: skip
