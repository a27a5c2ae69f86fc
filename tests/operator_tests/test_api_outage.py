"""An API outage is visible and retried with backoff, then recovers.

The emulator's clock and the operator's delays run at the same ``TIME_SCALE``: a 60-second
outage lasts 3 real seconds, a 1 s backoff 50 ms, a ``Retry-After: 20`` 1 s. Times below are
emulated seconds unless they say otherwise.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infertune_operator.kube.errors import from_response, parse_retry_after
from infertune_operator.policy.backoff import Backoff

from . import faults
from .apiserver import (
    FakeApiServer,
    condition,
    create,
    events_for,
    get,
    idf,
    jobs_of,
    manifest,
    phase,
    start_operator,
    wait_for,
    warning_events,
)

TIME_SCALE = 0.05
BACKOFF = Backoff(time_scale=TIME_SCALE)
JOB_CREATE = "POST jobs/"


async def shown_unavailable(
    api: FakeApiServer, name: str, fault: faults.Outage, timeout: float
) -> dict[str, Any]:
    """Waits until ``name``'s status says the API fails (``Synced=False ApiUnavailable``), which
    must come while ``fault`` lasts; returns that condition."""
    await wait_for(
        lambda: condition(get(api, "inferencedeployments", name), "Synced").get("reason")
        == "ApiUnavailable",
        timeout=timeout, what="Synced=False ApiUnavailable while the fault lasts",
    )  # fmt: skip
    assert fault.active(), "the condition came only after the fault"
    synced = condition(idf(api, name), "Synced")
    assert synced["status"] == "False"
    assert synced["message"].startswith("ApiUnavailable since ")
    return synced


async def shown_recovered(api: FakeApiServer, name: str) -> None:
    """Waits until ``name``'s status and events say the API answers again (ApiRecovered)."""
    await wait_for(
        lambda: condition(get(api, "inferencedeployments", name), "Synced").get("reason")
        == "ApiRecovered",
        what="Synced=True ApiRecovered",
    )  # fmt: skip
    recovered = condition(idf(api, name), "Synced")
    assert recovered["status"] == "True" and "ApiUnavailable since " in recovered["message"]
    await wait_for(
        lambda: [e for e in events_for(api, name) if e["reason"] == "ApiRecovered"],
        what="an ApiRecovered event",
    )


async def test_a_minute_of_5xx_on_job_creation_is_shown_retried_with_growing_delays_and_recovers(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    clock = faults.Clock(TIME_SCALE)
    outage = faults.Outage(clock, duration=60, methods=frozenset({"POST"}),
                           plurals=frozenset({"jobs"}))  # fmt: skip
    api.outages = [outage]
    runner = await start_operator(api, backoff=BACKOFF)
    try:
        await create(api, manifest("blip"))

        # While it lasts: a condition and a Warning event say so; the phase is not left empty.
        synced = await shown_unavailable(api, "blip", outage, timeout=60 * TIME_SCALE)
        assert "create jobs/blip-tune-" in synced["message"]
        assert "the server is currently unable to handle the request" in synced["message"]
        assert phase(api, "blip") == "Pending"
        [warning] = await warning_events(api, "blip", "ApiUnavailable")
        assert "ApiUnavailable since" in warning["message"]
        assert jobs_of(api, "blip") == []

        # Then it recovers by itself: the Job, and the status says the outage is over.
        await wait_for(lambda: jobs_of(api, "blip"), timeout=200 * TIME_SCALE + 5,
                       what="the tuner Job after the outage")  # fmt: skip
        await shown_recovered(api, "blip")
        assert condition(idf(api, "blip"), "Tuned")["reason"] == "TuningPending"
    finally:
        await runner.stop()

    # One attempt per backoff step, each delay longer than the one before: about 7 attempts in
    # the minute (the resync alone tried 12 in 6 s in tests, and once a minute for real).
    gaps = outage.gaps(JOB_CREATE)
    print(f"delays between attempts (emulated s): {[round(g, 2) for g in gaps]}")
    assert 5 <= len(outage.failures) <= 9, outage.failures
    for attempt, gap in enumerate(gaps, start=1):
        assert gap >= BACKOFF.least(attempt) / TIME_SCALE, (attempt, gaps)
    assert gaps[-1] > 3 * gaps[0]


async def test_retry_after_is_honoured(api: FakeApiServer, kubeconfig: Path) -> None:
    clock = faults.Clock(TIME_SCALE)
    throttled = faults.Outage(clock, duration=30, methods=frozenset({"POST"}),
                              plurals=frozenset({"jobs"}), status=429, retry_after=20)  # fmt: skip
    api.outages = [throttled]
    runner = await start_operator(api, backoff=BACKOFF)
    try:
        await create(api, manifest("slow"))
        await wait_for(lambda: jobs_of(api, "slow"), timeout=100 * TIME_SCALE + 5,
                       what="the tuner Job once throttling ends")  # fmt: skip
    finally:
        await runner.stop()
    gaps = throttled.gaps(JOB_CREATE)
    print(f"delays between throttled attempts (emulated s): {[round(g, 2) for g in gaps]}")
    assert gaps, throttled.failures
    assert all(gap >= 20 for gap in gaps), gaps  # never sooner than Retry-After (backoff: 1, 2)
    assert len(throttled.failures) <= 2  # 0 s and ~20 s; the third try (~40 s) goes through


async def test_an_outage_of_every_write_is_reported_once_writes_work_again(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    await create(api, manifest("dark"))  # created while no operator runs
    clock = faults.Clock(TIME_SCALE)
    outage = faults.Outage(clock, duration=20, plurals=frozenset(
        {"jobs", "configmaps", "inferencedeployments", "serviceaccounts", "rolebindings"}))  # fmt: skip
    api.outages = [outage]
    runner = await start_operator(api, backoff=BACKOFF)  # it comes up into the outage
    try:
        await wait_for(lambda: jobs_of(api, "dark"), timeout=100 * TIME_SCALE + 5,
                       what="the tuner Job after the outage")  # fmt: skip
        await wait_for(lambda: phase(api, "dark") == "Pending", what="phase Pending")
        # Nothing could be written while it lasted; what is written first says it happened.
        synced = await wait_for(lambda: condition(get(api, "inferencedeployments", "dark"),
                                                  "Synced"), what="a Synced condition")  # fmt: skip
        assert synced["status"] == "True" and synced["reason"] == "ApiRecovered"
        assert (
            "ApiUnavailable since" in synced["message"] and "attempts failed" in synced["message"]
        )
    finally:
        await runner.stop()


async def test_the_tuner_retries_its_report_write_through_an_outage(
    api: FakeApiServer, tmp_path: Path
) -> None:
    import asyncio

    from infertune_operator.api.to_request import to_request
    from infertune_operator.kube.client import Kube
    from infertune_operator.objects import tuner_job
    from infertune_operator.policy.tuning import validate
    from infertune_operator.reports.owner import WriteAction
    from infertune_operator.reports.writer import write_report
    from infertune_tuner.run import tune

    from .apiserver import NS, SETTINGS, api_url, post

    body = await post(api, "inferencedeployments", manifest("saved"))
    obj, problems = validate(body)
    assert obj is not None, problems
    report = tune(to_request(obj), backend="simulated", out_dir=tmp_path / "study")
    clock = faults.Clock(TIME_SCALE)
    outage = faults.Outage(clock, duration=10, methods=frozenset({"POST"}),
                           plurals=frozenset({"configmaps"}))  # fmt: skip
    api.outages = [outage]
    outcome = await asyncio.to_thread(
        write_report, Kube.for_url(api_url(api)),
        request=tuner_job.tuning_request(obj, SETTINGS), report=report, namespace=NS,
        th="h", uid=body["metadata"]["uid"], backoff=BACKOFF,
    )  # fmt: skip
    assert outcome.action is WriteAction.CREATE  # written once the API took writes again
    assert len(outage.failures) >= 2
    assert get(api, "configmaps", "saved-tuning-report") is not None


# ------------------------------------------------------------------ the pieces, alone


def test_backoff_grows_caps_and_never_undercuts_retry_after() -> None:
    policy = Backoff()
    rng = random.Random(0)
    delays = [policy.delay(n, rng=rng) for n in range(1, 10)]
    assert delays[0] < 1.3 and 40 <= delays[-1] <= 60
    assert all(b > a for a, b in itertools.pairwise(delays[:6]))  # until the cap
    assert policy.delay(1, retry_after=30, rng=rng) >= 30
    assert 600 <= policy.delay(1, retry_after=10**6, rng=rng) <= 720  # max_retry_after_s, spread
    assert 5 <= Backoff(time_scale=0.5).delay(1, retry_after=10, rng=rng) <= 6
    with pytest.raises(ValueError):
        Backoff(base_s=0)


def test_objects_told_the_same_retry_after_come_back_spread_above_it() -> None:
    policy = Backoff()
    rng = random.Random(1)
    delays = [policy.delay(2, retry_after=60, rng=rng) for _ in range(200)]
    assert all(60 <= d <= 72 for d in delays)  # never sooner; at most the jitter (20 %) later
    assert max(delays) - min(delays) > 10  # spread over the 12 s, not 200 requests at 60 s
    assert policy.least(2, retry_after=60) == 60 <= min(delays)
    # A Retry-After shorter than the backoff's own delay leaves the backoff as it is.
    assert Backoff(jitter=0).delay(7, retry_after=5) == 60 == Backoff(jitter=0).least(7, 5)


def test_retry_after_comes_from_the_header_or_the_status_details() -> None:
    assert parse_retry_after("7") == 7
    now = datetime(2026, 1, 1, tzinfo=UTC)
    date = (now + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert parse_retry_after(date, now=now) == 90
    assert parse_retry_after("soon") is None and parse_retry_after("nan") is None
    body = '{"kind": "Status", "reason": "TooManyRequests", "details": {"retryAfterSeconds": 3}}'
    err = from_response(429, "Too Many Requests", body, "create jobs/x")
    assert err.retryable and err.retry_after == 3
    assert from_response(503, "x", "{}", "w", retry_after="12").retry_after == 12
