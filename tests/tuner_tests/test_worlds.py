"""The benchmark's simulated pools (benchmarks/worlds) that differ in form from the performance
model: each family's effect is there."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from worlds import FAILING, FAMILIES, WorldBackend, physics  # noqa: E402
from worlds.closed_loop import run_loop  # noqa: E402
from worlds.failures import FORMS, TRANSIENT, Transient, structures_of  # noqa: E402
from worlds.families import CAPTURED_BATCHES, knobs_for  # noqa: E402
from worldset import DEV_WORLDS as DEV  # noqa: E402
from worldset import SCENARIOS, World, scenario_request, truth_of  # noqa: E402

from infertune_tuner.backends.replay import load_table  # noqa: E402
from infertune_tuner.catalog.gpus import get_gpu  # noqa: E402
from infertune_tuner.catalog.llms import MODELS, get_model  # noqa: E402
from infertune_tuner.config import TrialConfig  # noqa: E402
from infertune_tuner.errors import InputError  # noqa: E402
from infertune_tuner.measurement import Measurement  # noqa: E402
from infertune_tuner.metrics import ITL, TTFT  # noqa: E402
from infertune_tuner.run import tune  # noqa: E402
from infertune_tuner.space import build_space  # noqa: E402

from .helpers import request  # noqa: E402

H100 = get_gpu("H100-SXM-80GB")
H100_PCIE = get_gpu("H100-PCIE-80GB")
LLAMA70 = get_model("llama-2-70b")


def _knobs(family: str = "memory", gpu=H100, **changes):  # type: ignore[no-untyped-def]
    return replace(knobs_for(family, gpu, seed=0), **changes)


@pytest.mark.parametrize("key", [k for k, m in MODELS.items() if m.experts == 1])
def test_a_pool_stores_the_dense_models_parameters(key: str) -> None:
    """In 16 bit on one GPU a pool holds every parameter in 2 bytes: the attention projections
    heads x head_dim wide, also where that is not the hidden size (Qwen3, Gemma 3)."""
    model = get_model(key)
    assert physics.weight_bytes(model, TrialConfig(1, 8, "bf16", "auto")) == 2 * model.params


def test_every_family_is_deterministic_per_seed_and_runs_differ_between_repeats() -> None:
    req = request()
    cfg = TrialConfig(4, 64, "fp8", "auto")
    for family in FAMILIES:
        a, b = WorldBackend(req, family, seed=1), WorldBackend(req, family, seed=1)
        assert a.truth(cfg) == b.truth(cfg), family
        first, second = a.run(cfg), a.run(cfg, repeat=1)
        assert first == b.run(cfg), f"{family}: the same run of the same seed"
        assert first.output_tokens_per_s_per_gpu != second.output_tokens_per_s_per_gpu, family


def test_prefill_stalls_make_itl_grow_with_batch_and_widen_ttft_tails() -> None:
    k = _knobs(sync=0.1)
    rng = np.random.default_rng(0)

    def itl_and_tail(stall: bool, batch: int) -> tuple[float, float]:
        kk = replace(k, stall_prefill=stall)
        cfg = TrialConfig(4, batch, "fp8", "auto")
        s = physics.steps(LLAMA70, H100, cfg, batch, 1024, 256, kk)
        r = run_loop(s, batch, 1024, 256, kk, rng, requests=4000, noisy=False)
        itl, ttft = r.latency[ITL.key], r.latency[TTFT.key]
        return itl.p50, ttft.p99 / ttft.p50

    small, large = itl_and_tail(True, 8), itl_and_tail(True, 128)
    chunk_small, chunk_large = itl_and_tail(False, 8), itl_and_tail(False, 128)
    assert large[0] / small[0] > chunk_large[0] / chunk_small[0]  # ITL grows faster with batch
    assert large[1] > small[1]  # the TTFT tail widens with load


def test_allreduce_latency_dominates_on_pcie_and_nvlink_can_beat_the_model() -> None:
    pcie = knobs_for("interconnect", H100_PCIE, seed=0)
    cfg = TrialConfig(8, 1, "fp8", "auto")
    step = physics.decode_ms(LLAMA70, H100_PCIE, cfg, 1, 1024, pcie)
    comm = physics.allreduce_ms(LLAMA70, H100_PCIE, 8, 1, pcie)
    assert comm > 0.3 * step, "per-call latency of 160 all-reduces is a large part of a step"
    nvlink = knobs_for("interconnect", H100, seed=0)
    assert nvlink.ar_latency_us < 4 and nvlink.ar_bw_eff > 0.6


def test_the_fp8_gain_fades_with_batch_and_4_bit_dequantisation_grows_with_it() -> None:
    k = knobs_for("quantization", H100, seed=0)

    def step(q: str, batch: int) -> float:
        return physics.decode_ms(LLAMA70, H100, TrialConfig(4, batch, q, "auto"), batch, 1024, k)

    small, large = step("fp8", 1) / step("bf16", 1), step("fp8", 256) / step("bf16", 256)
    assert small < 0.78 and large > 0.84
    assert step("w4a16_awq", 1) / step("bf16", 1) < step("w4a16_awq", 256) / step("bf16", 256)


def test_a_workspace_growing_with_batch_moves_the_memory_frontier() -> None:
    lean = _knobs(workspace_mib_per_seq=1.0, usable_fraction=0.95)
    heavy = _knobs(workspace_mib_per_seq=40.0, usable_fraction=0.8)
    cfg = TrialConfig(2, 256, "fp8", "fp8")
    a = physics.capacity(LLAMA70, H100, cfg, 1536, lean)
    b = physics.capacity(LLAMA70, H100, cfg, 1536, heavy)
    assert a.kv_sequences > b.kv_sequences
    huge = physics.capacity(LLAMA70, H100, TrialConfig(1, 256, "bf16", "auto"), 1536, heavy)
    assert huge.load_error and "out of memory" in huge.load_error


def test_a_batch_without_a_captured_cuda_graph_is_slower_than_a_larger_one_with() -> None:
    k = knobs_for("cuda-graphs", H100, seed=0)
    assert 48 not in CAPTURED_BATCHES and 64 in CAPTURED_BATCHES
    cfg = TrialConfig(8, 64, "fp8", "auto")
    assert physics.decode_ms(get_model("llama-3-8b"), H100, cfg, 48, 1024, k) > physics.decode_ms(
        get_model("llama-3-8b"), H100, cfg, 64, 1024, k
    )


def test_noisy_pools_have_outliers_in_their_runs() -> None:
    req = request()
    world = WorldBackend(req, "noisy", seed=2)
    cfg = TrialConfig(4, 64, "fp8", "auto")
    truth = world.truth(cfg).output_tokens_per_s_per_gpu or 0.0
    logs = np.log(
        [(world.run(cfg, repeat=r).output_tokens_per_s_per_gpu or 0.0) / truth for r in range(400)]
    )
    sd = world.noise
    assert 0.03 <= sd <= 0.04 and 0.02 < np.std(logs) < 0.08
    # A Gaussian with that spread would put ~0.6 % of runs below -2.5 sd: slow phases add more.
    assert np.mean(logs < -2.5 * sd) > 0.01, "a slow phase now and then"


def test_a_world_tunes_end_to_end_as_a_backend_instance(tmp_path: Path) -> None:
    req = request(max_trials=20)
    with pytest.raises(InputError, match="unknown world family"):
        WorldBackend(req, "martian")
    report = tune(req, backend=WorldBackend(req, "mixed"), out_dir=tmp_path)
    assert report is not None and report.backend == "world:mixed"
    assert report.best is not None and report.executed_trials <= 20


def test_a_failing_world_fails_exactly_inside_its_structures_and_its_optimum_runs() -> None:
    """Each failing world is the mixed one with one failure form: every configuration inside its
    failing structures fails, with a real error line and phase, and nothing else does; its true
    optimum is a configuration that runs. Five scenarios (seed 0) draw the five forms."""
    kinds = set()
    for i in (0, 1, 2, 5, 8):
        sc = SCENARIOS[i]
        req = scenario_request(sc, "auto", 0, 40)
        world, mixed = WorldBackend(req, FAILING, seed=0), WorldBackend(req, "mixed", seed=0)
        kinds.add(world.form.kind)
        assert world.failing, sc[0]
        space = build_space(req, req.resolve_model(), req.resolve_gpu())
        failing = [c for c in space.configs if any(s.contains(c) for s in world.failing)]
        assert 0 < len(failing) < len(space.configs), sc[0]
        for n, cfg in enumerate(space.configs):
            truth = world.truth(cfg)
            if cfg in failing:
                run = world.run(cfg, repeat=2)
                assert truth.status == run.status == "error" and truth.reason and truth.phase
                assert run == truth, "a structure fails the same way every run"
            elif n % 4 == 0:  # elsewhere (a sample) it is the mixed world
                assert truth == mixed.truth(cfg) and truth.status != "error"
        t = truth_of(World(FAILING, sc[0], 0, sc))
        assert t.failing == world.failing
        best = max((c for c in t.margin if t.margin[c] >= t.zone[c]), key=lambda c: t.tps[c])
        assert best not in failing and t.optimum == t.tps[best] > 0
        assert world.run(best).status == "ok"
    assert kinds == set(FORMS)


def test_a_table_names_its_failing_structures() -> None:
    def of(name: str) -> list[str]:
        return [s.label() for s in structures_of(load_table(DEV / f"{name}.csv"))]

    assert of("failing-00") == ["w4a16_awq"]
    assert of("failing-03") == ["batch >= 128"]
    assert of("failing-04") == ["w4a16_awq + TP 2", "w4a16_awq + TP 4", "w4a16_awq + TP 8"]
    assert of("failing-06") == [  # isolated: each its own
        "tp2/bs64/fp8/kv-auto", "tp4/bs8/w4a16_awq/kv-auto", "tp8/bs192/fp8/kv-auto",
    ]  # fmt: skip
    assert of("failing-07") == ["KV fp8"]
    assert of("synthetic-00") == []


def test_a_transient_failure_does_not_repeat_on_the_configurations_next_run() -> None:
    req = request()
    configs = [TrialConfig(tp, b, "fp8", "auto") for tp in (2, 4, 8) for b in (16, 64, 128)]

    def runs() -> list[list[Measurement]]:
        pool = Transient(WorldBackend(req, "mixed", seed=0), 0.5, "world")
        return [[pool.run(c, repeat=r) for r in range(6)] for c in configs]

    first = runs()
    assert first == runs(), "deterministic per world and order of runs"
    transient = {reason for reason, _ in TRANSIENT}
    failed = 0
    for seq in first:
        for before, after in itertools.pairwise(seq):
            if before.reason in transient:
                assert before.status == "error" and before.phase is not None
                assert after.status == "ok", "the next run of the configuration succeeds"
        failed += sum(m.reason in transient for m in seq)
    assert 6 <= failed <= 27  # about p = 0.5 of the runs that may fail (54 runs)
