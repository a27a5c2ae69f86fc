"""What one load-generator run is asked to do (`LoadSpec`), and the clock it times with."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from infertune_tuner.errors import InputError

clock = time.monotonic  # CLOCK_MONOTONIC on Linux: the simulated server's clock too

# The stall bound's defaults, and why: stream.py.
STALL_GAPS = 4.0
STALL_TTFTS = 2.0
STALL_FLOOR_S = 1.0


@dataclass(frozen=True)
class LoadSpec:
    url: str
    model: str
    concurrency: int | None = 1  # closed loop: workers; request rate: cap (None = no cap)
    requests: int = 100
    input_tokens: int = 128
    output_tokens: int = 128
    warmup: int = 0
    request_rate: float | None = None
    seed: int = 0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    deadline_s: float | None = None  # the whole run, warm-up included
    # A request that has streamed tokens stalls when silent for `stall_gaps` times the longest
    # gap between responses, and `stall_ttfts` times the median TTFT, seen in the run, and never
    # less than the floor (stream.py).
    stall_gaps: float = STALL_GAPS
    stall_ttfts: float = STALL_TTFTS
    stall_floor_s: float = STALL_FLOOR_S

    def validate(self) -> None:
        if self.requests < 1:
            raise InputError("requests must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError("concurrency must be at least 1")
        if self.request_rate is None and self.concurrency is None:
            raise InputError("closed-loop mode needs a concurrency")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise InputError("input and output tokens must be at least 1")
        if self.warmup < 0:
            raise InputError("warmup must not be negative")
        if self.request_rate is not None and self.request_rate <= 0:
            raise InputError("request rate must be positive")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise InputError("the deadline must be positive")
        if min(self.stall_gaps, self.stall_ttfts, self.stall_floor_s) <= 0:
            raise InputError("the stall bound must be positive")

    def settings(self) -> dict[str, Any]:
        return {
            "url": self.url, "model": self.model, "concurrency": self.concurrency,
            "request_rate": self.request_rate, "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens, "warmup": self.warmup,
            "deadline_s": self.deadline_s,
        }  # fmt: skip
