"""Hostile manifests: `validate` (and `tune`, which loads the same way) answer every one with
exit 2 and the field path, as strictly as the API server would (classes 4 and 5)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from .corpus import Edit, both, check, drop, invoke, manifest, put, rename

W = "spec.workload"
S = "spec.search"
T = "spec.tuning"
A = "spec.model.architecture"
ARCH = {"layers": 32, "hiddenSize": 4096, "heads": 32, "kvHeads": 8, "ffnSize": 14336,
        "vocabSize": 128256}  # fmt: skip


def arch(**changes: object) -> Edit:
    return put(A, {**ARCH, **changes})


# (id, edit, fragment of the message: the field path and/or what is wrong)
STRICT: list[tuple[str, Edit, str]] = [
    # Types the API server rejects and a lax loader would coerce.
    ("bool-for-int", put(f"{W}.inputTokens", True), f"{W}.inputTokens"),
    ("string-for-int", put(f"{W}.inputTokens", "1024"), f"{W}.inputTokens"),
    ("float-for-int", put(f"{W}.inputTokens", 1024.5), f"{W}.inputTokens"),
    ("huge-whole-float-maxtrials", put(f"{T}.maxTrials", 1e30), f"{T}.maxTrials"),
    ("whole-float-seed-2-64", put(f"{T}.seed", 2.0**64), f"{T}.seed"),
    ("whole-float-string", put(f"{W}.inputTokens", "1024.0"), f"{W}.inputTokens"),
    ("half-float-batch", put(f"{S}.maxBatchSize", [8, 32.5]), f"{S}.maxBatchSize[1]"),
    ("whole-float-tp-3", put(f"{S}.tensorParallel", [3.0]), f"{S}.tensorParallel[0]"),
    ("string-output", put(f"{W}.outputTokens", "512"), f"{W}.outputTokens"),
    ("string-stddev", put(f"{W}.inputTokensStddev", "3"), f"{W}.inputTokensStddev"),
    ("string-maxtrials", put(f"{T}.maxTrials", "40"), f"{T}.maxTrials"),
    ("bool-maxtrials", put(f"{T}.maxTrials", True), f"{T}.maxTrials"),
    ("string-seed", put(f"{T}.seed", "7"), f"{T}.seed"),
    ("bool-seed", put(f"{T}.seed", False), f"{T}.seed"),
    ("float-parallelism", put(f"{T}.parallelism", 1.5), f"{T}.parallelism"),
    ("string-p95", put("spec.slo.e2eLatencyMs.p95", "25600"), "spec.slo.e2eLatencyMs.p95"),
    ("bool-p95", put("spec.slo.e2eLatencyMs.p95", True), "spec.slo.e2eLatencyMs.p95"),
    ("string-maxgpus", put("spec.gpu.maxGpusPerReplica", "8"), "spec.gpu.maxGpusPerReplica"),
    ("string-tp-item", put(f"{S}.tensorParallel", ["1"]), f"{S}.tensorParallel[0]"),
    ("bool-tp-item", put(f"{S}.tensorParallel", [True]), f"{S}.tensorParallel[0]"),
    ("tp-not-a-list", put(f"{S}.tensorParallel", 2), f"{S}.tensorParallel"),
    ("tp-3", put(f"{S}.tensorParallel", [3]), f"{S}.tensorParallel[0]"),
    ("tp-empty", put(f"{S}.tensorParallel", []), f"{S}.tensorParallel"),
    ("tp-twice", put(f"{S}.tensorParallel", [1, 1]), "search.tensorParallel: 1 listed twice"),
    ("batch-0", put(f"{S}.maxBatchSize", [0]), f"{S}.maxBatchSize[0]"),
    ("batch-huge", put(f"{S}.maxBatchSize", [10**30]), f"{S}.maxBatchSize[0]"),
    ("batch-string", put(f"{S}.maxBatchSize", ["8"]), f"{S}.maxBatchSize[0]"),
    ("batch-twice", put(f"{S}.maxBatchSize", [8, 8]), "search.maxBatchSize: 8 listed twice"),
    ("quant-unknown", put(f"{S}.quantization", ["int3"]), f"{S}.quantization[0]"),
    ("quant-not-list", put(f"{S}.quantization", "fp8"), f"{S}.quantization"),
    ("kv-unknown", put(f"{S}.kvCacheDtype", ["fp4"]), f"{S}.kvCacheDtype[0]"),
    ("accuracy-string", put(f"{S}.maxAccuracyLossPercent", "1"), f"{S}.maxAccuracyLossPercent"),
    ("accuracy-101", put(f"{S}.maxAccuracyLossPercent", 101), f"{S}.maxAccuracyLossPercent"),
    ("accuracy-negative", put(f"{S}.maxAccuracyLossPercent", -1), f"{S}.maxAccuracyLossPercent"),
    ("sampler-unknown", put(f"{T}.sampler", "bayes"), f"{T}.sampler"),
    ("backend-unknown", put(f"{T}.backend", "gpu-cloud"), f"{T}.backend"),
    ("backend-bool", put(f"{T}.backend", True), f"{T}.backend"),
    ("node-selector-int", put("spec.gpu.nodeSelector", {"pool": 1}), "spec.gpu.nodeSelector.pool"),
    (
        "toleration-operator",
        put("spec.gpu.tolerations", [{"operator": "Maybe"}]),
        "spec.gpu.tolerations[0].operator",
    ),
    (
        "toleration-effect",
        put("spec.gpu.tolerations", [{"effect": "Sometimes"}]),
        "spec.gpu.tolerations[0].effect",
    ),
    ("replicas-string", put("spec.serving.replicas", "2"), "spec.serving.replicas"),
    ("image-int", put("spec.serving.image", 7), "spec.serving.image"),
    # snake_case keys: the API server knows only the camelCase ones.
    ("snake-input", rename(f"{W}.inputTokens", "input_tokens"), f"{W}.input_tokens: unknown field"),
    ("snake-output", rename(f"{W}.outputTokens", "output_tokens"), f"{W}.output_tokens"),
    ("snake-maxtrials", rename(f"{T}.maxTrials", "max_trials"), f"{T}.max_trials: unknown field"),
    ("snake-slo", rename("spec.slo.e2eLatencyMs", "e2e_latency_ms"), "spec.slo.e2e_latency_ms"),
    (
        "snake-maxgpus",
        rename("spec.gpu.maxGpusPerReplica", "max_gpus_per_replica"),
        "spec.gpu.max_gpus_per_replica: unknown field",
    ),
    ("snake-tp", rename(f"{S}.tensorParallel", "tensor_parallel"), f"{S}.tensor_parallel"),
    ("snake-kv", rename(f"{S}.kvCacheDtype", "kv_cache_dtype"), f"{S}.kv_cache_dtype"),
    ("snake-batch", rename(f"{S}.maxBatchSize", "max_batch_size"), f"{S}.max_batch_size"),
    ("snake-api-version", rename("apiVersion", "api_version"), "api_version: unknown field"),
    (
        "snake-startup",
        put("spec.serving.startup_timeout_minutes", 5),
        "spec.serving.startup_timeout_minutes: unknown field",
    ),
    ("snake-arch", both(arch(), rename(f"{A}.hiddenSize", "hidden_size")), f"{A}.hidden_size"),
    (
        "snake-token-ref",
        put("spec.model.source", {"uri": "hf://a/b", "token_secret_ref": {"name": "t"}}),
        "spec.model.source.token_secret_ref: unknown field",
    ),
    # Unknown fields and missing ones.
    ("unknown-spec-field", put("spec.replicas", 2), "spec.replicas: unknown field"),
    (
        "unknown-model-field",
        put("spec.model.revision", "main"),
        "spec.model.revision: unknown field",
    ),
    ("unknown-top-field", put("extra", 1), "extra: unknown field"),
    (
        "wrong-api-version",
        put("apiVersion", "infertune.io/v1"),
        "apiVersion: must be infertune.io/v1alpha1",
    ),
    ("wrong-kind", put("kind", "Deployment"), "kind: must be InferenceDeployment"),
    ("no-spec", drop("spec"), "spec: Field required"),
    ("no-metadata", drop("metadata"), "metadata: Field required"),
    ("no-name", drop("metadata.name"), "metadata.name: Field required"),
    ("no-workload", drop("spec.workload"), "spec.workload: Field required"),
    ("no-gpu", drop("spec.gpu"), "spec.gpu: Field required"),
    ("spec-is-list", put("spec", [1, 2]), "spec"),
    ("workload-is-string", put(f"{W}", "long"), f"{W}"),
    # Names: every derived object (Service: DNS-1035) must be valid; namespaces are DNS-1123.
    ("name-leading-digit", put("metadata.name", "1llama"), "metadata.name"),
    ("name-upper", put("metadata.name", "Llama"), "metadata.name"),
    ("name-underscore", put("metadata.name", "llama_2"), "metadata.name"),
    ("name-leading-dash", put("metadata.name", "-llama"), "metadata.name"),
    ("name-trailing-dash", put("metadata.name", "llama-"), "metadata.name"),
    ("name-dot", put("metadata.name", "llama.2"), "metadata.name"),
    ("name-too-long", put("metadata.name", "a" * 49), "metadata.name"),
    ("name-empty", put("metadata.name", ""), "metadata.name"),
    ("name-int", put("metadata.name", 123), "metadata.name"),
    ("namespace-upper", put("metadata.namespace", "Default"), "metadata.namespace"),
    ("namespace-underscore", put("metadata.namespace", "team_a"), "metadata.namespace"),
    ("namespace-dash", put("metadata.namespace", "-team"), "metadata.namespace"),
    ("namespace-too-long", put("metadata.namespace", "n" * 64), "metadata.namespace"),
    ("namespace-empty", put("metadata.namespace", ""), "metadata.namespace"),
    ("namespace-int", put("metadata.namespace", 5), "metadata.namespace"),
    # Numbers that are no numbers, and out of range.
    ("p95-inf", put("spec.slo.e2eLatencyMs.p95", float("inf")), "spec.slo.e2eLatencyMs.p95"),
    ("p95-nan", put("spec.slo.e2eLatencyMs.p95", float("nan")), "spec.slo.e2eLatencyMs.p95"),
    ("p95-minus-inf", put("spec.slo.e2eLatencyMs.p95", float("-inf")), "spec.slo.e2eLatencyMs.p95"),
    ("ttft-nan", put("spec.slo.ttftMs", {"p50": float("nan")}), "spec.slo.ttftMs.p50"),
    (
        "floor-inf",
        put("spec.slo.minOutputTokensPerSecondPerGpu", float("inf")),
        "spec.slo.minOutputTokensPerSecondPerGpu",
    ),
    (
        "accuracy-nan",
        put(f"{S}.maxAccuracyLossPercent", float("nan")),
        f"{S}.maxAccuracyLossPercent",
    ),
    ("input-0", put(f"{W}.inputTokens", 0), f"{W}.inputTokens"),
    ("input-negative", put(f"{W}.inputTokens", -1), f"{W}.inputTokens"),
    ("output-0", put(f"{W}.outputTokens", 0), f"{W}.outputTokens"),
    ("stddev-negative", put(f"{W}.outputTokensStddev", -1), f"{W}.outputTokensStddev"),
    ("p95-0", put("spec.slo.e2eLatencyMs.p95", 0), "spec.slo.e2eLatencyMs.p95"),
    ("p95-negative", put("spec.slo.e2eLatencyMs.p95", -5), "spec.slo.e2eLatencyMs.p95"),
    ("replicas-negative", put("spec.serving.replicas", -1), "spec.serving.replicas"),
    (
        "startup-0",
        put("spec.serving.startupTimeoutMinutes", 0),
        "spec.serving.startupTimeoutMinutes",
    ),
    ("timeout-0", put(f"{T}.timeoutMinutes", 0), f"{T}.timeoutMinutes"),
    ("parallelism-0", put(f"{T}.parallelism", 0), f"{T}.parallelism"),
    ("parallelism-65", put(f"{T}.parallelism", 65), f"{T}.parallelism"),
    ("maxtrials-0", put(f"{T}.maxTrials", 0), f"{T}.maxTrials"),
    ("maxtrials-1001", put(f"{T}.maxTrials", 1001), f"{T}.maxTrials"),
    ("seed-negative", put(f"{T}.seed", -1), f"{T}.seed"),
    ("seed-2-32", put(f"{T}.seed", 2**32), f"{T}.seed"),
    ("seed-2-64", put(f"{T}.seed", 2**64), f"{T}.seed"),
    ("maxgpus-0", put("spec.gpu.maxGpusPerReplica", 0), "spec.gpu.maxGpusPerReplica"),
    ("maxgpus-65", put("spec.gpu.maxGpusPerReplica", 65), "spec.gpu.maxGpusPerReplica"),
    # SLO shape.
    ("slo-empty", put("spec.slo", {}), "give at least one latency bound"),
    ("slo-no-percentile", put("spec.slo.e2eLatencyMs", {}), "give at least one of p50, p95, p99"),
    ("slo-null", put("spec.slo", None), "spec.slo"),
    ("slo-p90", put("spec.slo.e2eLatencyMs", {"p90": 100}), "spec.slo.e2eLatencyMs.p90"),
    # Model, source, checkpoints, architecture.
    ("model-name-empty", put("spec.model.name", ""), "spec.model.name"),
    ("model-unknown", put("spec.model.name", "gpt-17"), "spec.model.name: unknown model"),
    ("gpu-unknown", put("spec.gpu.product", "L4"), "spec.gpu.product: unknown GPU"),
    ("gpu-empty", put("spec.gpu.product", ""), "spec.gpu.product"),
    ("source-ftp", put("spec.model.source", {"uri": "ftp://weights"}), "spec.model.source.uri"),
    # Object stores: TensorRT-LLM would send the URI to the Hugging Face Hub as an id.
    (
        "source-s3",
        put("spec.model.source", {"uri": "s3://bucket/llama"}),
        "spec.model.source.uri: s3:// is not a source the runtime can load",
    ),
    (
        "source-gs",
        put("spec.model.source", {"uri": "gs://bucket/llama"}),
        "spec.model.source.uri: gs:// is not a source the runtime can load",
    ),
    (
        "checkpoint-s3",
        put("spec.model.checkpoints", {"fp8": "s3://bucket/llama-fp8"}),
        "spec.model.checkpoints.fp8: s3:// is not a source the runtime can load",
    ),
    (
        "checkpoint-not-an-id",
        put("spec.model.checkpoints", {"fp8": "llama-fp8"}),
        "spec.model.checkpoints.fp8",
    ),
    ("source-empty", put("spec.model.source", {"uri": ""}), "spec.model.source.uri"),
    (
        "checkpoint-unknown-quant",
        put("spec.model.checkpoints", {"int3": "hf://a/b"}),
        "spec.model.checkpoints.int3",
    ),
    (
        "checkpoint-two-claims",
        both(
            put("spec.model.source", {"uri": "pvc://one/m"}),
            put("spec.model.checkpoints", {"fp8": "pvc://two/m"}),
        ),
        "every pvc:// URI",
    ),
    (
        "secret-name",
        put("spec.model.source", {"uri": "hf://a/b", "tokenSecretRef": {"name": "Bad_Name"}}),
        "spec.model.source.tokenSecretRef.name",
    ),
    (
        "custom-model-no-weights-triton",
        both(put("spec.model.name", "my-model"), arch(), put(f"{T}.backend", "triton")),
        "spec.model.source.uri: no weights to load for 'my-model'",
    ),
    ("arch-heads-0", arch(heads=0), f"{A}.heads"),
    ("arch-kv-not-dividing", arch(kvHeads=3), "must be a multiple of kvHeads"),
    ("arch-hidden-not-dividing", arch(hiddenSize=4100), "must be a multiple of heads"),
    (
        "arch-moe-active",
        arch(experts=8, expertsActive=9),
        "expertsActive (9) must not exceed experts (8)",
    ),
    (
        "arch-moe-active-no-experts",
        arch(expertsActive=2),
        "expertsActive (2) must not exceed experts",
    ),
    ("arch-layers-string", arch(layers="32"), f"{A}.layers"),
    ("arch-vocab-negative", arch(vocabSize=-1), f"{A}.vocabSize"),
    # What only the tuner's catalogs and performance model can tell (class 4).
    (
        "fp8-only-on-a100",
        both(put("spec.gpu.product", "A100-SXM-80GB"), put(f"{S}.quantization", ["fp8"])),
        "spec.search: the search space is empty on A100-SXM-80GB",
    ),
    (
        "fp8-kv-only-on-a100",
        both(put("spec.gpu.product", "A100-SXM-80GB"), put(f"{S}.kvCacheDtype", ["fp8"])),
        "A100-SXM-80GB has no FP8 KV cache",
    ),
    (
        "tp-not-dividing-heads",
        both(
            put("spec.model.name", "llama-2-13b"),
            put(f"{S}.tensorParallel", [16]),
            put("spec.gpu.maxGpusPerReplica", 16),
        ),
        "does not divide the model's 40 attention heads",
    ),
    (
        "tp-over-max-gpus",
        both(put(f"{S}.tensorParallel", [8]), put("spec.gpu.maxGpusPerReplica", 4)),
        "exceeds gpu.maxGpusPerReplica",
    ),
    (
        "accuracy-allowance",
        both(put(f"{S}.quantization", ["w4a16_awq"]), put(f"{S}.maxAccuracyLossPercent", 0.5)),
        "exceeds maxAccuracyLossPercent",
    ),
    ("nvfp4-on-hopper", put(f"{S}.quantization", ["nvfp4"]), "has no kernels for it"),
    (
        "no-checkpoint-triton",
        both(put(f"{T}.backend", "triton"), put(f"{S}.quantization", ["fp8"])),
        "no pre-quantized checkpoint: set spec.model.checkpoints.fp8",
    ),
    (
        "nothing-fits",
        both(
            put("spec.model.name", "llama-2-70b"),
            put("spec.gpu.product", "L4-24GB"),
            put(f"{S}.tensorParallel", [1]),
            put(f"{S}.quantization", ["bf16"]),
        ),
        "spec.search: no configuration fits in L4-24GB memory",
    ),
    (
        "context-too-long",
        both(
            put("spec.model.name", "llama-2-70b"),
            put(f"{W}.inputTokens", 4000),
            put(f"{W}.outputTokens", 512),
        ),
        "spec.workload: 4000 input + 512 output = 4512 tokens exceed llama-2-70b's maximum context",
    ),
    (
        "storage-not-url",
        put(f"{T}.storage", "not a url"),
        f"{T}.storage: 'not a url' is not a database URL",
    ),
    ("storage-empty", put(f"{T}.storage", ""), f"{T}.storage"),
    ("storage-http", put(f"{T}.storage", "http://db.example/x"), "unknown database dialect 'http'"),
    ("storage-no-dialect", put(f"{T}.storage", "://host/db"), f"{T}.storage"),
]

MISSING_DRIVER = [
    (url, module)
    for url, module in (("mysql://db/optuna", "MySQLdb"), ("postgresql+psycopg2://db/optuna", "psycopg2"),
                        ("oracle+cx_oracle://db/optuna", "cx_Oracle"))
    if importlib.util.find_spec(module) is None
]  # fmt: skip


@pytest.mark.parametrize(("edit", "fragment"), [c[1:] for c in STRICT], ids=[c[0] for c in STRICT])
def test_validate_names_the_field(tmp_path: Path, edit: Edit, fragment: str) -> None:
    check(invoke(["validate", manifest(tmp_path, edit)]), 2, fragment)


@pytest.mark.parametrize(("url", "module"), MISSING_DRIVER)
def test_storage_driver_not_installed(tmp_path: Path, url: str, module: str) -> None:
    result = invoke(["validate", manifest(tmp_path, put(f"{T}.storage", url))])
    check(result, 2, f"{T}.storage: the storage URL's driver")
    assert module in result.output


# `tune` loads the same way: the same answer, before any trial (the out dir stays empty).
TUNE_TOO = [c for c in STRICT if c[0] in {
    "bool-for-int", "string-for-int", "snake-input", "name-leading-digit", "p95-inf",
    "seed-2-32", "fp8-only-on-a100", "storage-not-url", "arch-moe-active", "namespace-upper",
    "context-too-long", "no-checkpoint-triton",
}]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "fragment"), [c[1:] for c in TUNE_TOO], ids=[c[0] for c in TUNE_TOO]
)
def test_tune_refuses_before_any_trial(tmp_path: Path, edit: Edit, fragment: str) -> None:
    out = tmp_path / "out"
    backend = "triton" if "triton" in fragment or "checkpoint" in fragment else "simulated"
    result = invoke(["tune", manifest(tmp_path, edit), "--out", out, "--no-progress",
                     "--backend", backend])  # fmt: skip
    check(result, 2, fragment)
    assert not (out / "report.json").exists()


# What the cluster accepts, the CLI accepts: kubectl sends YAML as JSON, where a number with an
# integral value is an integer (`inputTokens: 1024.0` reaches the API server as 1024, and the
# CRD's integer fields take it), so `validate` and `tune` take it too.
AS_KUBECTL_SENDS: list[tuple[str, Edit]] = [
    ("whole-float-input", put(f"{W}.inputTokens", 1024.0)),
    ("whole-float-output", put(f"{W}.outputTokens", 128.0)),
    ("whole-float-maxtrials", put(f"{T}.maxTrials", 3.0)),
    ("whole-float-seed", put(f"{T}.seed", 1.0)),
    ("whole-float-tp-items", put(f"{S}.tensorParallel", [1.0, 2.0])),
    ("whole-float-batch-items", put(f"{S}.maxBatchSize", [8.0, 32])),
    ("whole-float-maxgpus", put("spec.gpu.maxGpusPerReplica", 8.0)),
    ("whole-float-replicas", put("spec.serving.replicas", 2.0)),
    ("whole-float-p95", put("spec.slo.e2eLatencyMs.p95", 60000.0)),
]


@pytest.mark.parametrize(
    "edit", [c[1] for c in AS_KUBECTL_SENDS], ids=[c[0] for c in AS_KUBECTL_SENDS]
)
def test_validate_accepts_what_kubectl_sends(tmp_path: Path, edit: Edit) -> None:
    check(invoke(["validate", manifest(tmp_path, edit)]), 0, "valid InferenceDeployment 'hostile'")


def test_tune_takes_whole_floats_as_the_cluster_does(tmp_path: Path) -> None:
    """YAML and JSON alike; the report's request holds the integers the cluster would store."""
    edits = [e for _, e in AS_KUBECTL_SENDS]
    for name in ("manifest.yaml", "manifest.json"):
        spec = manifest(tmp_path, *edits, name=name)
        if name.endswith(".json"):
            spec.write_text(json.dumps(yaml.safe_load(spec.read_text())), encoding="utf-8")
            assert "1024.0" in spec.read_text()
        out = tmp_path / f"out-{name}"
        check(invoke(["tune", spec, "--out", out, "--no-progress"]), 0, "3 trials executed")
        request = json.loads((out / "report.json").read_text())["request"]
        assert request["workload"]["input_tokens"] == 1024
        assert isinstance(request["workload"]["input_tokens"], int)
        assert request["search"]["tensor_parallel"] == [1, 2]


def test_a_valid_manifest_is_valid(tmp_path: Path) -> None:
    """The corpus's base manifest passes: the cases fail for their edit alone."""
    check(invoke(["validate", manifest(tmp_path)]), 0, "valid InferenceDeployment 'hostile'")


def test_a_custom_architecture_without_weights_tunes_simulated_and_renders_no_real_server(
    tmp_path: Path,
) -> None:
    """A model described only by its architecture has no weights: the simulated pool tunes it
    and serves it, while real trials and a real server are refused with the fix, never a
    traceback."""
    spec = manifest(tmp_path, put("spec.model.name", "my-model"), arch())
    check(
        invoke(["tune", spec, "--out", tmp_path / "sim", "--no-progress"]), 0, "3 trials executed"
    )
    out = tmp_path / "real"
    real = invoke(["tune", spec, "--out", out, "--no-progress", "--backend", "triton"])
    check(real, 2, "spec.model.source.uri: no weights to load for 'my-model'")
    assert not (out / "report.json").exists()
    config = "tp=1,max_batch_size=8,quantization=bf16,kv_cache_dtype=auto"
    check(invoke(["render", spec, "--config", config, "--no-simulated"]), 2,
          "Set spec.model.source.uri")  # fmt: skip
    sim = invoke(["render", spec, "--config", config, "--simulated"])
    check(sim, 0, "kind: Deployment")
    model_yaml = next(d for d in yaml.safe_load_all(sim.output) if d["kind"] == "ConfigMap")
    assert yaml.safe_load(model_yaml["data"]["model.yaml"])["model"] == "my-model"
