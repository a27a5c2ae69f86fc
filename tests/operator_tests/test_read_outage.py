"""A long outage of the API server's reads (every GET, LIST and WATCH answered 503) does not end
the operator: its watches retry until the API answers again, and work resumes by itself.

Times are emulated seconds (see ``test_api_outage``): at ``TIME_SCALE`` 0.05 the 3-minute outage
lasts 9 real seconds, and the operator's delays (its own backoff, Kopf's retries) run at the
same scale.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sized
from pathlib import Path

from . import faults
from .apiserver import (
    FakeApiServer,
    condition,
    create,
    get,
    jobs_of,
    manifest,
    start_operator,
    wait_for,
)
from .test_api_outage import BACKOFF, TIME_SCALE

# The production resync interval (engine.context.RESYNC_INTERVAL_S, 60 s) on the emulated clock:
# the object tuning before the outage is synced during it, as it would be in a cluster.
RESYNC = 60 * TIME_SCALE


async def test_a_three_minute_read_outage_leaves_the_operator_running_and_work_resumes(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    runner = await start_operator(api, backoff=BACKOFF, resync_interval=RESYNC)
    try:
        await create(api, manifest("before"))
        await wait_for(lambda: jobs_of(api, "before"), what="the tuner Job before the outage")

        clock = faults.Clock(TIME_SCALE)
        outage = faults.Outage(clock, duration=180, methods=frozenset({"GET"}))
        api.outages = [outage]
        await wait_for(lambda: not outage.active(), timeout=180 * TIME_SCALE + 5,
                       what="the end of the outage")  # fmt: skip
        watched = {what for _, what in outage.failures if what.startswith("GET ")}
        assert "GET inferencedeployments/" in watched, watched  # the watch retried into it
        assert runner.running, "the operator exited during the read outage"

        # A new object right after the outage gets its Job within a minute: the watches are back.
        await create(api, manifest("after"))
        await wait_for(lambda: jobs_of(api, "after"), timeout=60 * TIME_SCALE,
                       what="the tuner Job of an object created after the outage")  # fmt: skip

        # The object whose syncs failed while the API could not be read says so now.
        synced = await wait_for(
            lambda: condition(get(api, "inferencedeployments", "before"), "Synced"),
            timeout=120 * TIME_SCALE + 5, what="a Synced condition on the object synced during it",
        )  # fmt: skip
        assert synced["status"] == "True" and synced["reason"] == "ApiRecovered", synced
        assert "ApiUnavailable since" in synced["message"]
    finally:
        await runner.stop()


def test_kopf_never_runs_out_of_retries_and_each_request_starts_from_the_first_delay() -> None:
    from infertune_operator.engine.handlers import operator_settings

    delays = operator_settings().networking.error_backoffs
    assert isinstance(delays, Iterable) and not isinstance(delays, Sized)  # Kopf: no last try
    first = list(itertools.islice(delays, 1000))
    assert len(first) == 1000 and all(0.8 <= d <= 36 for d in first)
    assert sum(first[:8]) < 70 and 24 <= first[-1] <= 36  # Kopf's start, then every ~30 s
    assert next(iter(delays)) <= 1.2  # a new request starts afresh
    assert len({round(d, 6) for d in first[100:200]}) > 90  # jittered: no lockstep
