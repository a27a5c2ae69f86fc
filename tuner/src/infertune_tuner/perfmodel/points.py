"""Published measurements the performance model is calibrated and checked against, and how the
model predicts each one. The figures themselves live in `reference.py` (the 2023 Llama-2-70B
sweep), `perf_overview.py` (TensorRT-LLM's perf-overview tables) and `quant_speedups.py`.

Three kinds of point:

- a closed loop at a fixed concurrency (`batch` set): tok/s/GPU and E2E latency, `predict()`;
- maximum load (`batch` None): the best tok/s/GPU over the batch sizes that fit, as
  `trtllm-bench throughput` runs it (`maxload.max_load`);
- an FP8-over-FP16 speedup at one batch size (`SpeedupPoint`): the ratio of FP16 to FP8 time for
  E2E, ITL (time per output token) or TTFT.

Every point names its source; a source belongs to one stack (`factors.STACKS`) and is fitted,
held out (never seen by the fit; its error is reported) or shown (reported with its error, but
measuring something the model leaves out, so neither fitted nor held to a bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.catalog.llms import get_model
from infertune_tuner.config import TrialConfig, Workload
from infertune_tuner.metrics import latency_metric
from infertune_tuner.perfmodel.factors import Efficiency
from infertune_tuner.perfmodel.latency import Prediction, predict
from infertune_tuner.perfmodel.maxload import max_load

Role = Literal["fit", "holdout", "shown"]
TimeMetric = Literal["e2e", "itl", "ttft"]


@dataclass(frozen=True)
class Source:
    key: str
    stack: str
    role: Role
    title: str
    where: str  # repository + path, or URL, of the published text


@dataclass(frozen=True)
class ThroughputPoint:
    source: Source
    model: str  # catalog key
    gpu: str  # catalog key
    quantization: str
    kv_cache_dtype: str
    tp: int
    input_tokens: int
    output_tokens: int
    tokens_per_s_per_gpu: float
    batch: int | None = None  # None: maximum load
    published_latency_ms: float | None = None  # the published end-to-end latency, when stated
    note: str = ""

    @property
    def workload(self) -> Workload:
        return Workload(self.input_tokens, self.output_tokens)

    def label(self) -> str:
        shape = f"{self.input_tokens}/{self.output_tokens}"
        load = "max load" if self.batch is None else f"bs{self.batch}"
        return f"{self.model} {self.quantization} tp{self.tp} {shape} {load}"

    def predict(self, eff: Efficiency | None = None) -> Prediction | None:
        model, gpu = get_model(self.model), get_gpu(self.gpu)
        stack = self.source.stack
        if self.batch is None:
            return max_load(
                model, gpu, self.tp, self.quantization, self.kv_cache_dtype, self.workload, eff,
                stack,
            )  # fmt: skip
        cfg = TrialConfig(self.tp, self.batch, self.quantization, self.kv_cache_dtype)
        p = predict(model, gpu, cfg, self.workload, eff, stack=stack)
        return p if p.fits else None


@dataclass(frozen=True)
class SpeedupPoint:
    source: Source
    model: str
    gpu: str
    tp: int
    batch: int
    input_tokens: int
    output_tokens: int
    metric: TimeMetric
    speedup: float  # published FP16 time / FP8 time (1.5 = FP8 is 1.5x as fast)
    fp8_kv_cache_dtype: str = "fp8"
    note: str = ""

    def label(self) -> str:
        return (
            f"{self.model} tp{self.tp} bs{self.batch} {self.input_tokens}/{self.output_tokens} "
            f"{self.metric.upper()} fp16/fp8"
        )

    def predict(self, eff: Efficiency | None = None) -> float:
        """The predicted speedup (FP16 time over FP8 time, p50)."""
        model, gpu = get_model(self.model), get_gpu(self.gpu)
        work = Workload(self.input_tokens, self.output_tokens)
        stack = self.source.stack

        def time(quantization: str, kv: str) -> float:
            cfg = TrialConfig(self.tp, self.batch, quantization, kv)
            p = predict(model, gpu, cfg, work, eff, stack=stack)
            return float(latency_metric(f"{self.metric}_ms").of(p).p50)

        return time("fp16", "auto") / time("fp8", self.fp8_kv_cache_dtype)


Point = ThroughputPoint | SpeedupPoint
