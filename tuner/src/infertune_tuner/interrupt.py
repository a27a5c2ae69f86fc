"""Ctrl-C (SIGINT) during a tuning run: it stops the search, never the report of it.

While the search runs, Ctrl-C is Python's own: a KeyboardInterrupt wherever it lands (a trial's
wait, whose server is then torn down; `asyncio.run` turns it into the cancellation of its task).
Once the search has ended, by itself or by that Ctrl-C, the run is *settled*: what it reports is
decided, and a Ctrl-C that came now could only cut the rest short (a report written in part,
the success text followed by exit 130, a traceback or death by the signal while the process
exits). So from :func:`settle` on, SIGINT is ignored, until the :func:`settling` block that
armed it ends, or until the process exits when that block runs the process's own program.

Outside a :func:`settling` block (the operator's tuner Job, a test calling `run.tune`),
:func:`settle` does nothing: the caller's handling of SIGINT stays as it was.

:func:`by_ctrl_c` tells the error a Ctrl-C caused from another: Optuna's trial loop, when a
KeyboardInterrupt lands in a sampler's `after_trial` (inside `Study.tell`), reads a variable its
`try` never set and raises an UnboundLocalError instead, the KeyboardInterrupt as its context.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    UnraisableHook = Callable[[sys.UnraisableHookArgs], Any]

E = TypeVar("E", bound=BaseException)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers
# What Python writes (as an unraisable error) for a SIGINT that arrived while its handler became
# SIG_IGN (bpo-43406): a Ctrl-C at the moment the run settled, to be ignored as the rest are.
RACE = f"Signal {int(signal.SIGINT)} ignored due to race condition"


def _quiet(hook: UnraisableHook) -> UnraisableHook:
    def quiet(unraisable: sys.UnraisableHookArgs) -> None:
        if not (isinstance(unraisable.exc_value, OSError) and str(unraisable.exc_value) == RACE):
            hook(unraisable)

    return quiet


class _Arming:
    def __init__(self, until_exit: bool) -> None:
        self.until_exit = until_exit
        self.previous: Handler | None = None  # SIGINT's handler before settle() (None: unset)
        self.hook: UnraisableHook | None = None

    def settle(self) -> None:
        if self.previous is not None or threading.current_thread() is not threading.main_thread():
            return  # settled already; or not the thread Python runs signal handlers in
        # None: a handler installed outside Python, which cannot be put back: the default then.
        previous = signal.getsignal(signal.SIGINT) or signal.SIG_DFL
        self.hook = sys.unraisablehook
        sys.unraisablehook = _quiet(self.hook)
        while True:
            try:
                # Ignored by the kernel, not by a Python handler: Python puts its handlers back
                # to the default (death by the signal) while it exits. A process started from
                # now on would inherit it ignored; a settled run starts none.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                break
            except KeyboardInterrupt:  # one that came just before: the run settles all the same
                continue
        self.previous = previous

    def disarm(self) -> None:
        if self.previous is not None and not self.until_exit:
            signal.signal(signal.SIGINT, self.previous)
            if self.hook is not None:
                sys.unraisablehook = self.hook


_armed: _Arming | None = None


@contextmanager
def settling(*, until_exit: bool) -> Iterator[None]:
    """Within: :func:`settle` makes SIGINT ignored, until the block ends; with `until_exit`,
    until the process exits (the block is the process's program: its exit must not be cut
    short either). Only in the main thread: elsewhere, Python runs no signal handler."""
    global _armed
    outer, _armed = _armed, _Arming(until_exit)
    arming = _armed
    try:
        yield
    finally:
        _armed = outer
        arming.disarm()


def settle() -> None:
    """The run is settled (the search has ended, or cannot begin): from now on a Ctrl-C changes
    nothing, within a :func:`settling` block; elsewhere this does nothing."""
    if _armed is not None:
        _armed.settle()


def _behind(exc: BaseException, kind: type[E]) -> E | None:
    """`exc` itself when it is a `kind`, else the `kind` it was raised while unwinding (its
    chain of contexts), else None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


def exit_behind(exc: BaseException) -> SystemExit | None:
    """The SystemExit (SIGTERM: ``cli.support.exit_on_sigterm``) an error was raised while
    unwinding, as Optuna's trial loop does for a Ctrl-C (None: none is behind it)."""
    return _behind(exc, SystemExit)


def by_ctrl_c(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C, or an error raised while a Ctrl-C unwound the stack."""
    return _behind(exc, KeyboardInterrupt) is not None
