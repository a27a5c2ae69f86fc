"""What a real API server does that kmock leaves out and faults the tests inject.

* **Optimistic concurrency.** A write (PUT, or a merge patch) that names a
  ``metadata.resourceVersion`` other than the stored one is refused with 409 Conflict, with the
  API server's message; a DELETE whose ``preconditions.uid`` names another object too. kmock
  does not serve PUT at all: ``FakeApiServer`` turns a PUT into the merge patch that makes the
  stored object the one sent (status and server-set metadata kept, as a real update does).
* **The ConfigMap size limit.** ``data`` plus ``binaryData`` (decoded) over 1 MiB is refused as
  the API server refuses it (``ValidateConfigMap``: 422 Invalid, ``[]: Too long``).
* **Outages.** :class:`Outage` makes matching requests fail (503, or 429 with a Retry-After) for
  a while on an emulated clock (:class:`Clock`) that runs ``time_scale`` times faster than real
  time, so a 60-second outage lasts 3 real seconds at 0.05, and the operator's backoff runs at
  the same scale. Every failed request is logged with its emulated time (``failures``); a
  create with the name it would have created. An outage (5xx) of GET also ends the watch
  streams open when it starts (``FakeApiServer``): a real API server that fails its reads drops
  them (a throttle, 429, does not).
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import attrs
from kmock._internal.k8s import KubernetesError

# k8s.io/kubernetes pkg/apis/core/validation ValidateConfigMap: core.MaxSecretSize.
CONFIGMAP_LIMIT = 1024 * 1024


@attrs.frozen
class RetryAfterError(KubernetesError):
    """An error answer with a Retry-After header (seconds, as the API server sends it)."""

    retry_after: int | None = None


def conflict(plural: str, name: str, detail: str) -> KubernetesError:
    """409 as the API server words it (``Operation cannot be fulfilled on ...``)."""
    return KubernetesError(
        status=409,
        reason="Conflict",
        message=f'Operation cannot be fulfilled on {plural} "{name}": {detail}',
        details={"name": name, "kind": plural},
    )


def check_resource_version(plural: str, live: Mapping[str, Any] | None, data: Any) -> None:
    """409 when a write names a resourceVersion the object no longer has."""
    if live is None or not isinstance(data, Mapping):
        return
    wanted = (data.get("metadata") or {}).get("resourceVersion")
    have = (live.get("metadata") or {}).get("resourceVersion")
    if wanted and str(wanted) != str(have):
        name = (live.get("metadata") or {}).get("name", "")
        raise conflict(
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version "
            "and try again",
        )


def check_delete_preconditions(plural: str, live: Mapping[str, Any] | None, body: Any) -> None:
    """409 when a DELETE's preconditions name another uid (or resourceVersion)."""
    if live is None or not isinstance(body, Mapping):
        return
    pre = body.get("preconditions") or {}
    meta = live.get("metadata") or {}
    name = meta.get("name", "")
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise conflict(plural, name, (
            f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
            f"{meta.get('uid')}"))  # fmt: skip
    if pre.get("resourceVersion") and str(pre["resourceVersion"]) != str(
        meta.get("resourceVersion")
    ):
        raise conflict(plural, name, "Precondition failed: ResourceVersion in precondition")


def configmap_bytes(obj: Mapping[str, Any]) -> int:
    total = sum(len(str(v).encode("utf-8")) for v in (obj.get("data") or {}).values())
    for value in (obj.get("binaryData") or {}).values():
        total += len(base64.b64decode(value))
    return total


def check_configmap_size(plural: str, obj: Mapping[str, Any]) -> None:
    """422 for a ConfigMap over 1 MiB, worded as the API server words it (1.30 on; before:
    ``must have at most 1048576 bytes``)."""
    if plural != "configmaps" or configmap_bytes(obj) <= CONFIGMAP_LIMIT:
        return
    name = (obj.get("metadata") or {}).get("name", "")
    detail = f"Too long: may not be more than {CONFIGMAP_LIMIT} bytes"
    raise KubernetesError(
        status=422,
        reason="Invalid",
        message=f'ConfigMap "{name}" is invalid: []: {detail}',
        details={"name": name, "kind": "ConfigMap",
                 "causes": [{"reason": "FieldValueTooLong", "message": detail, "field": "[]"}]},
    )  # fmt: skip


@dataclass
class Clock:
    """Emulated seconds: real seconds / ``time_scale``, from when the clock was made."""

    time_scale: float = 1.0
    _start: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return (time.monotonic() - self._start) / self.time_scale


@dataclass
class Outage:
    """Requests that match fail from ``start`` for ``duration`` emulated seconds."""

    clock: Clock
    duration: float
    methods: frozenset[str] = frozenset({"POST", "PUT", "PATCH", "DELETE"})
    plurals: frozenset[str] | None = None  # None: every resource
    subresource: str | None = None  # "status": only status writes; None: the main resource too
    # Only requests of one object whose name starts with this (the name a create asks for);
    # None: every request, lists and watches included.
    name_prefix: str | None = None
    status: int = 503
    retry_after: int | None = None  # seconds (emulated), sent as Retry-After
    # False: the wait only in the Status's details.retryAfterSeconds (the operator reads both).
    # The header's seconds are real ones if anything sleeps on them: urllib3 would by default
    # (Retry.respect_retry_after_header); kube.client turns that off.
    retry_after_header: bool = True
    start: float = 0.0
    failures: list[tuple[float, str]] = field(default_factory=list)  # (emulated time, request)

    def active(self) -> bool:
        return self.start <= self.clock.now() < self.start + self.duration

    def matches(
        self, method: str, plural: str | None, subresource: str | None, name: str | None = None
    ) -> bool:
        if plural is None or method.upper() not in self.methods:
            return False
        if self.plurals is not None and plural not in self.plurals:
            return False
        if self.name_prefix is not None and not (name or "").startswith(self.name_prefix):
            return False
        return self.subresource is None or subresource == self.subresource

    def fail(self, method: str, plural: str, name: str | None) -> KubernetesError:
        self.failures.append((self.clock.now(), f"{method} {plural}/{name or ''}"))
        if self.status == 429:
            return RetryAfterError(
                status=429, reason="TooManyRequests",
                message="the server has received too many requests and has asked us to try "
                "again later",
                details={"retryAfterSeconds": self.retry_after or 1, "causes": []},
                retry_after=self.retry_after if self.retry_after_header else None,
            )  # fmt: skip
        wait = {"retryAfterSeconds": self.retry_after} if self.retry_after else {}
        return RetryAfterError(
            status=self.status, reason="ServiceUnavailable",
            message="the server is currently unable to handle the request",
            details={**wait, "causes": []},
            retry_after=self.retry_after if self.retry_after_header else None,
        )  # fmt: skip

    def gaps(self, request: str | None = None) -> list[float]:
        """Emulated seconds between consecutive failed attempts (of the requests that start with
        ``request``, if given: ``POST jobs/`` is every Job create, ``POST jobs/a-`` those of
        the Jobs whose names start with ``a-``)."""
        times = [t for t, what in self.failures if request is None or what.startswith(request)]
        return [b - a for a, b in itertools.pairwise(times)]
