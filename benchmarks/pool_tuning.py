# ruff: noqa: E402  (BLAS threads are set before numpy is imported)
"""Tuning across GPU pools: does `auto` find the cheapest (pool, configuration) that meets the
SLO, in how many trials, and what does a pool the model rules out cost?

Worlds:

- **real** (`benchmarks/pool-worlds/`, held out of every fit): 6 worlds of real vLLM
  measurements (LLM-Inference-Bench), 2-3 pools each (A100-SXM-40GB, H100-SXM-80GB, GH200-96GB),
  the same model and lengths on every pool, prices and SLO in each spec (the README there says
  where they come from). Each pool's table is replayed with seeded run-to-run noise
  (worldset.NoisyReplay), each seed a new set of runs.
- **simulated** (`SCENARIOS` below, prices stated there): eight of two pools each, every pool
  a simulated world of one family of `benchmarks/worlds/` (behaviour that differs in form from
  the performance model), the family chosen by the seed. Scored with the shipped hyperprior, which
  was fitted on these families: the real worlds are the held-out number.

A run is *right* when the configuration it chooses truly meets every bound within 2 % and its
true cost per million output tokens is within 2 % of the cheapest true cost among
configurations that truly meet every bound by more than 2 % (whether a configuration closer to
a bound than that meets it is what a few noisy runs cannot resolve: tuner_efficiency.py's
resolution zone, at its floor). Trials are executed trials (confirmations included).

What a pool the model writes off costs, two ways: a pool whose predicted cheapest cost is at
least `RULED_OUT` times the predicted cheapest of all pools (*written off*), and a pool the
search's own prior, before any trial, gives less than `RULED_OUT_P` of holding the cheapest
configuration that meets the SLO (*ruled out*: joint draws of the posterior with no
measurement, as the search draws them), each counted only where the truth agrees that it loses
(its true cheapest more than `LOSES` above the cheapest); the trials a run spends on such pools
are counted. A pool written off that truly wins or comes close is counted apart (`misjudged`):
trials there are the search correcting the model. Of the runs whose report claims at least
`CLAIM` confidence that nothing beats its choice by more than 2 %, the share that were right
says whether the confidence printed is earned.

    python benchmarks/pool_tuning.py [--seeds 20] [--jobs 2] [--worlds real,simulated]
        [--pool-correlation RHO] [--verbose]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np
from worlds import FAMILIES, WorldBackend
from worldset import NoisyReplay, scenario_request, slo

from infertune_operator.api.manifest import load_deployment
from infertune_operator.api.to_request import to_request
from infertune_tuner import pools
from infertune_tuner import slo as slo_check
from infertune_tuner.backends.per_pool import PerPool
from infertune_tuner.backends.replay import load_table
from infertune_tuner.config import TrialConfig
from infertune_tuner.measurement import Measurement
from infertune_tuner.perfmodel.latency import Prediction
from infertune_tuner.request import GpuPool, GpuRef, TuningRequest
from infertune_tuner.run import prior_predictions, tune
from infertune_tuner.search.evidence import Evidence
from infertune_tuner.search.posterior import MemoryFit, Posterior, Prior, residuals
from infertune_tuner.search.settings import SearchSettings
from infertune_tuner.space import SearchSpace, search_space

POOL_WORLDS = HERE / "pool-worlds"
RULED_OUT = 1.5  # predicted cheapest cost this many times the best pool's: the model rules it out
LOSES = 0.10  # ... and its true cheapest is this much above the cheapest: it truly loses
RULED_OUT_P = 0.05  # the prior gives it less than this chance of holding the optimum
DRAWS = 2000
CLAIM = 0.95  # a report claiming at least this confidence should be right this often
NEAR = 0.02  # within 2 % of the cheapest cost; a bound met within 2 %
B = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
# USD per GPU-hour: Lambda's on-demand list (https://lambda.ai/instances, 8x instances; GH200 1x)
# as transcribed 2026-09-20 in api-evangelist/lambda-labs plans/lambda-labs-plans-pricing.yml.
# H200, L40S and L4 are not on it: H200 = B200 / 1.6 (the ratio of NVIDIA's Llama-3.1-70B
# example), L40S and L4 illustrative. A price's ratio to the other pool's is what matters.
PRICE = {
    "A100-SXM-40GB": 1.99, "A100-SXM-80GB": 2.79, "H100-SXM-80GB": 3.99, "H200-SXM-141GB": 4.18,
    "B200-SXM-192GB": 6.69, "GH200-96GB": 2.29, "L40S-48GB": 1.49, "L4-24GB": 0.79,
}  # fmt: skip
# name, model, pools, max gpus, isl, osl, slo, tp, batches, quants, kvs, accuracy allowance
SCENARIOS = [
    ("llama3-70b A100 or H100", "llama-3-70b", ["A100-SXM-80GB", "H100-SXM-80GB"], 8, 1024, 512,
     slo(("e2e_ms", "p95", 25600)), [1, 2, 4, 8], B, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama3.1-70b H200 or B200", "llama-3.1-70b", ["H200-SXM-141GB", "B200-SXM-192GB"], 8, 1024,
     1024, slo(("ttft_ms", "p95", 2000), ("itl_ms", "p95", 40)), [1, 2, 4, 8], B,
     ["bf16", "fp8", "nvfp4"], ["auto", "fp8"], 2.0),
    ("llama3-8b L40S or H100", "llama-3-8b", ["L40S-48GB", "H100-SXM-80GB"], 4, 2048, 256,
     slo(("ttft_ms", "p95", 1500), ("itl_ms", "p95", 30)), [1, 2, 4], B,
     ["bf16", "fp8", "w4a16_awq"], ["auto", "fp8"], 2.0),
    ("mixtral H100 or H200", "mixtral-8x7b", ["H100-SXM-80GB", "H200-SXM-141GB"], 8, 512, 512,
     slo(("itl_ms", "p95", 60)), [1, 2, 4, 8], B, ["bf16", "fp8"], ["auto", "fp8"], 1.0),
    ("llama2-13b A100-40 or A100-80", "llama-2-13b", ["A100-SXM-40GB", "A100-SXM-80GB"], 8, 1024,
     256, slo(("itl_ms", "p50", 30)), [1, 2, 4, 8], B, ["fp16", "w4a16_awq"], ["auto"], 2.0),
    ("qwen2-7b L4 or L40S", "qwen2-7b", ["L4-24GB", "L40S-48GB"], 4, 1024, 512,
     slo(("e2e_ms", "p95", 20000)), [1, 2, 4], B, ["bf16", "fp8"], ["auto", "fp8"], 2.0),
    # Pools the model's prior gives little chance (3.8 % and 5.9 % of holding the optimum).
    ("llama3-70b L40S or H100", "llama-3-70b", ["L40S-48GB", "H100-SXM-80GB"], 8, 1024, 256,
     slo(("ttft_ms", "p95", 2000), ("itl_ms", "p95", 40)), [1, 2, 4, 8], B, ["bf16", "fp8"],
     ["auto", "fp8"], 1.0),
    ("llama3.1-8b L4 or B200", "llama-3.1-8b", ["L4-24GB", "B200-SXM-192GB"], 8, 2048, 512,
     slo(("ttft_ms", "p95", 1000), ("itl_ms", "p95", 20)), [1, 2, 4], B, ["bf16", "fp8"],
     ["auto", "fp8"], 1.0),
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    kind: str  # real | simulated
    name: str
    seed: int


@dataclass(frozen=True)
class Outcome:
    case: Case
    right: bool
    trials: int
    ruled_out_trials: list[int]  # per pool predicted >= RULED_OUT x costlier, trials spent on it
    misjudged: int  # pools the model writes off that truly win or come within LOSES
    prior_trials: list[int]  # per pool the prior gives < RULED_OUT_P, trials spent on it
    confidence: float | None  # what the report claims (None: no claim)
    chosen: str
    cheapest: str
    excess: float  # true cost of the chosen / the cheapest true cost - 1


def _request(case: Case) -> TuningRequest:
    if case.kind == "real":
        req = to_request(
            load_deployment(POOL_WORLDS / f"{case.name}.json"), default_backend="simulated"
        )
    else:
        sc = next(s for s in SCENARIOS if s[0] == case.name)
        products = sc[2]
        req = scenario_request((sc[0], sc[1], products[0], *sc[3:]), "auto", case.seed, 40)
        gpu = GpuRef(
            product=products[0], max_gpus_per_replica=sc[3],
            pools=[GpuPool(product=p, price_per_gpu_hour=PRICE[p]) for p in products],
        )  # fmt: skip
        req = req.model_copy(update={"gpu": gpu})
    tuning = req.tuning.model_copy(update={"max_trials": 40, "seed": case.seed, "sampler": "auto"})
    return req.model_copy(update={"tuning": tuning})


def _backend(case: Case, req: TuningRequest) -> dict[str, NoisyReplay | WorldBackend]:
    if case.kind == "real":
        return {
            p: NoisyReplay(
                load_table(POOL_WORLDS / f"{case.name}.{p}.csv"), f"{case.name}.{p}", case.seed
            )
            for p in pools.products(req)
        }
    family = FAMILIES[case.seed % len(FAMILIES)]
    return {
        p: WorldBackend(pools.single(req, p), family, seed=case.seed * 31 + i)
        for i, p in enumerate(pools.products(req))
    }


def _meets(req: TuningRequest, m: Measurement, slack: float) -> bool:
    """`m` meets every bound with `slack` to spare (< 0: by that much; > 0: misses it by at most
    that much)."""
    if m.status != "ok":
        return False

    # constraint_values: the relative excess over each bound (<= 0: met)
    return max(slo_check.constraint_values(slo_check.check(req, m)), default=0.0) <= slack


def run_case(case: Case, correlation: float | None = None) -> Outcome:
    logging.disable(logging.WARNING)
    req = _request(case)
    inner = _backend(case, req)
    space = search_space(req, req.resolve_model(), "simulated")
    truth = {c: inner[c.gpu].truth(TrialConfig(c.tp, c.max_batch_size, c.quantization,
                                                c.kv_cache_dtype)) for c in space.configs}  # fmt: skip

    def cost(c: TrialConfig, tps: float | None) -> float:
        return pools.cost_per_million(pools.price_of(req, c.gpu), tps or 0.0) or float("inf")

    feasible = {c: cost(c, m.output_tokens_per_s_per_gpu) for c, m in truth.items()
                if _meets(req, m, -NEAR)}  # fmt: skip
    true_by_pool: dict[str, float] = {}
    for c, v in feasible.items():
        true_by_pool[c.gpu] = min(true_by_pool.get(c.gpu, float("inf")), v)
    cheapest = min(feasible, key=lambda c: feasible[c])
    predicted = prior_predictions(req, space)
    by_pool: dict[str, float] = {}
    for c, p in predicted.items():
        if p.fits:
            by_pool[c.gpu] = min(by_pool.get(c.gpu, float("inf")),
                                 cost(c, p.output_tokens_per_s_per_gpu))  # fmt: skip
    best_predicted = min(by_pool.values())
    written_off = [p for p in pools.products(req)
                   if by_pool.get(p, float("inf")) >= RULED_OUT * best_predicted]  # fmt: skip
    loses = {p for p in pools.products(req)
             if true_by_pool.get(p, float("inf")) > (1 + LOSES) * feasible[cheapest]}  # fmt: skip
    ruled_out = [p for p in written_off if p in loses]
    settings = (
        SearchSettings() if correlation is None else SearchSettings(pool_correlation=correlation)
    )
    unlikely = [p for p, share in prior_shares(req, space, predicted, settings).items()
                if share < RULED_OUT_P and p in loses]  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        report = tune(req, backend=PerPool(inner), out_dir=Path(out), settings=settings)
    assert report is not None
    executed = [t for t in report.trials if t.executed]
    spent = [sum(1 for t in executed if t.config.gpu == p) for p in ruled_out]
    prior_spent = [sum(1 for t in executed if t.config.gpu == p) for p in unlikely]
    chosen = report.best.config.to_config() if report.best else None
    right = False
    excess = float("inf")
    if chosen is not None:
        m = truth[chosen]
        excess = cost(chosen, m.output_tokens_per_s_per_gpu) / feasible[cheapest] - 1
        right = _meets(req, m, NEAR) and excess <= NEAR
    return Outcome(case, right, report.executed_trials, spent, len(written_off) - len(ruled_out),
                   prior_spent, report.confidence, chosen.label() if chosen else "none",
                   cheapest.label(), excess)  # fmt: skip


def prior_shares(
    req: TuningRequest, space: SearchSpace, predicted: dict[TrialConfig, Prediction],
    settings: SearchSettings,
) -> dict[str, float]:  # fmt: skip
    """Per pool, the share of the prior's joint draws (no measurement yet) in which the pool
    holds the cheapest configuration that fits and meets every bound."""
    prior = Prior.build(req, space, predicted, settings)
    empty = Evidence(req)
    post = Posterior.fit(residuals(empty, prior), prior, settings)
    fit = MemoryFit.learn([], settings)
    configs = list(prior.universe)
    rng = np.random.default_rng(0)
    tps_err, lat_err = post.sample(configs, DRAWS, rng, configs)
    value = np.array([prior.objective[c] for c in configs]) * np.exp(tps_err)
    ok = np.ones_like(value, dtype=bool)
    for b in prior.bounds:
        pred = np.array([b.predicted[c] for c in configs])
        ok &= pred * np.exp(lat_err[b.key]) <= b.bound.max_ms
    margins = np.array([prior.margin[c] for c in configs])
    ok &= (margins[None, :] + fit.sample(DRAWS, rng)[:, None]) > 0
    best = np.where(ok, value, -np.inf).argmax(axis=1)
    any_ok = ok.any(axis=1)
    pools_of = np.array([c.gpu for c in configs])
    return {p: float(((pools_of[best] == p) & any_ok).sum() / max(any_ok.sum(), 1))
            for p in pools.products(req)}  # fmt: skip


def cases(kinds: list[str], seeds: int) -> list[Case]:
    out: list[Case] = []
    if "real" in kinds:
        index = json.loads((POOL_WORLDS / "index.json").read_text())
        names = [w["world"] for w in (index["worlds"] if isinstance(index, dict) else index)]
        out += [Case("real", n, s) for n in names for s in range(seeds)]
    if "simulated" in kinds:
        out += [Case("simulated", sc[0], s) for sc in SCENARIOS for s in range(seeds)]
    return out


def summary(label: str, outs: list[Outcome]) -> str:
    if not outs:
        return f"{label}: no runs"
    trials = sorted(o.trials for o in outs)
    spent = [n for o in outs for n in o.ruled_out_trials]
    by_prior = [n for o in outs for n in o.prior_trials]
    p90 = trials[min(len(trials) - 1, int(0.9 * len(trials)))]
    ruled = (
        f"ruled-out pools: {len(spent)} (runs x pools), trials on one median "
        f"{statistics.median(spent):g}, max {max(spent)}"
        if spent
        else "ruled-out pools: none"
    )
    ruled += (
        f"; ruled out by the prior (P < {RULED_OUT_P:.0%}): {len(by_prior)}, trials on one median "
        f"{statistics.median(by_prior):g}, max {max(by_prior)}"
        if by_prior
        else ""
    )
    misjudged = sum(o.misjudged for o in outs)
    claims = [o for o in outs if o.confidence is not None and o.confidence >= CLAIM]
    ruled += (
        f"; claims >= {CLAIM:.0%}: {sum(o.right for o in claims)} of {len(claims)} right"
        if claims
        else ""
    )
    return (
        f"{label}: right {sum(o.right for o in outs)}/{len(outs)} "
        f"({sum(o.right for o in outs) / len(outs):.0%}), trials median "
        f"{statistics.median(trials):g} p90 {p90}; {ruled}"
        + (f"; pools the model wrote off that truly win or come close: {misjudged}"
           if misjudged else "")
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--worlds", default="real,simulated")
    ap.add_argument(
        "--pool-correlation",
        type=float,
        default=None,
        help="SearchSettings.pool_correlation (default: the shipped one)",
    )
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    todo = cases(args.worlds.split(","), args.seeds)
    started = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as ex:
        outs = list(ex.map(run_case, todo, [args.pool_correlation] * len(todo)))
    for o in outs:
        if args.verbose or not o.right:
            print(f"  {'ok  ' if o.right else 'MISS'} {o.case.kind} {o.case.name} seed "
                  f"{o.case.seed}: {o.trials} trials, chose {o.chosen} (+{o.excess:.1%}), "
                  f"cheapest {o.cheapest}, ruled-out pools' trials {o.ruled_out_trials}")  # fmt: skip
    for kind in ("real", "simulated"):
        mine = [o for o in outs if o.case.kind == kind]
        if not mine:
            continue
        print(summary(kind, mine))
        for name in dict.fromkeys(o.case.name for o in mine):
            print("  " + summary(name, [o for o in mine if o.case.name == name]))
    print(f"{len(outs)} runs in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
