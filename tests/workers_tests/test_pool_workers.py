"""A worker per GPU pool on one study in a real PostgreSQL (`infertune tune --pool`, what each
pool's tuner Job runs): each measures its own pool's configurations only, and one report
compares the pools."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .test_shared_study import REPO, finish, measured, start, the_study

EXAMPLE = REPO / "examples" / "llama2-70b-a100-or-h100.yaml"


def test_one_worker_per_pool_measures_its_own_pool_and_one_report_compares_them(
    tmp_path: Path, postgres_url: str
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    # Close prices: the model gives both pools a real chance, so both workers have work.
    doc["spec"]["gpu"]["pools"][0]["pricePerGpuHour"] = 1.2
    doc["spec"]["tuning"].update({"storage": postgres_url})
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    products = [p["product"] for p in doc["spec"]["gpu"]["pools"]]
    outs = {p: tmp_path / p for p in products}
    procs = [start(spec, out, scale=0.008, extra=["--pool", p]) for p, out in outs.items()]
    finish(procs)
    trials = measured(the_study(postgres_url))
    runs: dict[str, set[str]] = {}
    for t in trials:
        runs.setdefault(t.user_attrs["config"]["gpu"], set()).add(t.user_attrs["run"])
    assert set(runs) == set(products), runs  # both pools were measured ...
    detail = [
        (t.number, t.user_attrs["config"]["gpu"], t.user_attrs["run"][:6], t.state.name)
        for t in trials
    ]
    assert all(len(r) == 1 for r in runs.values()) and runs[products[0]] != runs[products[1]], (
        detail
    )
    # ... each by its own worker alone
    written = [json.loads((o / "report.json").read_text()) for o in outs.values()
               if (o / "report.json").exists()]  # fmt: skip
    [report] = written  # the last worker wrote the one report
    assert report["executed_trials"] == len(trials)
    assert {p["product"] for p in report["pools"]} == set(products)
    assert report["best"]["gpu"] in products


def test_a_pool_worker_without_a_shared_study_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "w"
    proc = start(EXAMPLE, out, scale=0.0, extra=["--pool", "H100-SXM-80GB"])
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, text
    assert "set spec.tuning.storage" in " ".join(text.split())
    assert "Traceback" not in text
