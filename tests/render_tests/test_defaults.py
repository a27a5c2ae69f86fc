"""One source for every default: the API, the request, the operator and `infertune render`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.types import GpuSpec, SearchSpec, TuningSpec
from infertune_operator.cli import app
from infertune_operator.objects.serving import render_serving
from infertune_operator.settings import Settings
from infertune_tuner import defaults
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import GpuRef, SearchValues, TuningOptions

from .test_render import container, manifest

REPO = Path(__file__).resolve().parents[2]


def test_the_api_the_request_and_the_operator_share_the_defaults() -> None:
    api, request = SearchSpec(), SearchValues()
    for dimension in ("tensor_parallel", "max_batch_size", "quantization", "kv_cache_dtype"):
        assert list(getattr(api, dimension)) == list(getattr(request, dimension))
    assert api.max_accuracy_loss_percent == request.max_accuracy_loss_percent
    assert GpuSpec(product="x").max_gpus_per_replica == GpuRef(product="x").max_gpus_per_replica
    assert TuningSpec().effective_max_trials() == TuningOptions().max_trials == defaults.MAX_TRIALS
    assert Settings().default_max_trials == defaults.MAX_TRIALS
    assert TuningSpec().effective_backend() == Settings().default_backend
    assert TuningOptions().backend == defaults.LOCAL_BACKEND  # `infertune tune` on a laptop


@pytest.mark.parametrize("default_backend, simulated", [("simulated", True), ("triton", False)])
def test_render_resolves_the_backend_as_the_operator_does(
    default_backend: str, simulated: bool
) -> None:
    """A spec without spec.tuning.backend is served as the operator's default says."""
    settings = Settings(operator_image="op:1", default_backend=default_backend)
    obj = manifest()
    assert settings.simulated(obj) is simulated
    c = container(render_serving(obj, TrialConfig(2, 128, "fp8", "auto"), settings))
    assert (c["name"] == "simserver") is simulated


def test_infertune_render_follows_the_operator_default(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"].get("tuning", {}).pop("backend", None)
    spec = tmp_path / "no-backend.yaml"
    spec.write_text(yaml.safe_dump(doc))
    args = ["render", str(spec), "--config", "tp=4,max_batch_size=64,quantization=fp8"]
    monkeypatch.setenv("INFERTUNE_DEFAULT_BACKEND", "simulated")
    served = [
        d for d in yaml.safe_load_all(cli.invoke(app, args).stdout) if d["kind"] == "Deployment"
    ]
    assert served[0]["spec"]["template"]["spec"]["containers"][0]["name"] == "simserver"
    monkeypatch.setenv("INFERTUNE_DEFAULT_BACKEND", "triton")
    served = [
        d for d in yaml.safe_load_all(cli.invoke(app, args).stdout) if d["kind"] == "Deployment"
    ]
    assert served[0]["spec"]["template"]["spec"]["containers"][0]["name"] == "triton"
