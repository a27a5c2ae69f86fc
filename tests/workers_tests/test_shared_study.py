"""Several `infertune tune` processes on one study in a real PostgreSQL: workers of one tuning.

The simulated pool runs at a fraction of real time (INFERTUNE_SIMULATED_TIME_SCALE) so that the
workers' trials overlap as they do on GPUs.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

from infertune_tuner.backends.replay import write_table
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.search.evidence import Decision

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama2-70b-h100.yaml"
INFERTUNE = Path(sys.executable).parent / "infertune"
FAST = {"INFERTUNE_HEARTBEAT_SECONDS": "1", "INFERTUNE_HEARTBEAT_GRACE_SECONDS": "3"}


def _purpose(t: optuna.trial.FrozenTrial) -> str:
    """Why the sampler chose the trial, as it recorded its decision."""
    d = Decision.of(t)
    return d.purpose if d is not None else "explore"


def spec_file(tmp_path: Path, url: str, **tuning: object) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["tuning"].update({"storage": url, **tuning})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start(
    spec: Path, out: Path, *, scale: float, backend: str = "simulated",
    extra: list[str] | None = None,
) -> subprocess.Popen[str]:  # fmt: skip
    env = {**os.environ, **FAST, "INFERTUNE_SIMULATED_TIME_SCALE": str(scale)}
    return subprocess.Popen(
        [str(INFERTUNE), "tune", str(spec), "--backend", backend, "--out", str(out),
         "--no-progress", *(extra or [])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(procs: list[subprocess.Popen[str]], timeout: float = 240) -> list[str]:
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        assert p.returncode == 0, out
        assert "Traceback" not in out
        outputs.append(out)
    return outputs


def the_study(url: str) -> optuna.Study:
    names = optuna.get_all_study_names(url)
    assert len(names) == 1, names  # every worker joined the same study
    return optuna.load_study(study_name=names[0], storage=url)


def measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if "measurement" in t.user_attrs]


def config(t: optuna.trial.FrozenTrial) -> TrialConfig:
    c = t.user_attrs["config"]
    return TrialConfig(c["tp"], c["max_batch_size"], c["quantization"], c["kv_cache_dtype"])


def assert_no_duplicates(trials: list[optuna.trial.FrozenTrial]) -> None:
    """Each configuration is measured once, apart from one deliberate confirmation; and two
    trials of one configuration never ran at the same time."""
    first = [config(t) for t in trials if _purpose(t) != "confirm"]
    assert len(first) == len(set(first)), Counter(first).most_common(3)
    confirms = Counter(config(t) for t in trials if _purpose(t) == "confirm")
    assert all(n == 1 for n in confirms.values()), confirms
    by_config: dict[TrialConfig, list[optuna.trial.FrozenTrial]] = {}
    for t in trials:
        by_config.setdefault(config(t), []).append(t)
    for runs in by_config.values():
        runs.sort(key=lambda t: t.datetime_start)
        for a, b in itertools.pairwise(runs):
            assert a.datetime_complete is not None and a.datetime_complete <= b.datetime_start


def reports(outs: list[Path]) -> list[dict[str, object]]:
    return [
        json.loads((o / "report.json").read_text()) for o in outs if (o / "report.json").exists()
    ]


def test_three_workers_share_the_work_and_write_one_report(
    tmp_path: Path, postgres_url: str
) -> None:
    spec = spec_file(tmp_path, postgres_url)
    outs = [tmp_path / f"w{i}" for i in range(3)]
    logs = finish([start(spec, o, scale=0.008) for o in outs])
    study = the_study(postgres_url)
    trials = measured(study)
    assert_no_duplicates(trials)
    workers = Counter(t.user_attrs["run"] for t in trials)
    assert len(workers) >= 2, workers  # the work was spread over the processes
    [report] = reports(outs)  # exactly one worker wrote the report: the last one
    assert report["executed_trials"] == len(trials)
    assert report["best"] is not None and str(report["stopped_reason"]).startswith("converged")
    assert sum("the last worker of the shared study writes the report" in log for log in logs) == 2
    # The URL is nobody's business: not in the report, not in what the workers printed.
    assert postgres_url not in json.dumps(report)
    assert all(postgres_url not in log for log in logs)


def test_the_budget_holds_across_workers(tmp_path: Path, postgres_url: str) -> None:
    spec = spec_file(tmp_path, postgres_url, sampler="random", maxTrials=6)
    outs = [tmp_path / f"w{i}" for i in range(3)]
    finish([start(spec, o, scale=0.001) for o in outs])
    trials = measured(the_study(postgres_url))
    assert len(trials) == 6  # not 6 per worker, and none over
    assert_no_duplicates(trials)
    assert len({t.user_attrs["run"] for t in trials}) >= 2
    [report] = reports(outs)
    assert report["executed_trials"] == 6
    assert "maxTrials (6)" in str(report["stopped_reason"])


def test_a_killed_workers_trial_is_rerun_by_another(tmp_path: Path, postgres_url: str) -> None:
    spec = spec_file(tmp_path, postgres_url)
    # A worker whose trials take minutes: killed in the middle of its first one.
    doomed = start(spec, tmp_path / "doomed", scale=1.0)
    deadline = time.monotonic() + 60
    running: list[optuna.trial.FrozenTrial] = []
    while not running and time.monotonic() < deadline:
        time.sleep(0.2)
        if optuna.get_all_study_names(postgres_url):
            study = the_study(postgres_url)
            running = [t for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                       if "config" in t.user_attrs]  # fmt: skip
    assert running, "the first worker never started a trial"
    killed = running[0]
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=30)
    outs = [tmp_path / f"w{i}" for i in range(2)]
    finish([start(spec, o, scale=0.004) for o in outs])
    study = the_study(postgres_url)
    by_number = {t.number: t for t in study.get_trials()}
    assert by_number[killed.number].state == optuna.trial.TrialState.FAIL
    retries = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1
    [retry] = retries
    assert "measurement" in retry.user_attrs and config(retry) == config(killed)
    assert retry.user_attrs["run"] != killed.user_attrs["run"]  # another worker re-ran it
    trials = measured(study)
    assert_no_duplicates(trials)
    [report] = reports([tmp_path / "doomed", *outs])
    assert report["best"] is not None
    assert report["executed_trials"] == len(trials)


def test_workers_on_the_replay_backend(tmp_path: Path, postgres_url: str) -> None:
    from infertune_operator.api.manifest import load_deployment
    from infertune_operator.api.to_request import to_request
    from infertune_tuner.run import prior_predictions
    from infertune_tuner.space import build_space

    spec = spec_file(tmp_path, postgres_url)
    request = to_request(load_deployment(spec), default_backend="simulated")
    space = build_space(request, request.resolve_model(), request.resolve_gpu(), "replay")
    priors = prior_predictions(request, space)
    sim = SimulatedBackend.perturbed(request, seed=3)
    table = tmp_path / "table.csv"
    write_table(table, {c: sim.run(c) for c in space.configs if priors[c].fits})
    outs = [tmp_path / f"w{i}" for i in range(2)]
    finish([start(spec, o, scale=0, backend=f"replay:{table}") for o in outs])
    trials = measured(the_study(postgres_url))
    assert_no_duplicates(trials)
    [report] = reports(outs)
    assert str(report["backend"]).startswith("replay:")
    assert report["executed_trials"] == len(trials)


@pytest.mark.parametrize("driver", ["postgresql", "postgresql+psycopg"])
def test_the_documented_url_form_opens_with_the_postgres_extra(
    postgres_url: str, driver: str
) -> None:
    from infertune_tuner.storage import open_storage

    url = postgres_url.replace("postgresql", driver, 1)
    storage = open_storage(url, Path("/nonexistent"))
    assert storage.engine.dialect.driver == "psycopg"  # type: ignore[attr-defined]
