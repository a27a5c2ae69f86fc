"""Packing trials into one worker's GPUs: aligned blocks, distinct ports, first come first served.

What cannot be checked without GPUs: that the servers started with these CUDA_VISIBLE_DEVICES
partitions really run side by side (the real triton backend on a multi-GPU node)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.packing import GpuSet, place, slots

from .helpers import request

WAIT = 30.0  # generous: a lease that never comes fails the test, it does not time it


def test_slots_follow_the_smallest_tp_that_fits() -> None:
    assert slots(4, [1, 2, 4, 8]) == 4
    assert slots(4, [2, 4]) == 2
    assert slots(8, [8]) == 1
    assert slots(2, [4, 8]) == 1  # nothing fits: one trial at a time (it will fail to place)


def test_blocks_are_aligned_and_leave_room_for_larger_trials() -> None:
    everything = frozenset(range(4))
    assert place(everything, 2, 4) == (0, 1)
    assert place(frozenset({1, 2, 3}), 2, 4) == (2, 3)  # never the straddling 1-2
    assert place(frozenset({1, 2}), 2, 4) is None
    assert place(frozenset({0, 1, 2}), 4, 4) is None
    assert place(everything, 4, 4) == (0, 1, 2, 3)


def test_two_tp2_trials_share_a_4_gpu_worker_on_distinct_gpus_and_ports() -> None:
    gpus = GpuSet(4)
    with gpus.lease(2) as a, gpus.lease(2) as b:
        assert set(a.devices).isdisjoint(b.devices)
        assert {a.visible, b.visible} == {"0,1", "2,3"}
        ports_a, ports_b = {a.grpc, a.http, a.metrics}, {b.grpc, b.http, b.metrics}
        assert len(ports_a) == 3 and ports_a.isdisjoint(ports_b)


def test_a_tp4_trial_waits_for_the_whole_set_and_is_not_overtaken() -> None:
    gpus = GpuSet(4)
    order: list[str] = []
    first = gpus.lease(2)
    first.__enter__()
    big_waiting, small_waiting = threading.Event(), threading.Event()

    def run(tp: int, label: str, ready: threading.Event) -> None:
        ready.set()
        with gpus.lease(tp) as lease:
            order.append(f"{label}:{lease.visible}")

    big = threading.Thread(target=run, args=(4, "tp4", big_waiting))
    big.start()
    assert big_waiting.wait(WAIT)
    small = threading.Thread(target=run, args=(1, "tp1", small_waiting))
    small.start()
    assert small_waiting.wait(WAIT)
    # GPUs 2-3 are free, but the TP-4 trial asked first: the TP-1 trial waits behind it.
    assert order == []
    first.__exit__(None, None, None)
    big.join(WAIT)
    small.join(WAIT)
    assert order == ["tp4:0,1,2,3", "tp1:0"]


def test_a_trial_larger_than_the_worker_is_an_input_error() -> None:
    with pytest.raises(InputError, match="TP-8"), GpuSet(4).lease(8):
        pass


def test_the_triton_backend_gives_a_packed_trial_its_gpus_and_ports(tmp_path: Path) -> None:
    gpus = GpuSet(4)
    backend = TritonBackend(
        request(), server_command="serve --port {port} --http {http_port} --tp {tp}",
        workdir=tmp_path, gpus=gpus,
    )  # fmt: skip
    with gpus.lease(2) as lease:
        plan = backend.plan(TrialConfig(2, 8, "fp16", "auto"), tmp_path / "t", lease)
    assert plan.env is not None and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.command == ["serve", "--port", str(lease.grpc), "--http", str(lease.http),
                            "--tp", "2"]  # fmt: skip
    assert plan.load.url.endswith(f":{lease.grpc}")
