"""`infertune export-replay`: a study's measurements as a replay table that `--backend
replay:` reads back, to re-tune offline under another SLO; and the sample table in examples/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner import replay_export
from infertune_tuner.backends.replay import COLUMNS, load_table, write_table
from infertune_tuner.backends.simulated import SimulatedBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement
from infertune_tuner.replay_export import export
from infertune_tuner.run import tune, write_report

from .helpers import request

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "replay"


def _invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _spec(tmp_path: Path, e2e_p95_ms: float) -> Path:
    """The quick start's request on a small space (12 configurations), every one measured."""
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["search"].update(tensorParallel=[2, 4, 8], maxBatchSize=[64, 128],
                                 quantization=["fp8"], kvCacheDtype=["auto", "fp8"])  # fmt: skip
    doc["spec"]["slo"] = {"e2eLatencyMs": {"p95": e2e_p95_ms}}
    path = tmp_path / f"spec-{e2e_p95_ms:g}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _rows(table: Path) -> dict[tuple[str, ...], dict[str, str]]:
    with table.open(newline="") as fh:
        return {
            (r["tp"], r["max_batch_size"], r["quantization"], r["kv_cache_dtype"]): r
            for r in csv.DictReader(fh)
        }


def test_export_then_retune_offline_with_another_slo(tmp_path: Path) -> None:
    out = tmp_path / "measured"
    code, stdout, _ = _invoke("tune", _spec(tmp_path, 25600), "--out", out, "--sampler", "grid",
                              "--no-progress")  # fmt: skip
    assert code in (0, 3), stdout
    code, stdout, stderr = _invoke("export-replay", out)
    assert code == 0, stderr
    table = Path(stdout.strip())
    assert table == out / "replay.csv"
    report = json.loads((out / "report.json").read_text())
    measured = [c for c in report["measured"] if c["state"] in ("complete", "oom")]
    rows = _rows(table)
    assert len(rows) == len(measured) and f"exported {len(rows)} configurations" in stderr
    # Under a looser SLO, offline: the best is the table's fastest row that meets it.
    loose = 40000.0
    expected = max(
        (r for r in rows.values() if r["status"] == "ok" and float(r["e2e_p95_ms"]) <= loose),
        key=lambda r: float(r["output_tokens_per_s_per_gpu"]),
    )
    again = tmp_path / "offline"
    code, stdout, _ = _invoke("tune", _spec(tmp_path, loose), "--backend", f"replay:{table}",
                              "--sampler", "grid", "--out", again, "--no-progress")  # fmt: skip
    assert code == 0, stdout
    best = json.loads((again / "report.json").read_text())["best"]
    cfg = best["config"]
    key = (str(cfg["tp"]), str(cfg["max_batch_size"]), cfg["quantization"], cfg["kv_cache_dtype"])
    assert rows[key] is expected
    assert best["metrics"]["output_tokens_per_s_per_gpu"] == float(
        expected["output_tokens_per_s_per_gpu"]
    )
    assert best["metrics"]["e2e_ms"]["p95"] == float(expected["e2e_p95_ms"])
    # Every replayed trial shows exactly the measurement the table holds.
    for t in json.loads((again / "report.json").read_text())["trials"]:
        c = t["config"]
        row = rows.get((str(c["tp"]), str(c["max_batch_size"]), c["quantization"],
                        c["kv_cache_dtype"]))  # fmt: skip
        if t["executed"] and t["metrics"] and row:
            assert t["metrics"]["itl_ms"]["p99"] == float(row["itl_p99_ms"])


def test_the_report_and_the_journal_export_the_same_table(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, _ = _invoke("tune", REPO / "examples" / "llama2-70b-h100.yaml", "--out", out,
                              "--no-progress")  # fmt: skip
    assert code == 0, stdout
    assert _invoke("export-replay", out / "report.json", "-o", tmp_path / "a.csv")[0] == 0
    assert _invoke("export-replay", out / "study.journal", "-o", tmp_path / "b.csv")[0] == 0
    a, b = _rows(tmp_path / "a.csv"), _rows(tmp_path / "b.csv")
    assert a.keys() == b.keys() and a
    for key in a:
        assert {k: v for k, v in a[key].items() if k != "concurrency"} == {
            k: v for k, v in b[key].items() if k != "concurrency"
        }
        assert float(a[key]["concurrency"]) == float(b[key]["concurrency"])
    # The configuration measured twice is one row: its repeats combined, as the search did.
    report = json.loads((out / "report.json").read_text())
    best = report["best"]
    assert best["repeats"] == 2
    c = best["config"]
    row = a[(str(c["tp"]), str(c["max_batch_size"]), c["quantization"], c["kv_cache_dtype"])]
    assert (
        float(row["output_tokens_per_s_per_gpu"]) == best["metrics"]["output_tokens_per_s_per_gpu"]
    )


def test_the_sample_table_retunes_its_example(tmp_path: Path) -> None:
    """examples/replay: real H100 measurements; replayed, the search finds their optimum
    (TP1 / batch 32 / fp8 / KV auto, 1158 tok/s/GPU: benchmarks/real-worlds/README.md)."""
    code, stdout, _ = _invoke(
        "tune", SAMPLE / "h100-llama2-13b.yaml",
        "--backend", f"replay:{SAMPLE / 'h100-llama2-13b.csv'}", "--out", tmp_path, "--no-progress",
    )  # fmt: skip
    assert code == 0, stdout
    assert stdout.startswith(
        "Best: TP1, max batch 32, fp8, KV auto -> 1158 output tok/s/GPU, meeting every SLO bound"
    )
    assert len(_rows(SAMPLE / "h100-llama2-13b.csv")) == 28


def test_what_cannot_be_exported_is_said(tmp_path: Path) -> None:
    code, _, stderr = _invoke("export-replay", tmp_path / "nope")
    assert code == 2 and f"error: {tmp_path / 'nope'}: no such file or folder" in stderr
    code, _, stderr = _invoke("export-replay", tmp_path)
    assert code == 2 and "holds neither report.json nor study.journal" in stderr
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a report"}')
    code, _, stderr = _invoke("export-replay", junk)
    assert code == 2 and f"error: {junk}: not an infertune report" in stderr
    # A study whose trials all failed has nothing to replay.
    doc = yaml.safe_load((REPO / "examples" / "llama2-70b-h100.yaml").read_text())
    doc["spec"]["search"].update(tensorParallel=[4, 8], quantization=["fp16"])
    doc["spec"]["tuning"]["backend"] = "triton"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "failed"
    code, stdout, _ = _invoke("tune", spec, "--backend", "triton", "--server-command", "false",
                              "--out", out, "--no-progress")  # fmt: skip
    assert code == 4, stdout
    code, _, stderr = _invoke("export-replay", out)
    assert code == 2 and "no trial measured anything; there is nothing to replay" in stderr
    assert "Traceback" not in stderr


NCCL = "NCCL error in: /src/nccl/init.cc:1234, unhandled system error (run with NCCL_DEBUG=INFO for details)"


class _Tp8Fails:
    """The simulated pool where every TP 8 configuration fails at load, as NCCL does."""

    name = "tp8-fails"
    speedup = 1.0

    def __init__(self, req) -> None:  # type: ignore[no-untyped-def]
        self.inner = SimulatedBackend(req, seed=0)

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        if config.tp == 8:
            return Measurement.failed("error", NCCL, "loading model")
        return self.inner.run(config, repeat=repeat)

    def close(self) -> None:
        self.inner.close()


def test_a_reason_with_commas_quotes_and_line_breaks_round_trips(tmp_path: Path) -> None:
    reason = 'Traceback:\n  File "x.py", line 3\nRuntimeError: max_batch_size 256, "limit" 128\r\n'
    cfg, other = TrialConfig(2, 64, "fp8", "fp8"), TrialConfig(4, 8, "bf16", "auto")
    table = tmp_path / "t.csv"
    write_table(table, {
        cfg: Measurement.failed("error", reason, "loading model"),
        other: Measurement.failed("oom", "CUDA out of memory"),
        TrialConfig(8, 8, "fp8", "auto"): Measurement.failed("error", ""),
    })  # fmt: skip
    back = load_table(table)
    assert back[cfg] == Measurement.failed("error", reason, "loading model")
    assert back[other] == Measurement.failed("oom", "CUDA out of memory")
    # No reason recorded: what the table says, as before the column existed.
    assert back[TrialConfig(8, 8, "fp8", "auto")].reason == "recorded as error in t.csv"


def test_a_table_without_the_reason_columns_replays_as_before(tmp_path: Path) -> None:
    table = tmp_path / "old.csv"
    table.write_text(",".join(COLUMNS) + "\n1,8,bf16,auto,error" + "," * 10 + "\n")
    m = load_table(table)[TrialConfig(1, 8, "bf16", "auto")]
    assert m == Measurement.failed("error", "recorded as error in old.csv")


def test_a_bad_phase_is_named_by_file_line_and_column(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    lead = "1,8,bf16,auto,error" + "," * 10 + ",,"  # through output_tokens_mean
    table.write_text(
        ",".join([*COLUMNS, "concurrency", "output_tokens_mean", "reason", "phase"]) + "\n"
        f'{lead},"one, two\nthree ""quoted""",compiling\n'
    )
    with pytest.raises(InputError) as err:
        load_table(table)
    # The reason spans lines 2-3: the phase cell starts on line 3, after `three "quoted"",`.
    assert str(err.value).startswith(f"{table}:3:19: phase: 'compiling' is not one of ")
    assert "loading model" in str(err.value)


def test_an_export_keeps_what_failed_with_its_reason_and_phase(tmp_path: Path) -> None:
    req = request(tps=[4, 8], batches=[16, 64], quants=["fp8"], sampler="grid", max_trials=8)
    report = tune(req, backend=_Tp8Fails(req), out_dir=tmp_path / "run")
    write_report(report, tmp_path / "run")
    for source in ("report.json", "study.journal"):
        found, _ = export(tmp_path / "run" / source, tmp_path / f"{source}.csv")
        rows = load_table(tmp_path / f"{source}.csv")
        failed = {c: m for c, m in rows.items() if m.status == "error"}
        assert failed and all(c.tp == 8 for c in failed), source
        assert all(m == Measurement.failed("error", NCCL, "loading model") for m in failed.values())
        assert all(m.status in ("ok", "oom") for c, m in rows.items() if c.tp == 4)
        assert f"{len(failed)} failed) from" in found.summary()


def test_what_an_export_leaves_out_of_a_failed_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A configuration that ran keeps its measured row; one that failed only transiently is left
    out (its next run may succeed); otherwise its last failure that says something is kept."""
    monkeypatch.setattr(replay_export, "is_transient", lambda m: "not ready" in (m.reason or ""))
    ok = Measurement.ok({}, output_tokens_per_s_per_gpu=900.0)
    kernel = Measurement.failed("error", "illegal memory access", "measuring")
    slow = Measurement.failed("error", "the server was not ready after 1800 s", "loading model")
    a, b, c = (
        TrialConfig(1, 8, "fp8", "auto"),
        TrialConfig(2, 8, "fp8", "auto"),
        TrialConfig(4, 8, "fp8", "auto"),
    )
    out = replay_export.Export(Path("x"))
    out.add_all({a: [kernel, ok], b: [slow], c: [kernel, slow]})
    assert out.rows == {a: ok, c: kernel}
    assert out.left_out == {"error": 1, "transient error": 2}
    assert out.summary() == (
        "2 configurations (1 measured, 0 out of memory, 1 failed) from x; left out trials: "
        "1 error, 2 transient error"
    )
