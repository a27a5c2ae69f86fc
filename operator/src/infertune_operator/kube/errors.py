"""What a failed call to the Kubernetes API means for the caller (pure: no kubernetes client).

Every failed call ends up as a :class:`KubeError`, in one of three families that call for
different handling:

* :class:`ClientError` (HTTP 4xx): the API server refused this request. Most of them are
  deterministic (400 BadRequest: an object that cannot be decoded, such as a malformed resource
  quantity; 422 Invalid: a field validation or an admission policy says no; 403 Forbidden) and
  sending the same request again gets the same answer: the operator records them in the status
  instead of retrying. A few 4xx are about timing, not content (408, 409 Conflict on a stale
  resourceVersion, 429 Too Many Requests): :attr:`KubeError.retryable` says so.
* :class:`ServerError` (HTTP 5xx): the API server (or a webhook it called) failed: retry.
* :class:`Unreachable` (no HTTP answer: connection refused, TLS, timeout): retry.

``client`` raises them with the client's exception chained as ``__cause__``. An answer that says
when to come back (``Retry-After``, or ``details.retryAfterSeconds`` in the Status: a 429 from API
priority and fairness, a 503 of an overloaded server) carries it in :attr:`KubeError.retry_after`;
``policy.backoff`` never retries sooner.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

# 4xx answers that say "not now" rather than "not this": the same request may succeed later.
RETRYABLE_CLIENT_STATUSES = frozenset({408, 409, 429})


class KubeError(Exception):
    """Any failed call to the Kubernetes API (or no usable client configuration)."""

    def __init__(
        self, message: str, status: int = 0, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after  # seconds the server asked us to wait, when it did

    @property
    def retryable(self) -> bool:
        """Whether sending the same request again later may succeed."""
        return True


class KubeConfigError(KubeError):
    """No in-cluster service account and no usable kubeconfig."""

    @property
    def retryable(self) -> bool:
        return False


class Unreachable(KubeError):
    """No HTTP answer from the API server (connection refused, TLS failure, timeout)."""


class ServerError(KubeError):
    """HTTP 5xx: the API server, or a webhook it called, failed to handle the request."""


class ClientError(KubeError):
    """HTTP 4xx: the API server refused the request (``reason``: BadRequest, Invalid, ...)."""

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_CLIENT_STATUSES


class NotFound(ClientError):
    pass


class Conflict(ClientError):
    pass


class Forbidden(ClientError):
    pass


_BY_STATUS: dict[int, type[ClientError]] = {404: NotFound, 409: Conflict, 403: Forbidden}


def _status_body(body: str | bytes | None) -> dict[str, Any]:
    """The metav1.Status the API server answers errors with ({} when the body is not one)."""
    try:
        payload = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP-date (RFC 9110 10.2.3).

    None when absent or unreadable (then the backoff alone decides).
    """
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def from_response(
    status: int,
    http_reason: str,
    body: str | bytes | None,
    what: str,
    *,
    retry_after: str | None = None,
) -> KubeError:
    """The error for an HTTP error answer to the call described by ``what``.

    Args:
        status: The HTTP status code.
        http_reason: The HTTP reason phrase.
        body: The response body (a metav1.Status JSON from a real API server).
        what: The call, for the message (``apply deployments/llm``).
        retry_after: The ``Retry-After`` header, when the answer had one.

    Returns:
        A :class:`ClientError` (or subclass) for 4xx, :class:`ServerError` for 5xx, a plain
        :class:`KubeError` otherwise. The message is the server's own (``message`` of the
        Status), prefixed with ``what``; ``reason`` is the Status reason (``Invalid``,
        ``BadRequest``, ...) when there is one, else the HTTP reason phrase; ``retry_after``
        from the header, else from the Status's ``details.retryAfterSeconds``.
    """
    payload = _status_body(body)
    wait = parse_retry_after(retry_after)
    if wait is None:
        details = payload.get("details")
        seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
        wait = float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None
    server_message = str(payload.get("message") or "").strip()
    message = (
        f"{what}: {server_message}" if server_message else f"{what}: HTTP {status} {http_reason}"
    )
    reason = str(payload.get("reason") or http_reason or "")
    cls: type[KubeError]
    if 400 <= status <= 499:
        cls = _BY_STATUS.get(status, ClientError)
    elif status >= 500:
        cls = ServerError
    else:
        cls = KubeError
    return cls(message.strip(), status=status, reason=reason, retry_after=wait)


def unreachable(exc: BaseException, what: str) -> Unreachable:
    """The error for a call that got no HTTP answer (raise it ``from exc``)."""
    return Unreachable(f"{what}: {type(exc).__name__}: {exc}")
