"""The metric registry (infertune_tuner/metrics.py) is the one place a latency metric is named.

Adding one (say TPOT) is its registry entry, its measurement (a `Measurement` field and the
load generator's statistic), its prediction (a `Prediction` field) and a regenerated CRD:
docs/architecture.md walks through it. These tests keep it that way: every registered metric
reaches every place that lists metrics, and no other module spells a metric's name.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import yaml

from infertune_operator.api.crd import crd
from infertune_operator.api.types import BestMetrics, SloSpec
from infertune_tuner.backends.replay import COLUMNS
from infertune_tuner.harness.stats import BenchResult
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES, latency_metric
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import SloBound
from infertune_tuner.result import Metrics

REPO = Path(__file__).resolve().parents[2]
SOURCES = [*REPO.glob("operator/src/**/*.py"), *REPO.glob("tuner/src/**/*.py")]
# Where a metric's name may be spelled: the registry, and the three places that produce a
# value for each metric (its measurement, its load-generator statistic, its prediction). The
# simulated pool models how TTFT and E2E grow when the KV cache caps the batch (physics, not
# bookkeeping), and the reference points are a published table's columns.
ALLOWED = {
    "tuner/src/infertune_tuner/metrics.py",
    "tuner/src/infertune_tuner/measurement.py",
    "tuner/src/infertune_tuner/harness/stats.py",
    "tuner/src/infertune_tuner/perfmodel/latency.py",
    "tuner/src/infertune_tuner/backends/simulated.py",
    "tuner/src/infertune_tuner/perfmodel/reference.py",
}


def test_every_metric_has_its_measurement_prediction_and_statistic() -> None:
    for holder in (Measurement, Prediction, BenchResult):
        names = {f.name for f in dataclasses.fields(holder)} | set(dir(holder))
        missing = [m.key for m in LATENCY_METRICS if m.key not in names]
        assert not missing, f"{holder.__name__} lacks {missing}"


def test_every_metric_reaches_the_api_the_crd_the_report_and_replay_tables() -> None:
    slo = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["slo"]
    for m in LATENCY_METRICS:
        assert m.slo_field in SloSpec.model_fields
        assert m.wire in slo["properties"]
        assert f"has(self.{m.wire})" in slo["x-kubernetes-validations"][0]["rule"]
        assert m.key in Metrics.model_fields
        assert SloBound(metric=m.key, percentile="p95", max_ms=1).label().startswith(m.label)
        for p in PERCENTILES:
            assert m.column(p) in BestMetrics.model_fields
            assert m.column(p) in COLUMNS


def test_the_generated_crd_file_lists_every_metric() -> None:
    text = (REPO / "crds" / "inferencedeployments.infertune.io.yaml").read_text()
    schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    best = schema["properties"]["status"]["properties"]["bestMetrics"]["properties"]
    for m in LATENCY_METRICS:
        assert f"{m.prefix}P95Ms" in best


def test_an_unregistered_metric_is_refused_with_the_known_ones() -> None:
    try:
        latency_metric("tpot_ms_typo")
    except ValueError as exc:
        assert "ttft_ms" in str(exc) and "e2e_ms" in str(exc)
    else:
        raise AssertionError("an unknown metric key was accepted")


def _spelled(path: Path, words: set[str]) -> list[str]:
    """Attribute accesses and string constants equal to a metric's key, field or wire name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in words:
            found.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in words:
            found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    return found


def test_no_other_module_spells_a_metric_name() -> None:
    words = {w for m in LATENCY_METRICS for w in (m.key, m.slo_field, m.wire)}
    words |= {m.column(p) for m in LATENCY_METRICS for p in PERCENTILES}
    offenders = [
        hit
        for path in SOURCES
        if str(path.relative_to(REPO)) not in ALLOWED
        for hit in _spelled(path, words)
    ]
    assert not offenders, "read metrics through metrics.LATENCY_METRICS: " + "; ".join(offenders)
