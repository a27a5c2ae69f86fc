"""`optuna-dashboard` on a shared study: what users watch a tuning in progress with.

The dashboard's own WSGI application is called in-process (the same app `optuna-dashboard URL`
serves), against the PostgreSQL study a tuning wrote."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

from optuna_dashboard import wsgi

from infertune_tuner.run import tune

from ..tuner_tests.helpers import request


def get(app: Any, path: str) -> Any:
    environ: dict[str, Any] = {
        "PATH_INFO": path,
        "REQUEST_METHOD": "GET",
        "wsgi.input": io.BytesIO(),
    }
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h, *_: status.append(s)))
    assert status[0].startswith("200"), (status, body[:300])
    return json.loads(body)


def test_the_dashboard_shows_the_tuning_study_with_its_trials(
    tmp_path: Path, postgres_url: str
) -> None:
    req = request(max_trials=5, quants=["fp8"])
    req = req.model_copy(update={"tuning": req.tuning.model_copy(update={"storage": postgres_url})})
    report = tune(req, backend="simulated", out_dir=tmp_path)
    assert report is not None
    app = wsgi(postgres_url)
    [summary] = get(app, "/api/studies")["study_summaries"]
    assert summary["study_name"].startswith("infertune-t-")
    study = get(app, f"/api/studies/{summary['study_id']}")
    trials = [t for t in study["trials"] if t["state"] == "Complete"]
    assert len(trials) == report.executed_trials
    # What a user looks at in the dashboard: each trial's configuration and tok/s/GPU.
    assert {p["name"] for p in trials[0]["params"]} == {"tp", "max_batch_size", "quantization",
                                                         "kv_cache_dtype"}  # fmt: skip
    assert all(t["values"][0] > 0 for t in trials)
    assert any(a["key"] == "config" for a in trials[0]["user_attrs"])
