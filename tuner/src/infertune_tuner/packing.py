"""Packing trials into one worker's GPU set (pure: no CUDA, no processes).

A tuner worker (one pod of the tuner Job) holds enough GPUs for the largest tensor-parallel
size it may run. Smaller trials share them: a 4-GPU worker runs two TP-2 trials side by side,
or four TP-1 trials, or one TP-4 trial. Each trial gets an aligned block of devices (a TP-2
trial gets GPUs 0-1 or 2-3, never 1-2: aligned blocks keep a trial's GPUs on the same NVLink
or PCIe switch neighbourhood, and leave whole blocks for larger trials), named to the server
by ``CUDA_VISIBLE_DEVICES``, and ports of its own derived from its first device, so that
concurrent servers never collide.

Trials wait in the order they asked (first come, first served): a TP-4 trial waiting for the
whole set is not starved by TP-1 trials that keep arriving behind it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from infertune_tuner.errors import InputError

PORT_BASE = 18000  # trial servers listen on PORT_BASE + PORT_STRIDE * first device + 0..2
PORT_STRIDE = 3


@dataclass(frozen=True)
class Lease:
    """The GPUs (and ports) one trial may use while it runs."""

    devices: tuple[int, ...]
    grpc: int
    http: int
    metrics: int

    @property
    def visible(self) -> str:
        """The value of ``CUDA_VISIBLE_DEVICES`` for the trial's server."""
        return ",".join(str(d) for d in self.devices)


def slots(gpus: int, tensor_parallel: Iterable[int]) -> int:
    """How many trials a worker with `gpus` GPUs can run at once: as many as its smallest TP
    fits (the concurrency to give its worker threads)."""
    fitting = [tp for tp in tensor_parallel if 1 <= tp <= gpus]
    return gpus // min(fitting) if fitting else 1


def place(free: frozenset[int], tp: int, gpus: int) -> tuple[int, ...] | None:
    """The first aligned block of `tp` free devices among `gpus`, or None when none is free.

    Blocks start at multiples of `tp` (for a power-of-two TP, the natural NVLink/PCIe
    neighbourhoods); a TP that does not divide the set still gets its contiguous block."""
    if tp < 1 or tp > gpus:
        return None
    for start in range(0, gpus - tp + 1, tp):
        block = tuple(range(start, start + tp))
        if all(d in free for d in block):
            return block
    return None


def lease_for(devices: tuple[int, ...]) -> Lease:
    base = PORT_BASE + PORT_STRIDE * devices[0]
    return Lease(devices, grpc=base, http=base + 1, metrics=base + 2)


class GpuSet:
    """The GPUs of one worker, lent to concurrent trials in aligned blocks (thread-safe)."""

    def __init__(self, gpus: int) -> None:
        if gpus < 1:
            raise InputError(f"a worker needs at least one GPU, not {gpus}")
        self.gpus = gpus
        self._free = set(range(gpus))
        self._queue: deque[object] = deque()
        self._changed = threading.Condition()

    @contextmanager
    def lease(self, tp: int) -> Iterator[Lease]:
        """Wait (in turn) for a block of `tp` GPUs; hold it while the body runs."""
        if tp > self.gpus:
            raise InputError(f"a TP-{tp} trial cannot run on a worker with {self.gpus} GPUs")
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            while True:
                block = place(frozenset(self._free), tp, self.gpus)
                if self._queue[0] is ticket and block is not None:
                    break
                self._changed.wait()
            self._queue.popleft()
            self._free -= set(block)
            self._changed.notify_all()  # the next in line may fit beside this one
        try:
            yield lease_for(block)
        finally:
            with self._changed:
                self._free |= set(block)
                self._changed.notify_all()
