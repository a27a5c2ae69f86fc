"""A throttling API server (429 with a Retry-After): objects throttled together come back spread
out, never sooner than asked, and a long throttle is shown in the status while it lasts.

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
    warning_events,
)
from .test_api_outage import BACKOFF, TIME_SCALE, shown_recovered, shown_unavailable


async def test_objects_throttled_together_do_not_all_come_back_in_the_same_instant(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    # Throttled: every read of these objects (the first request of a sync, which goes out the
    # instant its retry is due), so the times the server sees are the retry delays, not the time
    # the rest of a sync takes on a busy machine. Kopf's watches, which name no object, are not.
    # The wait is said in the Status only: the header's seconds would be real ones.
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


async def test_a_minute_long_throttle_is_shown_while_it_lasts_and_its_end_too(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    clock = faults.Clock(TIME_SCALE)
    throttle = faults.Outage(clock, duration=60, methods=frozenset({"POST"}),
                             plurals=frozenset({"jobs"}), status=429, retry_after=60)  # fmt: skip
    api.outages = [throttle]
    runner = await start_operator(api, backoff=BACKOFF)
    try:
        await create(api, manifest("slowed"))
        synced = await shown_unavailable(api, "slowed", throttle, timeout=30 * TIME_SCALE)
        assert "the API server asked to wait 60 s" in synced["message"]
        assert "too many requests" in synced["message"]
        [warning] = await warning_events(api, "slowed", "ApiUnavailable")
        assert "asked to wait 60 s" in warning["message"]

        await wait_for(lambda: jobs_of(api, "slowed"), timeout=120 * TIME_SCALE + 5,
                       what="the tuner Job after the throttle")  # fmt: skip
        await shown_recovered(api, "slowed")
    finally:
        await runner.stop()
    assert len(throttle.failures) == 1  # one attempt, then the 60 s the server asked for


async def test_a_throttled_read_comes_back_to_the_operator_not_slept_on_by_the_http_library(
    api: FakeApiServer,
) -> None:
    import asyncio

    import pytest

    from infertune_operator.kube.client import Kube
    from infertune_operator.kube.errors import KubeError
    from infertune_operator.kube.resources import INFERENCEDEPLOYMENTS

    from .apiserver import NS, api_url

    clock = faults.Clock(1.0)  # real seconds: what urllib3 would sleep is real time
    throttle = faults.Outage(clock, duration=600, methods=frozenset({"GET"}), name_prefix="x",
                             status=429, retry_after=2)  # with the header  # fmt: skip
    api.outages = [throttle]
    kube = Kube.for_url(api_url(api))
    with pytest.raises(KubeError) as refused:
        await asyncio.to_thread(kube.get, INFERENCEDEPLOYMENTS, NS, "x")
    assert refused.value.retryable and refused.value.retry_after == 2
    # One request: the wait (and its jitter) is the operator's backoff's to decide.
    assert len(throttle.failures) == 1, throttle.failures
