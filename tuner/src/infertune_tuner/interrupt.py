"""Ctrl-C (SIGINT) during a tuning run: it stops the search, never the report of it.

:func:`by_ctrl_c` tells the error a Ctrl-C caused from another: Optuna's trial loop, when a
KeyboardInterrupt lands in a sampler's `after_trial` (inside `Study.tell`), reads a variable its
`try` never set and raises an UnboundLocalError instead, the KeyboardInterrupt as its context.
"""

from __future__ import annotations


def by_ctrl_c(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C, or an error raised while a Ctrl-C unwound the stack."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False
