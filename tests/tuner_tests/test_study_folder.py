"""One output folder, one study: a re-run with other settings refuses (exit 2), says what
differs and which folder keeps both, and the earlier report stays as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner.journal import journal_storage

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama2-70b-h100.yaml"
REPORTS = ("report.json", "report.md", "report.html")


def _tune(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["tune", *map(str, args), "--no-progress"])
    return result.exit_code, " ".join(result.stdout.split()), " ".join(result.stderr.split())


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in REPORTS}


def test_another_seed_is_refused_and_the_earlier_report_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out)[0] == 0
    before = _files(out)
    code, stdout, stderr = _tune(EXAMPLE, "--out", out, "--seed", 9)
    assert code == 2, stdout + stderr
    assert f"error: {out} holds the study of an earlier run, and this run differs from it" in (
        stderr
    )
    assert "- spec.tuning.seed (--seed): 7 before, 9 now" in stderr
    assert f"To keep both, give this run its own folder: --out {out}-seed9." in stderr
    assert "Traceback" not in stdout + stderr and stdout == ""
    assert _files(out) == before  # nothing the user made is lost
    assert len(journal_storage(out).get_all_studies()) == 1  # and no second study started
    # The folder it suggests keeps both.
    code, stdout, _ = _tune(EXAMPLE, "--out", f"{out}-seed9", "--seed", 9)
    assert code == 0, stdout
    assert _files(out) == before and (tmp_path / "run-seed9" / "report.json").exists()


def test_the_same_study_resumes_even_with_another_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out)[0] == 0
    code, stdout, stderr = _tune(EXAMPLE, "--out", out, "--max-trials", 20)
    assert code == 0, stdout + stderr
    assert f"Resuming the study in {out}" in stderr


def test_a_lower_confidence_stops_sooner_and_raising_it_resumes_the_study(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _tune(EXAMPLE, "--out", out, "--confidence", 0.8)
    assert code == 0, stdout + stderr
    quick = json.loads((out / "report.json").read_text())
    assert "< 20%; confidence the optimum was found" in quick["stopped_reason"]
    assert quick["confidence"] >= 0.8
    # The same request at the default target: the same study, resumed with the trials it has.
    code, stdout, stderr = _tune(EXAMPLE, "--out", out)
    assert code == 0, stdout + stderr
    assert f"Resuming the study in {out}" in stderr
    sure = json.loads((out / "report.json").read_text())
    assert "< 5%; confidence the optimum was found" in sure["stopped_reason"]
    assert sure["confidence"] >= 0.95
    assert sure["executed_trials"] > quick["executed_trials"]
    assert len(journal_storage(out).get_all_studies()) == 1


def test_another_backend_or_sampler_is_refused_naming_each(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out)[0] == 0
    code, _, stderr = _tune(EXAMPLE, "--out", out, "--backend", "simulated:perturbed",
                            "--sampler", "tpe")  # fmt: skip
    assert code == 2
    assert "- spec.tuning.backend (--backend): simulated before, simulated:perturbed now" in stderr
    assert "- spec.tuning.sampler (--sampler): auto before, tpe now" in stderr
    assert f"--out {out}-simulated-perturbed." in stderr


def test_an_edited_slo_is_another_study(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out)[0] == 0
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["slo"] = {"e2eLatencyMs": {"p95": 20000}}
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    code, _, stderr = _tune(edited, "--out", out)
    assert code == 2
    assert "- spec.slo: E2E p95 <= 25600 ms before, E2E p95 <= 20000 ms now" in stderr
    assert "To resume the earlier study, run it with its settings" in stderr


def test_a_report_alone_is_kept_too(tmp_path: Path) -> None:
    """A folder holding only an earlier report (its journal deleted, or written by
    `infertune report`): that report is not overwritten by another study either."""
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out)[0] == 0
    for p in out.iterdir():
        if p.name not in REPORTS:
            p.unlink() if p.is_file() else shutil.rmtree(p)
    before = _files(out)
    code, _, stderr = _tune(EXAMPLE, "--out", out, "--seed", 3)
    assert code == 2 and "- spec.tuning.seed (--seed): 7 before, 3 now" in stderr
    assert _files(out) == before
    # The same settings start the study afresh there: its report is that study's.
    assert _tune(EXAMPLE, "--out", out)[0] == 0


def test_the_study_records_what_it_is(tmp_path: Path) -> None:
    """What a later refusal reads: the request and backend, kept on the study itself."""
    out = tmp_path / "run"
    assert _tune(EXAMPLE, "--out", out, "--backend", "simulated:perturbed")[0] == 0
    (study,) = journal_storage(out).get_all_studies()
    identity = study.user_attrs["identity"]
    assert identity["backend"] == "simulated:perturbed"
    report = json.loads((out / "report.json").read_text())
    assert identity["request"] == report["request"]
    assert optuna.load_study(study_name=study.study_name, storage=journal_storage(out))
