"""The benchmark's simulated pools (benchmarks/worlds) that differ in form from the performance
model: each family's effect is there."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from worlds import FAMILIES, WorldBackend, physics  # noqa: E402
from worlds.closed_loop import run_loop  # noqa: E402
from worlds.families import CAPTURED_BATCHES, knobs_for  # noqa: E402

from infertune_tuner.catalog.gpus import get_gpu  # noqa: E402
from infertune_tuner.catalog.llms import get_model  # noqa: E402
from infertune_tuner.config import TrialConfig  # noqa: E402
from infertune_tuner.errors import InputError  # noqa: E402
from infertune_tuner.metrics import ITL, TTFT  # noqa: E402
from infertune_tuner.run import tune  # noqa: E402

from .helpers import request  # noqa: E402

H100 = get_gpu("H100-SXM-80GB")
H100_PCIE = get_gpu("H100-PCIE-80GB")
LLAMA70 = get_model("llama-2-70b")


def _knobs(family: str = "memory", gpu=H100, **changes):  # type: ignore[no-untyped-def]
    return replace(knobs_for(family, gpu, seed=0), **changes)


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
