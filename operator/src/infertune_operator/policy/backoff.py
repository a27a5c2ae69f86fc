"""When to try again after the Kubernetes API failed (pure): exponential backoff with jitter that
never comes sooner than the server's ``Retry-After``.

One policy serves the operator (a sync of one object that failed on a transient API error is
retried per object, see ``engine.context.Context.schedule_retry``) and the tuner Job (the report write,
see ``jobs.tune_job``). Kopf's ``TemporaryError(delay=...)`` carries the same idea for
Kopf's change handlers; this operator only has watching handlers, which Kopf does not retry
(docs/operator.md, *Transient API errors*).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delays for consecutive failures of one thing.

    Attempt n (1 = the first failure) waits ``min(cap_s, base_s * factor**(n-1))``, times a
    random factor in ``[1 - jitter, 1 + jitter]`` (objects that failed together do not retry in
    lockstep), and never less than the server's ``Retry-After`` (up to ``max_retry_after_s``: a
    broken header does not park an object for hours). When the Retry-After is the longer wait,
    the delay is spread above it, in ``[Retry-After, Retry-After * (1 + jitter)]``: a throttled
    API server answers every object with the same Retry-After, and N objects coming back the
    instant it ends would send N requests at once, the burst that got them throttled.

    The numbers: the first retry after 1 s, doubling, at most 60 s apart: a 60 s outage costs
    about 7 attempts instead of one per resync tick, and an object is never left waiting longer
    than the periodic resync (``engine.context.RESYNC_INTERVAL_S``) and Kopf's own default delay for
    ``TemporaryError`` (60 s) would leave it. client-go's default per-item rate limiter uses the
    same shape (5 ms doubling up to 1000 s); ours starts later because every sync makes several
    API calls.

    ``time_scale`` multiplies every delay, Retry-After included: 1.0 in production; tests run a
    60-second outage in 3 seconds with 0.05 (the API emulator's clock runs at the same scale), so
    the behaviour is the same, only faster.
    """

    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 60.0
    jitter: float = 0.2
    max_retry_after_s: float = 600.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.factor < 1 or self.cap_s < self.base_s:
            raise ValueError("backoff: need base_s > 0, factor >= 1 and cap_s >= base_s")
        if not 0 <= self.jitter < 1 or self.time_scale <= 0:
            raise ValueError("backoff: need 0 <= jitter < 1 and time_scale > 0")

    def nominal(self, attempt: int) -> float:
        """The delay before jitter and Retry-After, in unscaled seconds."""
        exponent = max(attempt, 1) - 1
        return min(self.cap_s, self.base_s * self.factor ** min(exponent, 64))

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        Args:
            attempt: How many attempts in a row have failed, this one included.
            retry_after: The server's Retry-After in seconds, when it sent one.
            rng: The source of jitter (default: the ``random`` module's).

        Returns:
            The wait, scaled by ``time_scale``: never less than ``retry_after`` (up to
            ``max_retry_after_s``), and then at most ``jitter`` of it more.
        """
        draw = rng or random
        wait = min(
            self.cap_s, self.nominal(attempt) * draw.uniform(1 - self.jitter, 1 + self.jitter)
        )
        floor = self._floor(retry_after)
        if wait < floor:
            wait = floor * draw.uniform(1, 1 + self.jitter)
        return wait * self.time_scale

    def least(self, attempt: int, retry_after: float | None = None) -> float:
        """The shortest delay :meth:`delay` can return for ``attempt`` and ``retry_after``
        (scaled): what a test can rely on, whatever the jitter drew."""
        shortest = min(self.cap_s, self.nominal(attempt) * (1 - self.jitter))
        return max(shortest, self._floor(retry_after)) * self.time_scale

    def _floor(self, retry_after: float | None) -> float:
        """The server's Retry-After as the delay honours it (unscaled; 0 when none)."""
        if retry_after is None or retry_after <= 0:
            return 0.0
        return min(retry_after, self.max_retry_after_s)
