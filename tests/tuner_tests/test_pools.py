"""Several GPU pools in one study: the cheapest per million output tokens within the SLO wins,
measurements inform the pools whose model error they share, and a one-pool spec is untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.api.to_request import to_request
from infertune_operator.api.types import InferenceDeployment
from infertune_operator.cli import app
from infertune_tuner import pools
from infertune_tuner.backends import make_backend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import GpuPool, GpuRef
from infertune_tuner.run import prior_predictions
from infertune_tuner.search.driver import study_name
from infertune_tuner.search.evidence import Evidence
from infertune_tuner.search.posterior import TPS, Posterior, Prior, residuals
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import search_space

from .helpers import request

REPO = Path(__file__).resolve().parents[2]
WORLDS = REPO / "benchmarks" / "pool-worlds"
EXAMPLE = REPO / "examples" / "llama2-70b-a100-or-h100.yaml"
A100, H100, H200 = "A100-SXM-80GB", "H100-SXM-80GB", "H200-SXM-141GB"


def priced(*products_prices: tuple[str, float], **pool_args: int):  # type: ignore[no-untyped-def]
    """helpers.request on priced pools."""
    base = request()
    listed = [GpuPool(product=p, price_per_gpu_hour=c) for p, c in products_prices]
    gpu = GpuRef(product=listed[0].product, max_gpus_per_replica=8, pools=listed, **pool_args)
    return base.model_copy(update={"gpu": gpu})


def replay_spec(world: str) -> str:
    tables = sorted(WORLDS.glob(f"{world}.*.csv"))
    return "replay:" + ",".join(f"{t.name.split('.')[1]}={t}" for t in tables)


def test_two_real_pools_deploy_on_the_cheaper_per_token_and_say_why_the_other_lost(
    tmp_path: Path, cli: CliRunner
) -> None:
    """mistral-7b at 256/256 measured on A100-40GB ($1.99/h) and H100 ($3.99/h): the H100 is
    twice the price and still the cheaper per token (index.json: $0.6353 vs $0.7176)."""
    world = "mistral-7b-256"
    result = cli.invoke(app, ["tune", str(WORLDS / f"{world}.json"),
                              "--backend", replay_spec(world), "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    truth = json.loads((WORLDS / "index.json").read_text())
    optimum = next(w for w in truth["worlds"] if w["world"] == world)["optimum"]
    report = json.loads((tmp_path / "report.json").read_text())
    best = report["best"]
    assert best["gpu"] == optimum["product"] == "H100-SXM-80GB"
    assert best["config"]["gpu"] == best["gpu"]
    assert best["cost_per_million_output_tokens"] <= optimum["usd_per_million_output_tokens"] * 1.02
    verdicts = {p["product"]: p for p in report["pools"]}
    assert verdicts["H100-SXM-80GB"]["verdict"] == "chosen"
    lost = verdicts["A100-SXM-40GB"]
    assert lost["verdict"] == "costlier" and "more per output token than H100" in lost["reason"]
    assert lost["cost_per_million_output_tokens"] > best["cost_per_million_output_tokens"]
    words = " ".join(result.stdout.split())
    assert "per 1M output tokens: the cheapest of 2 pools" in words
    assert "pool A100-SXM-40GB at $1.99/GPU-hour" in words
    md = (tmp_path / "report.md").read_text()
    assert "## Which GPU" in md
    html = (tmp_path / "report.html").read_text()
    assert "cost per 1M output tokens" in html  # the Pareto plot's axis


def test_a_pool_the_model_rules_out_is_never_measured_and_the_report_says_so(
    tmp_path: Path, cli: CliRunner
) -> None:
    """Llama-2-70B under the public sweep's SLO on simulated A100/H100 pools at Lambda's prices:
    the model gives the A100 no real chance against FP8 on H100, so no trial goes there."""
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    a100 = next(p for p in report["pools"] if p["product"] == A100)
    assert report["best"]["gpu"] == H100
    assert a100["executed_trials"] == 0
    assert a100["verdict"] == "ruled_out" and a100["p_beat"] < 0.05
    assert not any(t["config"].get("gpu") == A100 for t in report["trials"] if t["executed"])


def test_a_one_pool_spec_is_the_request_and_study_it_always_was() -> None:
    """gpu.product, or gpu.pools with one pool: no pool parameter, no pool key in any JSON, the
    same study name; so a study tuned before pools existed resumes as it was."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["gpu"] = {"product": H100, "maxGpusPerReplica": 8}
    one = to_request(InferenceDeployment.model_validate(doc))
    doc["spec"]["gpu"] = {"pools": [{"product": H100}], "maxGpusPerReplica": 8}
    listed = to_request(InferenceDeployment.model_validate(doc))
    assert one == listed
    assert "pools" not in one.dump()["gpu"]
    assert study_name(one, "simulated") == study_name(listed, "simulated")
    space = search_space(one, one.resolve_model())
    assert space.gpus == () and all(c.gpu == "" for c in space.configs)
    assert "gpu" not in space.configs[0].as_dict()


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"pools": [{"product": A100, "pricePerGpuHour": 2.79}, {"product": H100}]},
         "every pool needs pricePerGpuHour"),
        ({"product": H100, "pools": [{"product": H100}]}, "not both"),
        ({"pools": [{"product": H100, "pricePerGpuHour": 3}, {"product": H100,
                                                              "pricePerGpuHour": 3}]},
         "gpu.pools[].product"),
        ({"pools": [{"product": "H100-NOPE", "pricePerGpuHour": 3},
                    {"product": A100, "pricePerGpuHour": 2}]}, "spec.gpu.pools[0].product"),
    ],
)  # fmt: skip
def test_a_bad_pool_list_is_refused_with_what_to_change(
    tmp_path: Path, cli: CliRunner, gpu: dict, message: str
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["gpu"] = gpu
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    result = cli.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


def test_the_replay_backend_needs_one_table_per_pool(tmp_path: Path) -> None:
    req = to_request(InferenceDeployment.model_validate(
        json.loads((WORLDS / "mistral-7b-256.json").read_text())))  # fmt: skip
    table = WORLDS / "mistral-7b-256.H100-SXM-80GB.csv"
    with pytest.raises(InputError, match="one table per pool"):
        make_backend(f"replay:{table}", req)
    with pytest.raises(InputError, match=r"no table for the pool.*A100-SXM-40GB"):
        make_backend(f"replay:H100-SXM-80GB={table}", req)
    with pytest.raises(InputError, match="H200-SXM-141GB is not a pool of this spec"):
        make_backend(f"replay:H200-SXM-141GB={table}", req)
    with pytest.raises(InputError, match="one pool per tuner process"):
        make_backend("triton", req)


def test_a_pool_of_one_gpu_nodes_tunes_tp1_there_only() -> None:
    """A GH200 node is one superchip: maxGpusPerReplica 1 on its pool keeps TP 2 elsewhere."""
    req = priced((H100, 3.99), ("GH200-96GB", 2.29))
    gpu = req.gpu.model_copy(update={"pools": [
        GpuPool(product=H100, price_per_gpu_hour=3.99),
        GpuPool(product="GH200-96GB", price_per_gpu_hour=2.29, max_gpus_per_replica=1),
    ]})  # fmt: skip
    req = req.model_copy(update={"gpu": gpu})
    space = search_space(req, req.resolve_model())
    assert {c.tp for c in space.configs if c.gpu == "GH200-96GB"} == {1}
    assert {c.tp for c in space.configs if c.gpu == H100} >= {2, 4, 8}
    assert any(e.value.endswith("on GH200-96GB") for e in space.excluded)


def test_the_objective_is_tokens_per_dollar() -> None:
    req = priced((A100, 2.0), (H100, 4.0))
    a, h = TrialConfig(1, 8, "fp16", "auto", A100), TrialConfig(1, 8, "fp16", "auto", H100)
    assert pools.worth(req, a) == 1.0 and pools.worth(req, h) == 0.5
    # 2000 tok/s/GPU at $4/h beats 900 at $2/h: 0.556 vs 0.617 $ per 1M tokens
    assert pools.value(req, h, 2000) > pools.value(req, a, 900)
    assert pools.cost_per_million(4.0, 2000) == pytest.approx(4.0 / (2000 * 3600) * 1e6)
    assert pools.worth(request(), TrialConfig(1, 8, "fp16", "auto")) == 1.0


def _ok(tps: float) -> Measurement:
    lat = Percentiles(1000.0, 1100.0, 1200.0)
    return Measurement.ok({m.key: lat for m in LATENCY_METRICS}, output_tokens_per_s_per_gpu=tps)


def test_a_measurement_informs_pools_of_its_architecture_and_not_others() -> None:
    """The model 2x pessimistic on H100: H200 (Hopper too) is believed faster than predicted;
    A100 (Ampere) keeps the prior's belief, as if nothing was measured."""
    req = priced((A100, 2.79), (H100, 3.99), (H200, 4.18))
    st = SearchSettings()
    space = search_space(req, req.resolve_model())
    prior = Prior.build(req, space, prior_predictions(req, space), st)
    on = {g: TrialConfig(2, 64, "fp16", "auto", g) for g in (A100, H100, H200)}
    measured = on[H100]
    ev = Evidence(req, {measured: (_ok(2 * prior.tps[measured]),)})
    post = Posterior.fit(residuals(ev, prior), prior, st)
    empty = Posterior.fit(residuals(Evidence(req), prior), prior, st)
    mean, before = post.mean(TPS, [on[g] for g in (A100, H100, H200)]), empty.mean(TPS, [on[A100]])
    assert mean[1] > 0.5 * np.log(2)  # the measured one: most of the way to log 2
    assert mean[2] > 0.5 * mean[1]  # H200 shares most of it (pool_correlation 0.8)
    assert mean[0] == pytest.approx(before[0], abs=1e-9)  # A100 shares none


def test_render_serves_a_configuration_on_the_pool_it_names(cli: CliRunner) -> None:
    config = "tp=4,max_batch_size=192,quantization=fp8,kv_cache_dtype=fp8"
    served = cli.invoke(app, ["render", str(EXAMPLE), "--config", f"{config},gpu={H100}"])
    assert served.exit_code == 0, served.output
    deployment = next(d for d in yaml.safe_load_all(served.stdout) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "gpu-8x-h100-sxm"}
    other = cli.invoke(app, ["render", str(EXAMPLE), "--config", f"{config},gpu=B200-SXM-192GB"])
    assert other.exit_code == 2
    assert "not a pool of this spec (A100-SXM-80GB, H100-SXM-80GB)" in other.stderr


def test_a_pool_the_budget_left_unmeasured_is_not_called_ruled_out(
    tmp_path: Path, cli: CliRunner
) -> None:
    result = cli.invoke(app, ["tune", str(EXAMPLE), "--out", str(tmp_path), "--max-trials", "1"])
    assert result.exit_code == 3, result.output  # one trial, and it missed the SLO
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stop"] == "budget"
    [unmeasured] = [p for p in report["pools"] if p["executed_trials"] == 0]
    assert unmeasured["verdict"] == "not_reached"
    assert "the search stopped before it" in unmeasured["reason"]
    assert (
        "(0 trials) - not reached" in result.stdout
        and "(1 trial) - missed the SLO" in result.stdout
    )


def test_a_pools_study_exports_a_replay_table_per_pool_that_replays_it(
    tmp_path: Path, cli: CliRunner
) -> None:
    world = "mistral-7b-256"
    spec = str(WORLDS / f"{world}.json")
    first = cli.invoke(app, ["tune", spec, "--backend", replay_spec(world), "--out",
                             str(tmp_path / "a")])  # fmt: skip
    assert first.exit_code == 0, first.output
    exported = cli.invoke(app, ["export-replay", str(tmp_path / "a"), "-o",
                                str(tmp_path / "t.csv")])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    tables = {Path(p).name for p in exported.stdout.split()}
    assert tables == {"t.A100-SXM-40GB.csv", "t.H100-SXM-80GB.csv"}
    again = cli.invoke(app, ["tune", spec, "--out", str(tmp_path / "b"), "--backend",
                             "replay:" + ",".join(f"{t.split('.')[1]}={tmp_path / t}"
                                                  for t in sorted(tables))])  # fmt: skip
    assert again.exit_code == 0, again.output
    best = [json.loads((tmp_path / d / "report.json").read_text())["best"] for d in "ab"]
    assert best[0]["config"] == best[1]["config"]
