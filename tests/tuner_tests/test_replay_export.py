"""`infertune export-replay`: a study's measurements as a replay table that `--backend
replay:` reads back, to re-tune offline under another SLO; and the sample table in examples/."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from infertune_operator.cli import app

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
