"""What every infertune command line shares: error reporting, help style, choices.

Two programs use it: ``infertune`` (the tuner's commands, ``infertune_tuner.cli``, mounted beside
the operator's cluster commands) and the simulated server's own entry point
(``python -m infertune_tuner.cli.simserver``), which is the same Typer command as
``infertune simserver``.

* An :class:`~infertune_tuner.errors.InputError` raised anywhere in a command, or while Typer
  converts an option (see :func:`one_of`), becomes ``error: <message>`` on stderr and the
  error's exit code, never a traceback. This happens once, in :class:`Group` / :class:`Command`,
  not in each command.
* Help shows no ``<bool>`` placeholder after a flag and names arguments ``SPEC``, not ``{spec}``.
* Help never cuts a word: the commands use click's plain help formatter (``infertune`` sets
  ``rich_markup_mode=None``), which wraps every column; Typer's rich panels cut any word wider
  than their help column ("spec.tuning.maxTri…" in an 80-column terminal). The command list
  shows each command's first sentence whole, wrapped, never ending in "...", under the heading
  its command was registered with (:func:`command`'s ``panel``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, get_args

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from infertune_tuner.config import KvCacheDtype, Quantization
from infertune_tuner.errors import EXIT_INVALID, InputError


class _Conventions:
    """Mixed into Typer's command classes (first in the MRO)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except InputError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:
            if exc.filename is None:
                raise
            # A file the command was pointed at cannot be used: name it and say why.
            typer.echo(f"error: {exc.filename}: {exc.strerror or exc}", err=True)
            raise typer.Exit(EXIT_INVALID) from None

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # a flag takes no value: no `<bool>` after it
        return params


class Group(_Conventions, TyperGroup):
    """The ``infertune`` command group."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list, one section per heading (each command's ``rich_help_panel``, which
        Typer's rich help would draw as a panel; this app prints click's plain help), in the
        order the commands were registered; a command without one goes under "Commands"."""
        sections: dict[str, list[tuple[str, Any]]] = {}
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                heading = getattr(cmd, "rich_help_panel", None) or "Commands"
                sections.setdefault(heading, []).append((name, cmd))
        if not sections:
            return
        width = max(len(name) for rows in sections.values() for name, _ in rows)
        limit = formatter.width - 6 - width
        for heading, rows in sections.items():
            with formatter.section(heading):
                # Names padded to the widest of all: every section's help starts in one column.
                formatter.write_dl([(n.ljust(width), c.get_short_help_str(limit)) for n, c in rows])


class Command(_Conventions, TyperCommand):
    """One command; the usage line names its arguments in capitals, optional ones in [ ]."""

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first sentence of the help, whole (the command list wraps it, never cuts it)."""
        text: str = super().get_short_help_str(limit=10_000)
        return text

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name or "ARG").upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces


def one_of(literal: Any, option: str, noun: str) -> dict[str, Any]:
    """``typer.Option`` keywords for a choice among a ``Literal``'s values.

    The values are listed in the help, and any other value is an InputError naming the option
    and the known values (``--quant: unknown quantization 'int3'; known: bf16, fp16, ...``).
    """
    choices: tuple[str, ...] = get_args(literal)

    def parse(value: str) -> str:
        if value not in choices:
            raise InputError(f"{option}: unknown {noun} {value!r}; known: {', '.join(choices)}")
        return value

    return {"parser": parse, "metavar": "|".join(choices)}


# The precision options of `predict` and `simserver` (parameters named `quant` and `kv_dtype`).
QuantOption = Annotated[
    str, typer.Option(help="Quantization.", **one_of(Quantization, "--quant", "quantization"))
]
KvDtypeOption = Annotated[
    str,
    typer.Option(help="KV-cache dtype.", **one_of(KvCacheDtype, "--kv-dtype", "KV-cache dtype")),
]


def command(
    app: typer.Typer, func: Callable[..., Any], name: str | None = None, *, panel: str | None = None
) -> None:
    """Register ``func`` on ``app`` as a :class:`Command` (the one way commands are added), listed
    under the heading ``panel`` in the app's help."""
    app.command(name, cls=Command, rich_help_panel=panel)(func)


EXIT_TERMINATED = 128 + 15  # what a shell reports for a process ended by SIGTERM


def exit_on_sigterm() -> None:
    """SIGTERM ends the command like Ctrl-C does: as an exception, so every `finally` runs (a
    real trial tears its server down) before the process exits with 143. Without it Python dies
    on the spot (and, as PID 1 of a container, ignores the signal)."""
    import signal
    import sys
    import threading

    def terminate(signum: int, frame: object) -> None:
        sys.exit(EXIT_TERMINATED)

    if threading.current_thread() is threading.main_thread():  # only there can it be set
        signal.signal(signal.SIGTERM, terminate)
