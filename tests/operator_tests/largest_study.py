"""The report of the largest study the CRD allows, built from the tuner's own models.

Running it for real (1000 trials over 4480 configurations) would take far longer than a test may,
so the report is assembled the way ``run.build_report`` lays one out, from the performance
model's predictions of every configuration of that space: 1000 executed trials (every SLO bound
checked, one in ten failed with a long log tail as its reason), every other configuration ruled
out by prediction, and the untried configurations listed one by one.
"""

from __future__ import annotations

import base64
import random
import uuid
from typing import Any

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.policy.tuning import validate
from infertune_tuner.config import MAX_BATCH_SIZE_LIMIT
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.request import TuningRequest
from infertune_tuner.result import Metrics, Predicted, Report
from infertune_tuner.run import prior_predictions
from infertune_tuner.space import build_space

from .apiserver import NS

MAX_TRIALS = 1000  # TuningSpec.max_trials: le=1000
# Every list of spec.search at its CRD maximum (maxItems): 7 TP sizes, 64 batch sizes, every
# quantization and KV dtype. Llama-2-70B's 64 attention heads let every TP size divide them;
# the H100 runs 5 of the 6 quantizations (not NVFP4): 7 x 64 x 5 x 2 = 4480 configurations.
SEARCH = {
    "tensorParallel": [1, 2, 4, 8, 16, 32, 64],
    "maxBatchSize": sorted({1 << i for i in range(17)} | set(range(3, 160, 3)))[:64],
    "quantization": ["bf16", "fp16", "fp8", "w4a16_awq", "w4a8_awq", "nvfp4"],
    "kvCacheDtype": ["auto", "fp8"],
    "maxAccuracyLossPercent": 100,
}
SLO = {
    "ttftMs": {"p50": 2000, "p95": 3000, "p99": 5000},
    "itlMs": {"p50": 50, "p95": 80, "p99": 100},
    "e2eLatencyMs": {"p50": 20000, "p95": 30000, "p99": 40000},
    "minOutputTokensPerSecondPerGpu": 10,
}


def largest_manifest(name: str = "huge") -> dict[str, Any]:
    assert len(SEARCH["maxBatchSize"]) == 64 and max(SEARCH["maxBatchSize"]) <= MAX_BATCH_SIZE_LIMIT
    return {
        "apiVersion": "infertune.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4()),
                     "resourceVersion": "1", "generation": 1},
        "spec": {
            "model": {"name": "llama-2-70b"},
            "gpu": {"product": "H100-SXM-80GB", "maxGpusPerReplica": 64},
            "workload": {"inputTokens": 1024, "outputTokens": 512},
            "slo": SLO,
            "search": SEARCH,
            "tuning": {"backend": "simulated", "maxTrials": MAX_TRIALS, "seed": 7},
        },
    }  # fmt: skip


def _request(body: dict[str, Any]) -> TuningRequest:
    obj, problems = validate(body)
    assert isinstance(obj, InferenceDeployment), problems
    return to_request(obj)


def _log_tail(rng: random.Random) -> str:
    lines = [
        f"[TensorRT-LLM][ERROR] {rng.randrange(10**6):06d} CUDA runtime error in "
        f"cudaMemcpyAsync(dst, src, {rng.randrange(1 << 30)} bytes): an illegal memory access "
        f"was encountered (rank {rng.randrange(64)}, stream 0x{rng.randrange(1 << 48):x})"
        for _ in range(12)
    ]
    return "the server died during the benchmark: " + " | ".join(lines)


def _noise(rng: random.Random, chars: int) -> str:
    return base64.b64encode(rng.randbytes(chars * 3 // 4)).decode("ascii")


def largest_report(body: dict[str, Any], *, seed: int = 1, incompressible: bool = False) -> Report:
    """The report of ``largest_manifest()``'s study (see the module docstring).

    ``incompressible``: every executed trial also carries 1500 characters of random text in its
    reason (a report gzip cannot shrink into a ConfigMap).
    """
    rng = random.Random(seed)
    request = _request(body)
    space = build_space(request, request.resolve_model(), request.resolve_gpu())
    priors = prior_predictions(request, space)
    configs = list(space.configs)
    rng.shuffle(configs)
    executed, rest = configs[:MAX_TRIALS], configs[MAX_TRIALS:]
    trials: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    for number, cfg in enumerate(executed):
        p = priors[cfg]
        metrics = Metrics(
            **Metrics.latency_fields(p),
            output_tokens_per_s_per_gpu=round(p.output_tokens_per_s_per_gpu, 3),
        ).model_dump(mode="json")
        checks = [
            {"bound": b.label(), "metric": b.metric, "percentile": b.percentile,
             "limit_ms": b.max_ms, "value_ms": metrics[b.metric][b.percentile],
             "ok": metrics[b.metric][b.percentile] <= b.max_ms}
            for b in request.slo
        ]  # fmt: skip
        failed = number % 10 == 9
        trial = {
            "number": number, "config": cfg.as_dict(), "state": "failed" if failed else "complete",
            "executed": True, "slo_ok": None if failed else all(c["ok"] for c in checks),
            "metrics": None if failed else metrics,
            "predicted": Predicted.of(p).model_dump(mode="json"),
            "reason": _log_tail(rng) if failed else None,
            **({"reason": _noise(rng, 1500)} if incompressible else {}),
            "slo_checks": [] if failed else checks,
            "duration_s": round(rng.uniform(120, 3600), 3), "purpose": "explore",
        }  # fmt: skip
        trials.append(trial)
        fast = (
            best is None
            or metrics["output_tokens_per_s_per_gpu"]
            > (best["metrics"]["output_tokens_per_s_per_gpu"])
        )
        if not failed and trial["slo_ok"] and fast:
            best = {"config": cfg.as_dict(), "metrics": metrics, "trial": number}
    for number, cfg in enumerate(rest, start=len(executed)):
        p = priors[cfg]
        trials.append({
            "number": number, "config": cfg.as_dict(), "state": "infeasible_predicted",
            "executed": False, "predicted": Predicted.of(p).model_dump(mode="json"),
            "reason": "predicted slower than the best by more than 2 % (posterior P(beat) "
                      f"{rng.random() / 100:.4f}) at {p.output_tokens_per_s_per_gpu:.1f} tok/s/GPU",
        })  # fmt: skip
    untried = [{
        "kind": "posterior", "reason": "the posterior gives it little chance to beat the best",
        "count": len(rest), "by_tp": {str(tp): sum(1 for c in rest if c.tp == tp)
                                      for tp in sorted({c.tp for c in rest})},
        "max_p_beat": 0.01,
        "configs": [{"config": c.label(), "detail": f"{priors[c].output_tokens_per_s_per_gpu:.0f} "
                     "tok/s/GPU predicted", "p_beat": round(rng.random() / 100, 4)} for c in rest],
    }]  # fmt: skip
    data: dict[str, Any] = {
        "request": request.dump(), "backend": "simulated", "sampler": "auto",
        "space_size": len(space), "trials": trials, "best": best,
        "executed_trials": len(executed), "stopped_reason": "budget: 1000 trials executed",
        "untried": untried, "duration_s": 1.0e6, "generated_at": "2026-01-01T00:00:00+00:00",
        "infertune_version": "test",
    }  # fmt: skip
    if "measured" in Report.model_fields:  # one entry per measured configuration, when reported
        data["measured"] = [
            {"config": t["config"], "trials": [t["number"]], "state": t["state"],
             "slo_ok": t.get("slo_ok"), "metrics": t.get("metrics")}
            for t in trials if t["executed"]
        ]  # fmt: skip
    assert len(LATENCY_METRICS) * 3 == len(request.slo)
    return Report.model_validate(data)
