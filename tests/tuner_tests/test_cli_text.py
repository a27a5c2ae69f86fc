"""What the command line prints never cuts a value: catalog tables keep every key (and every
other value) whole at any width, piped or not; help wraps and never truncates."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_operator.cli_catalog import column_widths
from infertune_tuner.catalog.gpus import GPUS
from infertune_tuner.catalog.llms import MODELS

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


def test_lists_wrap_and_nothing_goes_below_its_longest_word() -> None:
    columns = ["key", "values"]
    rows = [["a-long-key-name", "one two three-and-a-half four"]]
    assert column_widths(columns, rows, 200) == [15, 29]
    assert column_widths(columns, rows, 40) == [15, 25]  # the list wraps between its items
    assert column_widths(columns, rows, 30) == [15, 16]  # down to its longest word, no further
    assert column_widths(columns, rows, 5) == [15, 16]  # the key never shrinks


@pytest.mark.parametrize("columns", ["60", "80"])
def test_help_never_cuts_a_word(columns: str) -> None:
    text = _run(["tune", "--help"], columns)
    flat = " ".join(text.split())
    assert "…" not in text
    for whole in ("spec.tuning.maxTrials.", "spec.tuning.sampler.", "spec.tuning.seed.",
                  "[default: simulated]", "infertune-out/NAME"):  # fmt: skip
        assert whole in flat.replace("infertune- out", "infertune-out"), whole
    listing = _run(["--help"], columns)
    assert "..." not in listing.split("Commands:")[1]  # every command's sentence whole
    assert "Print the InferenceDeployment CustomResourceDefinition (generated from" in " ".join(
        listing.split()
    )


def test_report_help_names_its_default_folder() -> None:
    flat = " ".join(_run(["report", "--help"], "80").split())
    assert "Output folder (default ./NAME-report)." in flat
