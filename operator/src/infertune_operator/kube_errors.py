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

``k8s`` raises them with the client's exception chained as ``__cause__``.
"""

from __future__ import annotations

import json
from typing import Any

# 4xx answers that say "not now" rather than "not this": the same request may succeed later.
RETRYABLE_CLIENT_STATUSES = frozenset({408, 409, 429})


class KubeError(Exception):
    """Any failed call to the Kubernetes API (or no usable client configuration)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

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


def from_response(status: int, http_reason: str, body: str | bytes | None, what: str) -> KubeError:
    """The error for an HTTP error answer to the call described by ``what``.

    Args:
        status: The HTTP status code.
        http_reason: The HTTP reason phrase.
        body: The response body (a metav1.Status JSON from a real API server).
        what: The call, for the message (``apply deployments/llm``).

    Returns:
        A :class:`ClientError` (or subclass) for 4xx, :class:`ServerError` for 5xx, a plain
        :class:`KubeError` otherwise. The message is the server's own (``message`` of the
        Status), prefixed with ``what``; ``reason`` is the Status reason (``Invalid``,
        ``BadRequest``, ...) when there is one, else the HTTP reason phrase.
    """
    payload = _status_body(body)
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
    return cls(message.strip(), status=status, reason=reason)


def unreachable(exc: BaseException, what: str) -> Unreachable:
    """The error for a call that got no HTTP answer (raise it ``from exc``)."""
    return Unreachable(f"{what}: {type(exc).__name__}: {exc}")
