"""The live workload from a serving pod's metrics: the simulated server's endpoint read as the
operator reads a pod (metrics_text, window), the drift thresholds, the noise margin,
and a retune's verdict on a real report of the simulated pool."""

from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path

import aiohttp
import aiohttp.web
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infertune_operator.api.to_request import to_request
from infertune_operator.observe import metrics_text, prometheus
from infertune_operator.observe.window import Summary, Window
from infertune_operator.policy import drift, noise, retune
from infertune_operator.policy.tuning import validate
from infertune_tuner.config import TrialConfig
from infertune_tuner.harness import simserver as sim
from infertune_tuner.harness.load_spec import LoadSpec
from infertune_tuner.harness.loadgen import run_load
from infertune_tuner.run import tune

from .apiserver import manifest


async def _scrape(port: int) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def test_a_simulated_pod_shows_the_workload_it_serves() -> None:
    """Every family the operator reads is on the simulated server's endpoint, and a window of
    two scrapes gives back the workload the load generator sent."""
    cfg = sim.build_config(model="llama-3-8b", gpu="L4-24GB", tp=1, max_batch=8, quant="fp8",
                           time_scale=0.05, host="127.0.0.1", port=0, http_port=0,
                           metrics_port=0)  # fmt: skip
    async with sim.SimServer(cfg) as server:
        assert server.metrics_port
        first = await _scrape(server.metrics_port)
        window = Window()
        window.add("pod-a", metrics_text.parse(first, at=time.monotonic(), model="llm"), 600)
        spec = LoadSpec(url=f"127.0.0.1:{server.port}", model="llm", concurrency=8, requests=40,
                        input_tokens=300, output_tokens=24)  # fmt: skip
        result = await run_load(spec)
        text = await _scrape(server.metrics_port)
    sample = metrics_text.parse(text, at=time.monotonic(), model="llm")
    window.add("pod-a", sample, 600)
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert families == set(metrics_text.FAMILIES) | {"nv_inference_count"}
    s = window.summary()
    assert s.pods == 1 and s.requests == result.requests == 40 and s.not_exposed == ()
    assert s.input_tokens_mean == 300 and s.output_tokens_mean == 24
    assert s.requests_per_second is not None and s.requests_per_second > 0
    assert sample.active == 0  # nothing in flight once the run is over
    # TTFT from the histogram: within the 1-2-5 bucket that holds the measured median.
    assert result.ttft_ms is not None
    estimate = s.first_token_ms(0.5)
    assert estimate is not None and result.ttft_ms.p50 / 2.5 <= estimate <= result.ttft_ms.p50 * 2.5
    # The same scrape read by a model of another name shows nothing of it.
    other = metrics_text.parse(text, at=0.0, model="tensorrt_llm")
    assert other.success is None and other.input_tokens is None


def test_a_restarted_pod_counts_from_zero_and_a_gone_pod_is_forgotten() -> None:
    h = metrics_text.Histogram(((100.0, 3.0), (math.inf, 4.0)), 4.0, 250.0)
    w = Window()
    w.add("a", metrics_text.PodSample(at=0.0, success=50.0, input_tokens=h, active=2.0), 60)
    reset = metrics_text.Histogram(((100.0, 1.0), (math.inf, 1.0)), 1.0, 90.0)
    w.add("a", metrics_text.PodSample(at=10.0, success=5.0, input_tokens=reset, active=4.0), 60)
    s = w.summary()
    assert s.requests == 5 and s.requests_per_second == 0.5 and s.input_tokens_mean == 90
    assert s.in_flight == 3.0 and s.e2e_mean_ms == 6000.0  # Little's law: 3 in flight at 0.5/s
    assert set(s.not_exposed) == {metrics_text.FIRST_RESPONSE, metrics_text.OUTPUT_TOKENS}
    w.keep_only(set())
    assert w.summary().pods == 0


def _summary(inp: float, out: float, concurrency: float, requests: float = 100) -> Summary:
    return Summary(pods=1, span_s=60, requests=requests, requests_per_second=1.0,
                   in_flight=concurrency, concurrency=concurrency, input_tokens_mean=inp,
                   output_tokens_mean=out, ttft=None, e2e_mean_ms=None,
                   itl_mean_ms=None)  # fmt: skip


def test_drift_thresholds() -> None:
    obj, problems = validate(manifest("d"))
    assert obj is not None, problems
    tuned = drift.Tuned(512, 128, 16)
    inside = drift.assess(_summary(512 * 1.4, 128 / 1.4, 16), tuned, obj)
    assert inside.judged and inside.drift == () and not inside.lengths_drifted
    longer = drift.assess(_summary(512 * 1.6, 128, 16), tuned, obj)
    assert longer.lengths_drifted and "mean input tokens 819 vs 512 tuned (x1.60" in longer.drift[0]
    shorter = drift.assess(_summary(512, 128 / 1.6, 16), tuned, obj)
    assert shorter.lengths_drifted and "mean output tokens 80 vs 128" in shorter.drift[0]
    queued = drift.assess(_summary(512, 128, 16 * 1.6), tuned, obj)
    assert not queued.lengths_drifted and "add replicas" in queued.drift[0]
    idle = drift.assess(_summary(512, 128, 1), tuned, obj)
    assert idle.drift == ()  # less traffic is not drift
    few = drift.assess(_summary(5000, 5, 99, requests=drift.MIN_REQUESTS - 1), tuned, obj)
    assert not few.judged
    # The test manifest bounds E2E p95 only: no observable bound (only means are observable).
    assert inside.unjudged == ("E2E p95",) and inside.at_risk == ()
    assert drift.significant(4137) == 4100 and drift.significant(128) == 130


def test_drift_lasts_a_whole_window_before_it_counts() -> None:
    p = drift.Persistence()
    p.update(True, 100.0, "t0")
    assert not p.sustained(159.0, 60) and p.sustained(160.0, 60) and p.since_wall == "t0"
    p.update(True, 170.0, "t1")
    assert p.since_wall == "t0"
    p.update(False, 171.0, "t2")
    assert p.since is None and not p.sustained(1000.0, 60)


def test_the_noise_margin_is_the_tuners_noise() -> None:
    one = noise.log_margin(1, 1)
    assert one == pytest.approx(noise.Z * noise.TPS_NOISE * math.sqrt(2))
    assert noise.shortfall_tolerance() == pytest.approx(1 - math.exp(-one))
    margin = noise.improvement_margin(2, 2)
    assert noise.beats(100 * (1 + margin) * 1.001, 100, 2, 2)
    assert not noise.beats(100 * (1 + margin) * 0.999, 100, 2, 2)
    assert noise.improvement_margin(4, 4) < margin  # more runs, a finer margin


def test_a_retune_rolls_out_only_a_measured_improvement(tmp_path: Path) -> None:
    """On a real report of the simulated pool: a current configuration that misses the SLO
    under the observed workload is replaced; the best itself is kept; a margin within the noise
    keeps the current one."""
    spec = manifest("r", workload={"inputTokens": 770, "outputTokens": 32},
                    slo={"e2eLatencyMs": {"p95": 3000}})  # fmt: skip
    obj, problems = validate(spec)
    assert obj is not None, problems
    request = to_request(obj)
    report = tune(request, backend="simulated", out_dir=tmp_path / "r")
    assert report.best is not None
    w = retune.Workload(770, 32)
    current = TrialConfig(1, 16, "fp8", "auto")
    measured = next(m for m in report.measured if m.config.to_config() == current)
    assert measured.slo_ok is False
    rolled = retune.verdict(report, current, w)
    assert rolled.decision == "RolledOut" and rolled.best == report.best.config.to_config()
    kept = retune.verdict(report, report.best.config.to_config(), w)
    assert kept.decision == "KeptCurrent" and "is still the best" in kept.message
    # The same report, had the current configuration met the SLO a little slower than the best.
    best_tps = report.best.metrics.output_tokens_per_s_per_gpu
    close = measured.model_copy(update={
        "slo_ok": True,
        "metrics": measured.metrics.model_copy(  # type: ignore[union-attr]
            update={"output_tokens_per_s_per_gpu": best_tps / 1.03}),
    })  # fmt: skip
    within = report.model_copy(update={"measured": [
        close if m is measured else m for m in report.measured]})  # fmt: skip
    noisy = retune.verdict(within, current, w)
    assert noisy.decision == "KeptCurrent" and "within measurement noise" in noisy.message


class _Prometheus:
    """A stand-in Prometheus server: instant queries of the two shapes the operator sends
    (``sum(NAME{matchers})``, ``sum by (le) (NAME_bucket{matchers})``) over the series of its
    targets, each target's exposition with its ``namespace`` and ``pod`` target labels."""

    QUERY = re.compile(r"^sum(?: by \(le\) )?\((\w+)\{(.*)\}\)$")

    def __init__(self, targets: dict[tuple[str, str], str]) -> None:
        self.targets = targets
        self.queries: list[str] = []

    def _series(self) -> list[tuple[str, dict[str, str], float]]:
        out = []
        for (namespace, pod), text in self.targets.items():
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    name = s.name.removesuffix("_total") if family.type == "counter" else s.name
                    out.append((name, {**s.labels, "namespace": namespace, "pod": pod}, s.value))
        return out

    async def query(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        promql = request.query["query"]
        self.queries.append(promql)
        match = self.QUERY.match(promql)
        assert match is not None, promql
        name, selector = match.groups()
        wanted = re.findall(r'(\w+)(=~|=)"([^"]*)"', selector)

        def selected(labels: dict[str, str]) -> bool:
            return all(
                re.fullmatch(v, labels.get(k, "")) if op == "=~" else labels.get(k) == v
                for k, op, v in wanted
            )

        by_le = promql.startswith("sum by (le)")
        groups: dict[str, float] = {}
        for series, labels, value in self._series():
            if series == name and selected(labels):
                key = labels.get("le", "") if by_le else ""
                groups[key] = groups.get(key, 0.0) + value
        result = [{"metric": {"le": k} if by_le else {}, "value": [0, str(v)]}
                  for k, v in groups.items()]  # fmt: skip
        return aiohttp.web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


async def test_a_prometheus_server_gives_the_deployments_pods_summed() -> None:
    cfg = sim.build_config(model="llama-3-8b", gpu="L4-24GB", tp=1, max_batch=8, quant="fp8",
                           time_scale=0.05, host="127.0.0.1", port=0, http_port=0,
                           metrics_port=0)  # fmt: skip
    async with sim.SimServer(cfg) as server:
        assert server.metrics_port
        spec = LoadSpec(url=f"127.0.0.1:{server.port}", model="llm", concurrency=4, requests=12,
                        input_tokens=200, output_tokens=16)  # fmt: skip
        await run_load(spec)
        text = await _scrape(server.metrics_port)
    server_api = _Prometheus({
        ("team-a", "llm-6b7c9d8f5d-abcde"): text,  # two pods of the deployment
        ("team-a", "llm-6b7c9d8f5d-fghij"): text,
        ("team-a", "llm2-6b7c9d8f5d-abcde"): text,  # another deployment's pod
        ("team-b", "llm-6b7c9d8f5d-abcde"): text,  # another namespace
    })  # fmt: skip
    app = aiohttp.web.Application()
    app.router.add_get("/api/v1/query", server_api.query)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        sample = await asyncio.to_thread(
            prometheus.sample, f"http://127.0.0.1:{port}", "team-a", "llm", "llm", at=1.0
        )
    finally:
        await runner.cleanup()
    one = metrics_text.parse(text, at=1.0, model="llm")
    assert one.success == 12 and sample.success == 2 * one.success
    assert one.input_tokens is not None and sample.input_tokens is not None
    assert sample.input_tokens.count == 2 * one.input_tokens.count
    assert sample.input_tokens.mean() == one.input_tokens.mean() == 200
    assert sample.active == 0 and sample.first_response is not None
    assert all('namespace="team-a"' in q and 'model="llm"' in q for q in server_api.queries)


def test_the_operator_keeps_the_tuners_noise_and_warm_up() -> None:
    """The operator reads the tuner's noise prior and copies two of its numbers instead of
    importing the trial backend (which would load gRPC into it): they must stay equal."""
    from infertune_operator.policy import verification
    from infertune_tuner.backends import triton
    from infertune_tuner.harness import runner
    from infertune_tuner.search.settings import SearchSettings

    assert SearchSettings().run_noise["tps"] == noise.TPS_NOISE
    assert verification.MAX_WARMUP == triton.MAX_WARMUP
    assert verification.MAX_ERROR_SHARE == runner.MAX_ERROR_FRACTION
