"""The tuner's commands, and how a program mounts them on its command line.

``infertune`` mounts them (with the operator's :class:`~infertune_tuner.cli.tuning.SpecReader`)
and adds its cluster commands; help lists the two sets under their own headings
(:data:`TUNING_COMMANDS` here, the program's own for the rest: see
:class:`~infertune_tuner.cli.support.Group`).
"""

from __future__ import annotations

import typer

from infertune_tuner.cli.bench import bench
from infertune_tuner.cli.catalog import gpus, models
from infertune_tuner.cli.simserver import simserver
from infertune_tuner.cli.support import command
from infertune_tuner.cli.tuning import SpecReader, export_replay, predict, tune_command

TUNING_COMMANDS = "Tuning commands"


def mount(app: typer.Typer, read_spec: SpecReader) -> None:
    """Register the tuner's commands on ``app``, under :data:`TUNING_COMMANDS`; `tune` reads its
    SPEC with ``read_spec``."""
    for func in (tune_command(read_spec), export_replay, predict, gpus, models, bench, simserver):
        command(app, func, panel=TUNING_COMMANDS)
