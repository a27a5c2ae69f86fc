"""How every command reports bad input: `error: ...` on stderr and an exit code, no traceback.

Its own module so that the command modules (cli_tuner, cli_harness, cli_operator) and cli.py,
which registers them, can all import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer

from infertune_tuner.errors import InputError

EXIT_INVALID = 2

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def user_errors(func: F) -> F:
    """Turn InputError into `error: ...` on stderr and exit 2."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            raise fail(str(exc)) from None

    return wrapper  # type: ignore[return-value]


__all__ = ["EXIT_INVALID", "fail", "user_errors"]
