"""What every sync shares (Kopf's memo): the client, the settings, per-object locks and memory,
the status writer, and the per-object retries after transient API errors.

``controller.sync`` converges one object; this module keeps what lives across syncs: which
objects are in flight (for the periodic resync), which were claimed by an event, and, for an
object whose sync failed on a transient API error (5xx, no answer, 408/409/429), its outage
(since when, how many attempts) and the one retry scheduled for it (``backoff``: exponential,
with jitter, never sooner than the server's Retry-After).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infertune_operator.kube.client import Kube
from infertune_operator.kube.errors import KubeError
from infertune_operator.naming import Body
from infertune_operator.observe.window import Window
from infertune_operator.policy import conditions
from infertune_operator.policy.backoff import Backoff
from infertune_operator.policy.drift import Persistence
from infertune_operator.settings import Settings

logger = logging.getLogger("infertune.operator")

EventPoster = Callable[[Body, conditions.Event], None]
Key = tuple[str, str]  # (namespace, name)

RESYNC_INTERVAL_S = 60.0
IN_FLIGHT = frozenset({"Pending", "Tuning", "Deploying"})


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log_event(body: Body, event: conditions.Event) -> None:
    """Where events go when no Kopf handler context can post them (tests, scripts)."""
    logger.debug("event %s %s for %s: %s", event.type, event.reason,
                 body.get("metadata", {}).get("name"), event.message)  # fmt: skip


@dataclass(frozen=True)
class Outage:
    """Consecutive failed syncs of one object on transient API errors."""

    since: str  # when the first of them failed (RFC 3339)
    attempts: int
    error: str  # the last error, as the API server said it
    retry_after: float | None = None  # the longest wait the server asked for in it (seconds)


@dataclass
class Observation:
    """What the observer remembers of one object between its reads (observer.py): the scrapes
    of the window, and since when drift and SLO misses have held. ``served``: the tuning and
    configuration they are about (a new rollout starts afresh)."""

    served: tuple[str, str]
    window: Window = field(default_factory=Window)
    drift: Persistence = field(default_factory=Persistence)
    risk: Persistence = field(default_factory=Persistence)


class RetryLater(Exception):
    """A sync failed on a transient API error; try the object again after ``delay`` seconds."""

    def __init__(self, delay: float, outage: Outage) -> None:
        super().__init__(f"retrying in {delay:.1f} s: {outage.error}")
        self.delay = delay
        self.outage = outage


@dataclass
class Context:
    """What every sync needs; lives in Kopf's memo (shared by all objects)."""

    kube: Kube
    settings: Settings
    post_event: EventPoster = log_event
    clock: Callable[[], str] = now
    resync_interval: float = RESYNC_INTERVAL_S
    backoff: Backoff = field(default_factory=Backoff)
    # Runs a sync of one object and schedules its next retry when it fails (set by handlers).
    retry_sync: Callable[[str, str], None] | None = None
    loop: asyncio.AbstractEventLoop | None = None  # Kopf's event loop (set at startup)
    _locks: dict[Key, threading.Lock] = field(default_factory=dict)
    _phases: dict[Key, str | None] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _rbac_lock: threading.Lock = field(default_factory=threading.Lock)
    _rbac_ready: set[str] = field(default_factory=set)
    _synced: set[Key] = field(default_factory=set)
    _claimed: dict[Key, tuple[str | None, int | None]] = field(default_factory=dict)
    _outages: dict[Key, Outage] = field(default_factory=dict)
    _retries: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    _observations: dict[Key, Observation] = field(default_factory=dict)
    _kopf_context: contextvars.Context | None = None
    _writer: ThreadPoolExecutor | None = None

    @property
    def time_scale(self) -> float:
        """How much faster than real time the operator's clocks run (1.0 in production; tests
        shorten windows and delays with the backoff's scale)."""
        return self.backoff.time_scale

    def observation(self, namespace: str, name: str, served: tuple[str, str]) -> Observation:
        """The observer's memory of one object, new when what it serves changed."""
        key = (namespace, name)
        with self._guard:
            memory = self._observations.get(key)
            if memory is None or memory.served != served:
                memory = self._observations[key] = Observation(served)
            return memory

    def forget_observation(self, namespace: str, name: str) -> None:
        with self._guard:
            self._observations.pop((namespace, name), None)

    def serving(self) -> list[Key]:
        """The objects the observer reads: those whose last sync left them Ready."""
        with self._guard:
            return [k for k, phase in self._phases.items() if phase == "Ready"]

    def capture_kopf_context(self) -> None:
        """Remember a handler's context: Kopf's event posting lives in context variables."""
        if self._kopf_context is None:
            self._kopf_context = contextvars.copy_context()

    def in_kopf_context(self) -> Callable[..., Any]:
        """A `run` for code outside Kopf's handlers (the resync, retries) that posts events."""
        base = self._kopf_context or contextvars.copy_context()
        return base.copy().run

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def claim(
        self, namespace: str, name: str, generation: int | None, uid: str | None = None
    ) -> bool:
        """True once per object and spec generation: the first event of an object in this
        process, then each spec change (the API server bumps metadata.generation on spec changes
        only, so our own status writes and repeated events of one generation claim nothing).
        An object deleted and created again under the same name is another object (another
        uid) at generation 1 again: Kopf may even hand over only its creation, the deletion's
        event merged away, so the uid is part of what is claimed."""
        key = (namespace, name)
        with self._guard:
            if self._claimed.get(key) == (uid, generation):
                return False
            if key in self._claimed and self._claimed[key][0] != uid:
                self._synced.discard(key)  # a new object: its first sync is a first sync
                self._outages.pop(key, None)
            self._claimed[key] = (uid, generation)
            return True

    def first_sync(self, namespace: str, name: str) -> bool:
        """True once per object and process: no sync of it has started before this one."""
        with self._guard:
            if (namespace, name) in self._synced:
                return False
            self._synced.add((namespace, name))
            return True

    def remember(self, namespace: str, name: str, phase: str | None) -> None:
        """The object's phase after a sync; None: it is gone (forget it, drop its retry)."""
        key = (namespace, name)
        with self._guard:
            if phase is None:
                self._locks.pop(key, None)
                self._phases.pop(key, None)
                self._synced.discard(key)
                self._claimed.pop(key, None)
                self._outages.pop(key, None)
                self._observations.pop(key, None)
                task = self._retries.pop(key, None)
                if task is not None and self.loop is not None:
                    self.loop.call_soon_threadsafe(task.cancel)
            else:
                self._phases[key] = phase

    def in_flight(self, *, everything: bool = False) -> list[Key]:
        """The objects whose next step waits on someone else (a Job, a Deployment rollout),
        except those with a retry of their own scheduled (the resync would only add attempts)."""
        with self._guard:
            return [
                k
                for k, phase in self._phases.items()
                if (everything or phase in IN_FLIGHT) and k not in self._retries
            ]

    # ---- outages and retries

    def failed(self, namespace: str, name: str, exc: KubeError) -> Outage:
        """Record a sync that failed on a transient API error; the outage so far."""
        key = (namespace, name)
        with self._guard:
            before = self._outages.get(key)
            asked = [w for w in (before.retry_after if before else None, exc.retry_after) if w]
            outage = Outage(
                since=before.since if before else self.clock(),
                attempts=(before.attempts if before else 0) + 1,
                error=str(exc),
                retry_after=max(asked, default=None),
            )
            self._outages[key] = outage
        return outage

    def outage(self, namespace: str, name: str) -> Outage | None:
        with self._guard:
            return self._outages.get((namespace, name))

    def recovered(self, namespace: str, name: str) -> None:
        """A sync of the object went through: its outage, if any, is over."""
        with self._guard:
            self._outages.pop((namespace, name), None)

    def schedule_retry(self, namespace: str, name: str, delay: float) -> bool:
        """Sync the object again in ``delay`` seconds (thread-safe). One retry per object: while
        one is scheduled, another failure does not add a second. False when there is no event
        loop to schedule on (a sync called outside the operator)."""
        loop, run = self.loop, self.retry_sync
        if loop is None or run is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(self._arm, (namespace, name), delay, run)
        return True

    def _arm(self, key: Key, delay: float, run: Callable[[str, str], None]) -> None:
        with self._guard:
            if key in self._retries:
                return
            task = asyncio.get_running_loop().create_task(
                self._retry(key, delay, run), name=f"infertune retry {key[0]}/{key[1]}"
            )
            self._retries[key] = task

    async def _retry(self, key: Key, delay: float, run: Callable[[str, str], None]) -> None:
        try:
            await asyncio.sleep(delay)
        finally:
            with self._guard:
                if self._retries.get(key) is asyncio.current_task():
                    del self._retries[key]
        call = self.in_kopf_context()
        await asyncio.get_running_loop().run_in_executor(None, call, run, *key)

    def cancel_retries(self) -> None:
        with self._guard:
            tasks, self._retries = list(self._retries.values()), {}
        for task in tasks:
            task.cancel()

    # ---- the status writer

    def defer(
        self,
        write: Callable[[], None],
        lock: threading.Lock,
        on_retry: Callable[[RetryLater], None] | None = None,
    ) -> None:
        """Run ``write`` on the status writer, one at a time, then release ``lock``.

        The caller holds ``lock`` (the object's) and hands it over: the next sync of the object
        waits until the write is done, so statuses never go back in time. One writer thread,
        so in a burst of creates the status writes queue behind the tuner Jobs instead of
        competing with them for the API server. A write that fails on a transient API error
        raises :class:`RetryLater` to ``on_retry`` (the object is retried with backoff).
        """
        with self._guard:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="infertune-status")
            writer = self._writer
        run = self.in_kopf_context()  # the writes post events

        def task() -> None:
            try:
                run(write)
            except RetryLater as exc:
                if on_retry is not None:
                    on_retry(exc)
            except KubeError as exc:  # the object stays in flight: the resync writes it
                logger.warning("status write failed (the resync retries): %s", exc)
            finally:
                lock.release()

        writer.submit(task)

    def close(self) -> None:
        """Stop the status writer (writes not started yet are dropped; a restart redoes them)
        and the scheduled retries."""
        self.cancel_retries()
        if self._writer is not None:
            self._writer.shutdown(wait=False, cancel_futures=True)
