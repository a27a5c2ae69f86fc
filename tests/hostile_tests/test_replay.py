"""Hostile replay tables (class 6): `tune --backend replay:FILE` answers each with exit 2 and
``file:line:column``, never a traceback and never an `inf` winner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertune_tuner.backends.replay import COLUMNS

from .corpus import check, invoke, manifest, put

HEADER = ",".join(COLUMNS)
#        tp,bs,q,kv,status, ttft p50..p99, itl p50..p99, e2e p50..p99, tok/s/GPU
GOOD = "1,8,bf16,auto,ok,50,60,70,10,11,12,1500,1600,1700,900"
COL = {name: HEADER.split(",").index(name) for name in COLUMNS}


def row(**cells: str) -> str:
    values = GOOD.split(",")
    for name, value in cells.items():
        values[COL[name]] = value
    return ",".join(values)


def column_of(line: str, name: str) -> int:
    """The 1-based character column where ``name``'s cell starts in ``line``."""
    return sum(len(c) + 1 for c in line.split(",")[: COL[name]]) + 1


# (id, table text or bytes, fragment; "{col:NAME}" is replaced by NAME's column on line 2)
TABLES: list[tuple[str, str | bytes, str]] = [
    (
        "nan-throughput",
        row(output_tokens_per_s_per_gpu="nan"),
        ":2:{col:output_tokens_per_s_per_gpu}: output_tokens_per_s_per_gpu: must be a finite number",
    ),
    (
        "inf-throughput",
        row(output_tokens_per_s_per_gpu="inf"),
        ":2:{col:output_tokens_per_s_per_gpu}: output_tokens_per_s_per_gpu: must be a finite number",
    ),
    (
        "negative-throughput",
        row(output_tokens_per_s_per_gpu="-900"),
        ":2:{col:output_tokens_per_s_per_gpu}: output_tokens_per_s_per_gpu: must not be negative",
    ),
    (
        "text-throughput",
        row(output_tokens_per_s_per_gpu="fast"),
        "output_tokens_per_s_per_gpu: must be a number, not 'fast'",
    ),
    (
        "empty-throughput",
        row(output_tokens_per_s_per_gpu=""),
        "output_tokens_per_s_per_gpu: must be a number",
    ),
    (
        "nan-latency",
        row(ttft_p50_ms="nan"),
        ":2:{col:ttft_p50_ms}: ttft_p50_ms: must be a finite number",
    ),
    (
        "inf-latency",
        row(e2e_p99_ms="inf"),
        ":2:{col:e2e_p99_ms}: e2e_p99_ms: must be a finite number",
    ),
    ("minus-inf-latency", row(itl_p95_ms="-inf"), "itl_p95_ms: must be a finite number"),
    (
        "negative-latency",
        row(itl_p50_ms="-1"),
        ":2:{col:itl_p50_ms}: itl_p50_ms: must not be negative",
    ),
    (
        "p50-above-p99",
        row(e2e_p50_ms="2000"),
        ":2:{col:e2e_p95_ms}: e2e_p95_ms: e2e p95 (1600) is below p50 (2000)",
    ),
    ("p95-above-p99", row(ttft_p95_ms="80"), "ttft_p99_ms: ttft p99 (70) is below p95 (80)"),
    ("tp-zero", row(tp="0"), ":2:1: tp: must be at least 1"),
    ("tp-text", row(tp="two"), ":2:1: tp: must be a whole number, not 'two'"),
    ("tp-float", row(tp="1.5"), "tp: must be a whole number, not '1.5'"),
    ("batch-negative", row(max_batch_size="-8"), ":2:3: max_batch_size: must be at least 1"),
    ("quant-unknown", row(quantization="int3"), "quantization: 'int3' is not one of"),
    ("kv-unknown", row(kv_cache_dtype="fp4"), "kv_cache_dtype: 'fp4' is not one of"),
    ("status-unknown", row(status="maybe"), "status: 'maybe' is not one of ok, oom, error"),
    (
        "concurrency-nan",
        f"{HEADER},concurrency\n{GOOD},nan\n".encode(),
        "concurrency: must be a finite number",
    ),
    ("twice", GOOD + "\n" + GOOD, ":3:1: tp1/bs8/bf16/kv-auto appears twice"),
    ("short-row", "1,8,bf16,auto,ok,50", "ttft_p95_ms: must be a number"),
    (
        "bom",
        b"\xef\xbb\xbf" + f"{HEADER}\n{GOOD}\n".encode(),
        ":1:1: a byte-order mark (BOM) before the header",
    ),
    ("binary", f"{HEADER}\n".encode() + bytes(range(256)), ":2: binary content"),
    (
        "latin-1",
        f"{HEADER}\n".encode() + "1,8,bf16,auto,ok,caf\xe9".encode("latin-1"),
        ":2: not UTF-8 text",
    ),
    ("no-header", GOOD.encode(), ":1: missing columns"),
    ("empty", b"", ":1: missing columns tp"),
    ("header-only-missing", b"tp,max_batch_size\n1,8", "missing columns quantization"),
    ("unclosed-quote", '1,8,"bf16,auto,ok', ":2:5: quantization: 'bf16,auto,ok' is not one of"),
]


def _table(tmp_path: Path, content: str | bytes) -> Path:
    """Bytes are the whole file; text is data rows under the header."""
    path = tmp_path / "table.csv"
    path.write_bytes(content if isinstance(content, bytes) else f"{HEADER}\n{content}\n".encode())
    return path


@pytest.mark.parametrize(
    ("content", "fragment"), [c[1:] for c in TABLES], ids=[c[0] for c in TABLES]
)
def test_replay_table(tmp_path: Path, content: str | bytes, fragment: str) -> None:
    path = _table(tmp_path, content)
    if "{col:" in fragment:
        name = fragment.split("{col:")[1].split("}")[0]
        fragment = fragment.replace(f"{{col:{name}}}", str(column_of(GOOD, name)))
    out = tmp_path / "out"
    result = invoke(["tune", manifest(tmp_path), "--backend", f"replay:{path}", "--out", out,
                     "--no-progress"])  # fmt: skip
    check(result, 2, f"{path}{fragment}" if fragment.startswith(":") else fragment)
    assert not (out / "report.json").exists()


def test_replay_table_is_a_directory(tmp_path: Path) -> None:
    result = invoke(["tune", manifest(tmp_path), "--backend", f"replay:{tmp_path}", "--out",
                     tmp_path / "out", "--no-progress"])  # fmt: skip
    check(result, 2, "is a directory, not a CSV file")


def test_a_good_table_tunes_and_its_winner_is_finite(tmp_path: Path) -> None:
    path = _table(tmp_path, GOOD + "\n" + row(tp="2", output_tokens_per_s_per_gpu="700"))
    out = tmp_path / "out"
    spec = manifest(tmp_path, put("spec.search.maxBatchSize", [8]),
                    put("spec.search.quantization", ["bf16"]))  # fmt: skip
    result = invoke(["tune", spec, "--backend", f"replay:{path}", "--out", out, "--no-progress"])
    check(result, 0, "Best: TP1")
    best = json.loads((out / "report.json").read_text())["best"]
    assert best["metrics"]["output_tokens_per_s_per_gpu"] == 900
