"""Parallel tuning: 1, 2 and 4 worker processes of `infertune tune` on one study in PostgreSQL.

A real PostgreSQL server runs from the `pgserver` wheel (a dev dependency). Each worker is an
`infertune tune` process on the simulated pool; every trial takes the time it would take on the
GPUs (`trial_seconds`: server start, weight load, warm-up, measurement), scaled down by
`--time-scale` (INFERTUNE_SIMULATED_TIME_SCALE), so that workers overlap as they would on a
cluster. Times are printed in modelled minutes (wall seconds / time scale), measured from the
first trial's start.

Per scenario and worker count, medians over `--seeds` seeds:
- answer: when the study ended with its final best (chosen, confirmed, report written): how
  long a user waits for the result;
- first seen: when the configuration finally chosen was first measured;
- speed-ups against the 1-worker run of the same seed (median of the per-seed ratios);
- executed trials (confirmations included) and their ratio to the 1-worker run's, and
  duplicates: configurations measured more than once apart from one deliberate confirmation
  (must be 0; summed over seeds);
- quality: the chosen configuration's true (typical) tok/s/GPU relative to the 1-worker run's.

Goal: 4 workers reach the same quality >= 2.5x faster than 1 worker (the answer), with <= 1.5x
its executed trials and no duplicate.

    python benchmarks/parallel_tuning.py [--seeds 3] [--workers 1,2,4] [--time-scale 0.01]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import yaml

from infertune_operator.api.manifest import load_deployment
from infertune_operator.api.to_request import to_request
from infertune_tuner.backends.simulated import TIME_SCALE_ENV, SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.search.evidence import Decision

REPO = Path(__file__).resolve().parents[1]
INFERTUNE = Path(sys.executable).parent / "infertune"
SCENARIOS = {
    "llama2-70b-h100": REPO / "examples" / "llama2-70b-h100.yaml",
    "llama3-8b-l4": REPO / "examples" / "llama3-8b-l4.yaml",
    "mistral-7b-a10": REPO / "examples" / "mistral-7b-chat-a10.yaml",
}


@dataclass(frozen=True)
class Run:
    to_best_min: float
    to_end_min: float
    trials: int
    duplicates: int
    best: TrialConfig | None
    true_tps: float


def config_of(t: optuna.trial.FrozenTrial) -> TrialConfig:
    c = t.user_attrs["config"]
    return TrialConfig(c["tp"], c["max_batch_size"], c["quantization"], c["kv_cache_dtype"])


def _purpose(t: optuna.trial.FrozenTrial) -> str:
    """Why the sampler chose the trial (explore, confirm, ...)."""
    d = Decision.of(t)
    return d.purpose if d is not None else "explore"


def duplicates(trials: list[optuna.trial.FrozenTrial]) -> int:
    first = Counter(config_of(t) for t in trials if _purpose(t) != "confirm")
    confirms = Counter(config_of(t) for t in trials if _purpose(t) == "confirm")
    return sum(n - 1 for n in first.values()) + sum(n - 1 for n in confirms.values())


def one_run(server: str, spec: Path, workers: int, seed: int, scale: float, tmp: Path) -> Run:
    import psycopg

    db = f"b{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    url = server.replace("/postgres?", f"/{db}?", 1)
    doc = yaml.safe_load(spec.read_text())
    doc["spec"].setdefault("tuning", {}).update(
        {"storage": url, "seed": seed, "maxTrials": 40, "parallelism": 1}
    )
    run_spec = tmp / f"{db}.yaml"
    run_spec.write_text(yaml.safe_dump(doc))
    env = {**os.environ, TIME_SCALE_ENV: str(scale)}

    def worker(i: int) -> subprocess.Popen[str]:
        argv = [str(INFERTUNE), "tune", str(run_spec), "--backend", "simulated",
                "--out", str(tmp / f"{db}-{i}"), "--no-progress"]  # fmt: skip
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    procs = [worker(i) for i in range(workers)]
    for p in procs:
        out, _ = p.communicate()
        if p.returncode not in (0, 3):
            raise SystemExit(f"worker failed ({p.returncode}):\n{out}")
    [name] = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    trials = [t for t in study.get_trials() if "measurement" in t.user_attrs]
    reports = [tmp / f"{db}-{i}" / "report.json" for i in range(workers)]
    written = [r for r in reports if r.exists()]
    if len(written) != 1:
        raise SystemExit(f"{len(written)} reports written by {workers} workers (want exactly 1)")
    report = json.loads(written[0].read_text())
    start = min(t.datetime_start for t in trials if t.datetime_start is not None)

    def minutes(t: optuna.trial.FrozenTrial) -> float:
        assert t.datetime_complete is not None
        return (t.datetime_complete - start).total_seconds() / scale / 60

    best = None
    true_tps = 0.0
    to_best = max(minutes(t) for t in trials)
    if report["best"] is not None:
        c = report["best"]["config"]
        best = TrialConfig(c["tp"], c["max_batch_size"], c["quantization"], c["kv_cache_dtype"])
        to_best = min(minutes(t) for t in trials if config_of(t) == best)
        request = to_request(load_deployment(run_spec), default_backend="simulated")
        true_tps = (
            SimulatedBackend(request, seed=seed).typical(best).output_tokens_per_s_per_gpu or 0.0
        )
    return Run(
        to_best_min=to_best,
        to_end_min=max(minutes(t) for t in trials),
        trials=len(trials),
        duplicates=duplicates(trials),
        best=best,
        true_tps=true_tps,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--time-scale", type=float, default=0.01)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    import pgserver

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server on the way out
    base = Path(tempfile.mkdtemp(prefix="itpgb-"))
    os.chmod(base, 0o755)
    server = pgserver.get_server(base / "data", cleanup_mode="delete")
    try:
        uri = server.get_uri()
        print(f"time scale {args.time_scale}: 1 modelled minute = {60 * args.time_scale:.2f} s; "
              f"{args.seeds} seeds; times in modelled minutes from the first trial's start",
              flush=True)  # fmt: skip
        print(f"{'scenario':16} {'workers':>7} {'answer':>8} {'speed-up':>8} {'1st seen':>8} "
              f"{'speed-up':>8} {'trials':>6} {'ratio':>5} {'dups':>4} {'quality':>7}")  # fmt: skip
        goal_ok = True
        for scenario in args.scenarios.split(","):
            spec = SCENARIOS[scenario]
            runs: dict[int, list[Run]] = {w: [] for w in counts}
            for seed in range(args.seeds):
                for w in counts:
                    runs[w].append(one_run(uri, spec, w, seed, args.time_scale, base))
            base_runs = runs[counts[0]]
            for w in counts:
                rs = runs[w]
                pairs = list(zip(rs, base_runs, strict=True))

                def med(values: list[float]) -> float:
                    return statistics.median(values)

                answer = med([r.to_end_min for r in rs])
                seen = med([r.to_best_min for r in rs])
                speed_answer = med([b.to_end_min / r.to_end_min for r, b in pairs])
                speed_seen = med([b.to_best_min / r.to_best_min for r, b in pairs])
                trials = med([float(r.trials) for r in rs])
                ratio = med([r.trials / b.trials for r, b in pairs])
                dups = sum(r.duplicates for r in rs)
                quality = med([r.true_tps / b.true_tps if b.true_tps else 1.0 for r, b in pairs])
                print(f"{scenario:16} {w:7} {answer:7.1f}m {speed_answer:7.2f}x {seen:7.1f}m "
                      f"{speed_seen:7.2f}x {trials:6.1f} {ratio:5.2f} {dups:4} {quality:7.1%}",
                      flush=True)  # fmt: skip
                if w == 4:
                    goal_ok &= speed_answer >= 2.5 and ratio <= 1.5 and quality >= 0.98
                goal_ok &= dups == 0
        print(f"goal (4 workers: the answer >= 2.5x sooner at the same quality, <= 1.5x trials, "
              f"no duplicate): {'met' if goal_ok else 'NOT met'}")  # fmt: skip
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
