"""Small builders shared by the tuner tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import (
    GpuRef,
    ModelRef,
    SearchValues,
    SloBound,
    TuningOptions,
    TuningRequest,
    WorkloadShape,
)  # fmt: skip
from infertune_tuner.search.evidence import Decision, Evidence
from infertune_tuner.search.planner import Gap, Planner, gaps
from infertune_tuner.search.posterior import Assessment, Prior, Ruling, assess, verdicts
from infertune_tuner.search.settings import SearchSettings


def request(
    *,
    e2e_p95: float = 25600,
    sampler: str = "auto",
    max_trials: int = 40,
    seed: int = 0,
    tps: list[int] | None = None,
    batches: list[int] | None = None,
    quants: list[str] | None = None,
    parallelism: int = 1,
    name: str = "t",
) -> TuningRequest:
    return TuningRequest(
        name=name,
        model=ModelRef(name="llama-2-70b"),
        gpu=GpuRef(product="H100-SXM-80GB", max_gpus_per_replica=8),
        workload=WorkloadShape(input_tokens=1024, output_tokens=512),
        slo=[SloBound(metric="e2e_ms", percentile="p95", max_ms=e2e_p95)],
        search=SearchValues(
            tensor_parallel=tps or [1, 2, 4, 8],
            max_batch_size=batches or [1, 8, 16, 32, 64, 96, 128, 192, 256],
            quantization=quants or ["fp16", "fp8", "nvfp4"],
            kv_cache_dtype=["auto", "fp8"],
        ),
        tuning=TuningOptions(
            max_trials=max_trials,
            seed=seed,
            sampler=sampler,
            parallelism=parallelism,  # type: ignore[arg-type]
        ),
    )


class CountingBackend:
    """Wraps a backend and records every configuration it was asked to run."""

    def __init__(self, inner, fail_after: int | None = None) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.name = inner.name
        self.speedup = inner.speedup
        self.calls: list[TrialConfig] = []
        self.repeats: list[int] = []
        self.fail_after = fail_after

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        self.calls.append(config)
        self.repeats.append(repeat)
        return self.inner.run(config, repeat=repeat)

    def close(self) -> None:
        self.inner.close()


class Core:
    """The search's pure core for one request, as the `auto` sampler builds it (its prior,
    settings and planner): what a test drives by hand instead of through a study."""

    def __init__(self, req: TuningRequest, settings: SearchSettings | None = None) -> None:
        from infertune_tuner.run import prior_predictions
        from infertune_tuner.space import build_space

        self.request = req
        self.settings = (settings or SearchSettings()).with_confidence(req.tuning.confidence)
        space = build_space(req, req.resolve_model(), req.resolve_gpu())
        self.prior = Prior.build(req, space, prior_predictions(req, space), self.settings)
        self.planner = Planner(self.prior, self.settings, max_trials=req.tuning.max_trials)

    def evidence(
        self,
        runs: Mapping[TrialConfig, Sequence[Measurement]],
        in_flight: Iterable[TrialConfig] = (),
        covers: Iterable[TrialConfig] = (),
    ) -> Evidence:
        return Evidence(
            self.request, {c: tuple(ms) for c, ms in runs.items()}, frozenset(in_flight),
            tuple(covers),
        )  # fmt: skip

    def assess(self, ev: Evidence, **kwargs: bool) -> Assessment:
        return assess(ev, self.prior, self.settings, **kwargs)

    def decide(self, ev: Evidence) -> Decision:
        return self.planner.decide(ev, self.assess(ev))

    def gaps(self, ev: Evidence) -> list[Gap]:
        return gaps(self.assess(ev), self.prior, self.settings)

    def ruling(self, cfg: TrialConfig, ev: Evidence) -> Ruling | None:
        return verdicts(ev, self.prior, self.settings)[cfg]
