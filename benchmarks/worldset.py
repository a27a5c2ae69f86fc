"""The worlds the tuner benchmark scores against and the hyperprior is fitted on.

The sources:

- **own families** (`benchmarks/worlds/`): 12 scenarios (7 GPUs, 7 models, TTFT/ITL/
  E2E bounds at p50/p95/p99, spaces of 108-264 configurations) x 8 world families, each a
  simulated pool whose behaviour differs in form from the performance model (docs/tuning.md);
- **the development set** (`benchmarks/dev-worlds/`, a copy of the tuner-worlds set: replay tables
  nobody here generated): `dev-synthetic` (12 simulated pools of other forms) and `dev-vllm`
  (8 tables of real vLLM measurements on A100/H100, LLM-Inference-Bench, BSD-3-Clause);
- **real-GPU worlds** (`benchmarks/real-worlds/`, family `real-gpu`): grids measured here on a
  real GPU through a real tritonserver (benchmarks/gpu_world.py), held out of every fit. A table
  holds one typical run per configuration; the benchmark replays it with seeded run-to-run noise
  (`NoisyReplay`), each seed a new set of runs, and scores against the table itself.
- **failing worlds**, where whole structures of the space fail to start: `failing` (the 12
  scenarios with the `mixed` physics and one failure form each, worlds/failures.py) and
  `dev-failing` (8 tables of the development set whose `error` rows are a quantization, a TP
  size, a pair, large batches or a few isolated configurations). Held out of every fit: their
  physics is another family's, and a configuration that fails has no truth to fit. Each world
  declares its failing structures (`Pool.failing`, `Truth.failing`): a table's are derived from
  its rows (failures.structures_of).

`truth_of` gives a world's truth (what a typical run of every configuration shows, the
resolution zone near SLO bounds, the optimum) and its residual fields (log truth / prediction per
quantity) for the hyperprior fit.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from worlds import FAILING, FAMILIES, WorldBackend
from worlds.failures import Structure, structures_of

from infertune_tuner import slo as slo_mod
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.backends.replay import load_table
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES, latency_metric
from infertune_tuner.perfmodel.latency import Percentiles
from infertune_tuner.request import (
    GpuRef,
    ModelRef,
    SearchValues,
    SloBound,
    TuningOptions,
    TuningRequest,
    WorkloadShape,
)  # fmt: skip
from infertune_tuner.run import prior_predictions
from infertune_tuner.search.hyperprior import Field
from infertune_tuner.search.posterior import features
from infertune_tuner.space import build_space

DEV_WORLDS = Path(__file__).resolve().parent / "dev-worlds"
REAL_WORLDS = Path(__file__).resolve().parent / "real-worlds"
# Table families: the folder of each and the prefix of its worlds' names there.
TABLE_FAMILIES = {
    "dev-synthetic": (DEV_WORLDS, "synthetic"),
    "dev-vllm": (DEV_WORLDS, "vllm"),
    "real-gpu": (REAL_WORLDS, ""),
    "dev-failing": (DEV_WORLDS, "failing"),
}
DEV_FAMILIES = tuple(TABLE_FAMILIES)
OWN_FAMILIES = (*FAMILIES, FAILING)  # simulated pools over the scenarios
ALL_FAMILIES = (*OWN_FAMILIES, *DEV_FAMILIES)
# Worlds where whole structures fail to start; the family whose physics each has (scored with
# the hyperprior fitted without it too, so no family is scored on its own physics).
FAILING_FAMILIES = (FAILING, "dev-failing")
SAME_PHYSICS = {FAILING: "mixed", "dev-failing": "dev-synthetic"}
# Scored, never fitted on: no hyperprior (shipped or leave-one-family-out) sees these worlds.
HELD_OUT_FAMILIES = ("real-gpu", *FAILING_FAMILIES)
FIT_FAMILIES = tuple(f for f in ALL_FAMILIES if f not in HELD_OUT_FAMILIES)
# What the benchmark scores unless told: the failing families only when asked for (they
# measure learning from failures; the published figures are of the others).
DEFAULT_FAMILIES = tuple(f for f in ALL_FAMILIES if f not in FAILING_FAMILIES)
B11 = [1, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
B12 = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
SLO_TOLERANCE = 0.02  # a chosen configuration may miss a bound by this much in truth
REACH = 0.98  # a run reaches the optimum when its choice's true tok/s/GPU is this share of it
NOISE_RUNS = 5  # extra runs of each configuration near a bound, to size its resolution zone
# Run-to-run noise of a replayed dev table (log sd): the own families' base noise (1-2 % on a
# p50, tails wider), as real servers show at a fixed concurrency.
REPLAY_NOISE = {"p50": 0.015, "p95": 0.02, "p99": 0.03}


def slo(*bounds: tuple[str, str, float]) -> list[SloBound]:
    return [SloBound(metric=m, percentile=p, max_ms=v) for m, p, v in bounds]


# name, model, gpu, max gpus, isl, osl, slo, tp, batches, quants, kvs, accuracy allowance
SCENARIOS = [
    ("llama2-70b/H100 e2e", "llama-2-70b", "H100-SXM-80GB", 8, 1024, 512,
     slo(("e2e_ms", "p95", 25600)), [1, 2, 4, 8], B11, ["fp16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama2-70b/A100 e2e", "llama-2-70b", "A100-SXM-80GB", 8, 1024, 512,
     slo(("e2e_ms", "p95", 25600)), [1, 2, 4, 8], [*B11, 24, 40], ["fp16", "bf16", "w4a16_awq"],
     ["auto"], 2.0),
    ("llama3-8b/L4 e2e", "llama-3-8b", "L4-24GB", 2, 512, 256,
     slo(("e2e_ms", "p95", 20000)), [1, 2], B11,
     ["bf16", "fp8", "w4a16_awq", "w4a8_awq"], ["auto", "fp8"], 2.0),
    ("mistral7b/A10 chat", "mistral-7b", "A10-24GB", 4, 2048, 256,
     slo(("ttft_ms", "p95", 1500), ("itl_ms", "p50", 40)), [1, 2, 4], B12,
     ["bf16", "fp16", "w4a16_awq"], ["auto"], 2.0),
    ("llama3-70b/H100 ttft+e2e", "llama-3-70b", "H100-SXM-80GB", 8, 1024, 256,
     slo(("ttft_ms", "p95", 2000), ("e2e_ms", "p95", 15000)), [1, 2, 4, 8], B11,
     ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("mixtral/H100 itl", "mixtral-8x7b", "H100-SXM-80GB", 8, 512, 512,
     slo(("itl_ms", "p95", 60)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("qwen2-72b/H200 e2e99", "qwen2-72b", "H200-SXM-141GB", 8, 2048, 512,
     slo(("e2e_ms", "p99", 30000)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama2-13b/A100-40 itl", "llama-2-13b", "A100-SXM-40GB", 8, 1024, 256,
     slo(("itl_ms", "p50", 30)), [1, 2, 4, 8], B12, ["fp16", "bf16", "w4a16_awq"], ["auto"], 2.0),
    ("qwen2-7b/L40S long", "qwen2-7b", "L40S-48GB", 4, 4096, 512,
     slo(("ttft_ms", "p95", 3000), ("e2e_ms", "p95", 20000)), [1, 2, 4], B12,
     ["bf16", "fp8", "w4a8_awq"], ["auto", "fp8"], 2.0),
    ("llama3-8b/B200 itl99", "llama-3-8b", "B200-SXM-192GB", 8, 1024, 1024,
     slo(("itl_ms", "p99", 25)), [1, 2, 4, 8], B11, ["bf16", "fp8", "nvfp4"], ["auto", "fp8"], 2.0),
    ("llama3-70b/H100-PCIe e2e", "llama-3-70b", "H100-PCIE-80GB", 8, 2048, 256,
     slo(("e2e_ms", "p95", 20000)), [1, 2, 4, 8], B11, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama3-70b/GH200 ttft", "llama-3-70b", "GH200-96GB", 4, 1024, 512,
     slo(("ttft_ms", "p99", 1000), ("e2e_ms", "p50", 30000)), [1, 2, 4], B12,
     ["bf16", "fp8", "w4a8_awq"], ["auto", "fp8"], 2.0),
]  # fmt: skip


def scenario_request(sc: tuple, sampler: str, seed: int, budget: int) -> TuningRequest:
    name, model, gpu, maxg, isl, osl, bounds, tps, bs, qs, kvs, acc = sc
    return TuningRequest(
        name=name.replace("/", "-").replace(" ", "-").replace("+", "-").lower(),
        model=ModelRef(name=model),
        gpu=GpuRef(product=gpu, max_gpus_per_replica=maxg),
        workload=WorkloadShape(input_tokens=isl, output_tokens=osl),
        slo=bounds,
        search=SearchValues(tensor_parallel=tps, max_batch_size=bs, quantization=qs,
                           kv_cache_dtype=kvs, max_accuracy_loss_percent=acc),
        tuning=TuningOptions(max_trials=budget, seed=seed, sampler=sampler, backend="simulated"),
    )  # fmt: skip


def dev_request(
    name: str, sampler: str, seed: int, budget: int, folder: Path = DEV_WORLDS
) -> TuningRequest:
    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.api.to_request import to_request

    req = to_request(load_deployment(folder / f"{name}.json"), default_backend="simulated")
    tuning = req.tuning.model_copy(update={"max_trials": budget, "seed": seed, "sampler": sampler})
    return req.model_copy(update={"tuning": tuning})


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class Pool(BenchmarkBackend, Protocol):
    """A benchmark pool that also knows its truth: what a typical run of a configuration shows
    (no run noise), and its failing structures (none in most worlds). Every pool of a world is
    one (WorldBackend, NoisyReplay, and the stress forms around them)."""

    @property
    def failing(self) -> tuple[Structure, ...]: ...

    def truth(self, config: TrialConfig) -> Measurement: ...


class NoisyReplay:
    """A dev table replayed with seeded run-to-run noise: each run of a configuration is its
    table row with its latencies (and so its throughput) jittered as a new run would be."""

    def __init__(self, table: dict[TrialConfig, Measurement], world: str, seed: int) -> None:
        self.name = f"replay:{world}"
        self.speedup = 1.0  # recorded measurements: the GPU's own clock
        self._table, self._world, self._seed = table, world, seed
        self.failing = structures_of(table)  # a table says only `error`: its groups do

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        return self.jitter(config, self._rng(config, repeat))

    def _rng(self, config: TrialConfig, repeat: int) -> np.random.Generator:
        return _rng(self._world, self._seed, config.label(), repeat)

    def jitter(self, config: TrialConfig, rng: np.random.Generator) -> Measurement:
        m = self._table.get(config)
        if m is None:
            return Measurement.failed("error", f"not in table {self._world}")
        if m.status != "ok":
            return m
        shift = {p: float(rng.normal(0, REPLAY_NOISE[p])) for p in PERCENTILES}
        lat: dict[str, Percentiles | None] = {}
        for x in LATENCY_METRICS:
            p = m.percentiles(x.key)
            assert p is not None
            vals = sorted(p.get(q) * math.exp(shift[q]) for q in PERCENTILES)
            lat[x.key] = Percentiles(*vals)
        tps = (m.output_tokens_per_s_per_gpu or 0.0) * math.exp(-shift["p50"])
        return Measurement.ok(lat, output_tokens_per_s_per_gpu=tps, concurrency=m.concurrency)

    def truth(self, config: TrialConfig) -> Measurement:
        return self._table.get(config) or Measurement.failed("error", "not in table")

    def close(self) -> None:
        return None


def _faster(m: Measurement, f: float) -> Measurement:
    """`m` run a factor `f` faster: tok/s/GPU x f, every latency / f."""
    if m.status != "ok":
        return m
    lat: dict[str, Percentiles | None] = {}
    for x in LATENCY_METRICS:
        p = m.percentiles(x.key)
        lat[x.key] = None if p is None else Percentiles(p.p50 / f, p.p95 / f, p.p99 / f)
    tps = (m.output_tokens_per_s_per_gpu or 0.0) * f
    return Measurement.ok(lat, output_tokens_per_s_per_gpu=tps, requests=m.requests,
                          duration_s=m.duration_s, concurrency=m.concurrency)  # fmt: skip


class KernelLuck:
    """A pool whose every configuration runs a fixed factor off what its neighbours suggest:
    tok/s/GPU x f, every latency / f, f = exp(N(0, sd)) drawn once per configuration (seeded
    per world). It stands for per-shape luck no smooth model has a term for: the GEMM tactic an
    autotuner picked, a batch size that pads, an attention kernel that changes at a sequence
    count. A stress form nobody fitted the hyperprior on or tuned the search on."""

    def __init__(self, inner: Pool, sd: float, world: str) -> None:
        self.inner, self.sd, self.world = inner, sd, world
        self.name = inner.name
        self.speedup = inner.speedup
        self.failing = inner.failing

    def factor(self, config: TrialConfig) -> float:
        return math.exp(float(_rng("luck", self.world, config.label()).normal(0, self.sd)))

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        return _faster(self.inner.run(config, repeat=repeat), self.factor(config))

    def truth(self, config: TrialConfig) -> Measurement:
        return _faster(self.inner.truth(config), self.factor(config))

    def close(self) -> None:
        self.inner.close()


class RunNoise:
    """A pool noisier from run to run than any the search's noise prior assumes: every run's
    tok/s/GPU x f and latencies / f, f = exp(N(0, sd)) drawn anew per run (seeded per world,
    configuration and repeat), on top of the pool's own noise; what a typical run does (the
    truth) is unchanged. It stands for a shared node, a throttling GPU or a noisy network
    between the load generator and the server. A stress form nobody fitted or tuned on."""

    def __init__(self, inner: Pool, sd: float, world: str) -> None:
        self.inner, self.sd, self.world = inner, sd, world
        self.name = inner.name
        self.speedup = inner.speedup
        self.failing = inner.failing

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        f = math.exp(float(_rng("run", self.world, config.label(), repeat).normal(0, self.sd)))
        return _faster(self.inner.run(config, repeat=repeat), f)

    def truth(self, config: TrialConfig) -> Measurement:
        return self.inner.truth(config)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class World:
    family: str
    name: str  # scenario name or dev table
    seed: int
    scenario: tuple | None = field(default=None, compare=False)
    luck: float = 0.0  # KernelLuck's sd (0: none)
    run_noise: float = 0.0  # RunNoise's sd (0: none)

    def request(self, sampler: str = "auto", budget: int = 40) -> TuningRequest:
        if self.scenario is not None:
            return scenario_request(self.scenario, sampler, self.seed, budget)
        return dev_request(self.name, sampler, self.seed, budget, self.folder)

    @property
    def folder(self) -> Path:
        return TABLE_FAMILIES[self.family][0]

    def backend(self, request: TuningRequest) -> Pool:
        pool: Pool
        if self.scenario is not None:
            pool = WorldBackend(request, self.family, seed=self.seed)
        else:
            pool = NoisyReplay(load_table(self.folder / f"{self.name}.csv"), self.name, self.seed)
        world = f"{self.family}:{self.name}:{self.seed}"
        if self.luck:
            pool = KernelLuck(pool, self.luck, world)
        if self.run_noise:
            pool = RunNoise(pool, self.run_noise, world)
        return pool


def worlds(
    families: list[str], seeds: int, scenarios: list[int] | None = None, luck: float = 0.0,
    run_noise: float = 0.0, own_roughness: float = 0.0,
) -> list[World]:  # fmt: skip
    """The worlds of `families`, `seeds` each. `luck` and `run_noise` are the stress forms
    (KernelLuck, RunNoise) on every world; `own_roughness` gives the own families alone the
    per-configuration luck (KernelLuck) that the replayed tables carry already: the own
    families are smooth to 1 %, the real-GPU world rough to 4 % (fit_hyperprior.py prints it).
    Both are per-configuration luck, so at most one of `luck` and `own_roughness` may be set."""
    if luck and own_roughness:
        raise ValueError("luck and own_roughness are both per-configuration luck: give one")
    out = []
    for fam in families:
        if fam in OWN_FAMILIES:
            own_luck = luck or own_roughness
            for i in scenarios if scenarios is not None else range(len(SCENARIOS)):
                sc = SCENARIOS[i]
                out += [World(fam, sc[0], s, sc, own_luck, run_noise) for s in range(seeds)]
        elif fam in TABLE_FAMILIES:
            folder, prefix = TABLE_FAMILIES[fam]
            index = json.loads((folder / "index.json").read_text())
            names = sorted(w["world"] for w in index if w["world"].startswith(prefix))
            out += [
                World(fam, n, s, luck=luck, run_noise=run_noise)
                for n in names
                for s in range(seeds)
            ]
        else:
            raise SystemExit(f"unknown family {fam!r}; use {', '.join(ALL_FAMILIES)}")
    return out


@dataclass
class Truth:
    optimum: float  # best true tok/s/GPU meeting every bound by more than its zone; 0 = none
    strict: float  # best true tok/s/GPU meeting every bound by any margin
    zone: dict[TrialConfig, float]  # resolution zone per configuration (relative)
    margin: dict[TrialConfig, float]  # true worst relative margin over the bounds (>0 = meets)
    tps: dict[TrialConfig, float]
    fields: list[Field] = field(default_factory=list)
    failing: tuple[Structure, ...] = ()  # the world's failing structures (Pool.failing)

    def value(self, cfg: TrialConfig | None) -> tuple[float, bool, bool]:
        """True tok/s/GPU of `cfg`, whether it truly meets every bound within its zone, and
        whether it does within the strict 2 %."""
        if cfg is None or cfg not in self.margin:
            return 0.0, False, False
        m = self.margin[cfg]
        return self.tps[cfg], m >= -self.zone[cfg], m >= -SLO_TOLERANCE


def _margin(request: TuningRequest, m: Measurement) -> float | None:
    checks = slo_mod.check(request, m)
    return -max(slo_mod.constraint_values(checks)) if checks else None


def _bound_values(request: TuningRequest, m: Measurement) -> list[float]:
    out = []
    for b in request.slo:
        p = m.percentiles(b.metric)
        out.append(p.get(b.percentile) if p else float("inf"))
    out.append(m.output_tokens_per_s_per_gpu or 0.0)
    return out


def truth_of(world: World) -> Truth:
    """What every configuration of the world truly does, and its residual fields."""
    request = world.request()
    pool = world.backend(request)
    probe = world.backend(request)
    t = Truth(0.0, 0.0, {}, {}, {}, failing=pool.failing)
    space = build_space(request, request.resolve_model(), request.resolve_gpu())
    priors = prior_predictions(request, space)
    rows: dict[str, list[tuple[np.ndarray, float]]] = {}
    for cfg in space.configs:
        m = pool.truth(cfg)
        margin = _margin(request, m)
        if margin is None:
            continue
        t.margin[cfg], t.tps[cfg] = margin, m.output_tokens_per_s_per_gpu or 0.0
        zone = SLO_TOLERANCE
        if abs(margin) < 0.25:
            runs = [probe.run(cfg, repeat=1000 + r) for r in range(NOISE_RUNS)]
            logs = [
                [math.log(max(v, 1e-9)) for v in values]
                for values in zip(*(_bound_values(request, r) for r in runs), strict=True)
            ]
            zone = max(zone, 2 * max(statistics.pstdev(v) for v in logs))
        t.zone[cfg] = zone
        if margin >= 0:
            t.strict = max(t.strict, t.tps[cfg])
        if margin >= zone:
            t.optimum = max(t.optimum, t.tps[cfg])
        if m.capped(cfg.max_batch_size):
            continue  # KV-limited: memory evidence, not the model's shape
        p, x = priors[cfg], features(cfg)
        tps_err = math.log(t.tps[cfg] / p.output_tokens_per_s_per_gpu)
        rows.setdefault("tps", []).append((x, tps_err))
        for b in request.slo:
            got = m.percentiles(b.metric)
            want = latency_metric(b.metric).of(p).get(b.percentile)
            if got is not None and want > 0:
                key = f"{b.metric}/{b.percentile}"
                # What the posterior models for the bound: its own part (the metric's tie).
                tie = latency_metric(b.metric).throughput_tie
                own = math.log(got.get(b.percentile) / want) - tie * tps_err
                rows.setdefault(key, []).append((x, own))
    for key, pts in rows.items():
        kind = key.split("/", 1)[0]
        t.fields.append(
            Field(world.family, kind, np.array([x for x, _ in pts]), np.array([y for _, y in pts]))
        )
    return t


def write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
