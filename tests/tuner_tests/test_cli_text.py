"""What the command line prints never cuts a value: catalog tables keep every key (and every
other value) whole at any width, piped or not; help wraps and never truncates."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner.catalog.gpus import GPUS
from infertune_tuner.catalog.llms import MODELS
from infertune_tuner.cli.catalog import column_widths

WIDTHS = ["40", "60", "80", "200"]


def _run(args: list[str], columns: str) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": columns})  # not a terminal: a pipe
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("columns", WIDTHS)
def test_gpus_shows_every_key_and_label_whole(columns: str) -> None:
    text = _run(["gpus"], columns)
    lines = text.splitlines()
    assert "…" not in text
    for g in GPUS.values():
        assert any(line.lstrip().startswith(g.key + " ") for line in lines), g.key
        for label in g.product_labels:
            assert label in text, label  # node labels are copied into nodeSelectors too


@pytest.mark.parametrize("columns", WIDTHS)
def test_models_shows_every_key_and_id_whole(columns: str) -> None:
    text = _run(["models"], columns)
    lines = text.splitlines()
    assert "…" not in text
    for m in MODELS.values():
        assert any(line.lstrip().startswith(m.key + " ") for line in lines), m.key
        for hf_id in m.hf_ids:
            assert hf_id in text, hf_id


def test_a_wide_terminal_gets_one_line_per_row() -> None:
    text = _run(["gpus"], "250")
    for g in GPUS.values():
        (row,) = [line for line in text.splitlines() if line.lstrip().startswith(g.key + " ")]
        assert ", ".join(sorted(g.quantizations)) in row


def test_lists_wrap_and_nothing_goes_below_its_longest_item() -> None:
    columns = ["key", "values", "link"]
    rows = [["a-long-key-name", "one, two, three-and-a-half, four", "pcie 25 GB/s"]]
    assert column_widths(columns, rows, 200) == [15, 32, 12]
    assert column_widths(columns, rows, 50) == [15, 23, 12]  # the list wraps between its items
    assert column_widths(columns, rows, 30) == [15, 16, 12]  # down to its longest item
    assert column_widths(columns, rows, 5) == [15, 16, 12]  # one value never splits


def test_a_pipe_gets_one_line_per_row() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "infertune_operator.cli", "gpus"],
                         capture_output=True, text=True, check=True,
                         env={k: v for k, v in __import__("os").environ.items()
                              if k != "COLUMNS"}).stdout  # fmt: skip
    for g in GPUS.values():
        (row,) = [line for line in out.splitlines() if line.lstrip().startswith(g.key + " ")]
        assert f"{g.link} {g.link_bandwidth_gbs:.0f} GB/s" in row
        assert ", ".join(sorted(g.quantizations)) in row and ", ".join(g.product_labels) in row


@pytest.mark.parametrize("columns", ["60", "80"])
def test_help_never_cuts_a_word(columns: str) -> None:
    text = _run(["tune", "--help"], columns)
    flat = " ".join(text.split())
    assert "…" not in text
    for whole in ("spec.tuning.maxTrials.", "spec.tuning.sampler.", "spec.tuning.seed.",
                  "[default: simulated]", "infertune-out/NAME"):  # fmt: skip
        assert whole in flat.replace("infertune- out", "infertune-out"), whole
    listing = _run(["--help"], columns)
    assert "..." not in listing.split("Tuning commands:")[1]  # every command's sentence whole
    assert "Print the InferenceDeployment CustomResourceDefinition (generated from" in " ".join(
        listing.split()
    )


def test_help_lists_the_tuning_and_the_cluster_commands_apart() -> None:
    listing = _run(["--help"], "80")
    tuning, cluster = listing.split("Tuning commands:")[1].split("Cluster commands:")

    def rows(section: str) -> list[str]:  # a command's line; its wrapped help is indented more
        return [line for line in section.splitlines() if line.startswith("  ") and line[2] != " "]

    def names(section: str) -> list[str]:
        return [row.split()[0] for row in rows(section)]

    assert names(tuning) == ["tune", "export-replay", "predict", "gpus", "models", "bench",
                             "simserver"]  # fmt: skip
    assert names(cluster) == ["crd", "validate", "render", "operator", "tune-job", "verify-job",
                              "report"]  # fmt: skip
    starts = {row.index(row.split(maxsplit=1)[1]) for row in rows(tuning) + rows(cluster)}
    assert len(starts) == 1  # the help of both sections starts in one column


def test_report_help_names_its_default_folder() -> None:
    flat = " ".join(_run(["report", "--help"], "80").split())
    assert "Output folder (default ./NAME-report)." in flat
