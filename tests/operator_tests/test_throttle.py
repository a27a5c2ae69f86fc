"""A throttling API server (429 with a Retry-After): objects throttled together come back spread
out, never sooner than asked.

Times are emulated seconds (see ``test_api_outage``, whose clock scale and backoff these share).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from . import faults
from .apiserver import (
    FakeApiServer,
    create,
    jobs_of,
    manifest,
    start_operator,
    wait_for,
)
from .test_api_outage import BACKOFF, TIME_SCALE


async def test_objects_throttled_together_do_not_all_come_back_in_the_same_instant(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    # Throttled: every read of these objects (the first request of a sync, which goes out the
    # instant its retry is due), so the times the server sees are the retry delays, not the time
    # the rest of a sync takes on a busy machine. Kopf's watches, which name no object, are not.
    # The wait is said in the Status only: with the header, urllib3 would retry a GET by itself.
    names = [f"herd-{i}" for i in range(8)]
    clock = faults.Clock(TIME_SCALE)
    throttle = faults.Outage(clock, duration=90, methods=frozenset({"GET"}), name_prefix="herd-",
                             status=429, retry_after=30, retry_after_header=False)  # fmt: skip
    api.outages = [throttle]
    runner = await start_operator(api, backoff=BACKOFF)
    try:
        for name in names:
            await create(api, manifest(name))
        await wait_for(lambda: all(jobs_of(api, n) for n in names), timeout=200 * TIME_SCALE + 5,
                       what="every tuner Job once the throttle ends")  # fmt: skip
    finally:
        await runner.stop()
    # Each object's waits between its throttled attempts (its first at ~0 s, then ~30 s, ~60 s).
    waits = [b - a for n in names for a, b in itertools.pairwise(
        t for t, what in throttle.failures if what.split("/", 1)[1] in (n, f"{n}-tuning-report"))]  # fmt: skip
    print(f"waits after Retry-After: 30 (emulated s): {sorted(round(w, 2) for w in waits)}")
    assert len(waits) >= len(names), throttle.failures
    assert all(w >= 30 for w in waits), waits  # never sooner than the server asked
    # Spread above it: 8 objects do not send 8 requests the instant the 30 s are up.
    assert max(waits) - min(waits) >= 3, waits
