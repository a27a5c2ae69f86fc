"""Settings read from the environment (a pod's env, a test's monkeypatch)."""

from __future__ import annotations

from collections.abc import Mapping

from infertune_tuner.errors import InputError


def positive_int(env: Mapping[str, str], name: str, what: str) -> int | None:
    """The whole number ≥ 1 in ``env[name]`` (None when unset or blank).

    Raises:
        InputError: naming the variable, when it is not a whole number of ``what`` or is < 1.
    """
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number of {what}, not {raw!r}") from None
    if value < 1:
        raise InputError(f"{name} must be at least 1")
    return value
