"""Hostile output folders and damaged studies (classes 2 and 3): exit 2 with the path and the
reason, or a repair that says what it did; never a traceback, never lost trials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infertune_tuner.journal import JOURNAL, LOCK

from .corpus import check, invoke, manifest, put


def tune(tmp_path: Path, out: Path | str, *extra: str) -> object:
    return invoke(["tune", manifest(tmp_path), "--out", out, "--no-progress", "--max-trials", "2",
                   *extra])  # fmt: skip


def first_run(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    check(tune(tmp_path, out), 0, "2 trials executed")  # type: ignore[arg-type]
    return out


# ---------------------------------------------------------------- --out that cannot be used


def test_out_is_a_file(tmp_path: Path) -> None:
    out = tmp_path / "file"
    out.write_text("x")
    check(tune(tmp_path, out), 2, f"output directory {out}: exists and is not a directory")  # type: ignore[arg-type]


def test_out_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    check(tune(tmp_path, out), 2, f"output directory {out}: cannot create it: Not a directory")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("out", "reason"),
    [
        ("/dev/null", "exists and is not a directory"),
        ("/dev/null/out", "cannot create it: Not a directory"),
        ("/proc/infertune-out", "cannot create it: No such file or directory"),
    ],
)
def test_out_in_special_places(tmp_path: Path, out: str, reason: str) -> None:
    if not Path("/proc/self").exists():
        pytest.skip("needs Linux /dev and /proc")
    check(tune(tmp_path, out), 2, f"output directory {out}: {reason}")  # type: ignore[arg-type]


def test_out_where_even_root_cannot_write(tmp_path: Path) -> None:
    out = Path("/sys/infertune-out")
    mounts = Path("/proc/mounts").read_text() if Path("/proc/mounts").exists() else ""
    if " /sys sysfs " not in mounts:  # sysfs takes no new entries, not even from root
        pytest.skip("needs a sysfs at /sys")
    check(tune(tmp_path, out), 2, f"output directory {out}: cannot create it: ")  # type: ignore[arg-type]
    assert not out.exists()


def test_an_rdb_storage_that_cannot_be_opened(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing/dir/study.db"
    result = invoke(["tune", manifest(tmp_path, put("spec.tuning.storage", url)), "--out",
                     tmp_path / "out", "--no-progress"])  # fmt: skip
    check(result, 2, f"spec.tuning.storage {url}: cannot open the study database")
    assert "unable to open database file" in result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_read_only(tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        check(tune(tmp_path, out), 2, f"cannot write {out / LOCK}: Permission denied")  # type: ignore[arg-type]
    finally:
        out.chmod(0o700)


def test_report_path_is_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "report.json").mkdir(parents=True)
    result = tune(tmp_path, out)
    check(result, 2, f"{out / 'report.json'}: cannot write: Is a directory")  # type: ignore[arg-type]


def _tune_until_the_disk_is_full(
    spec: object, out: Path, *, file_size_limit: int, trials: int
) -> None:
    """`infertune tune` where a file size limit makes every write past it fail (EFBIG) as a full
    disk does (ENOSPC): exit 2 with the reason, no traceback."""
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, {file_size_limit}))\n"
        "from infertune_operator.cli import main\n"
        "sys.argv = ['infertune', 'tune', sys.argv[1], '--out', sys.argv[2], '--no-progress',"
        f" '--max-trials', '{trials}']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(spec), str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot write: File too large" in proc.stderr


def test_full_disk_while_writing_the_report(tmp_path: Path) -> None:
    """The disk fills while the report is written (a file size limit past the journal's size:
    every report write beyond it fails, EFBIG, as a full disk does, ENOSPC): exit 2, no report
    in part, and the study survives."""
    out = tmp_path / "out"
    spec = manifest(tmp_path)
    # The journal of 2 trials takes ~7 KB, report.html ~56 KB.
    _tune_until_the_disk_is_full(spec, out, file_size_limit=20000, trials=2)
    assert sorted(p.name for p in out.iterdir() if "report" in p.name) == []  # none, no part
    # The study survived: the next run (disk freed) resumes it and repeats nothing.
    check(tune(tmp_path, out), 0, "2 of them by an earlier run")  # type: ignore[arg-type]


def test_full_disk_while_writing_the_journal(tmp_path: Path) -> None:
    """A file size limit makes every write past it fail (EFBIG) as a full disk does (ENOSPC)."""
    out = tmp_path / "out"
    spec = manifest(tmp_path)
    _tune_until_the_disk_is_full(spec, out, file_size_limit=6000, trials=4)
    # With room again, the study opens (a cut last line is moved aside) and finishes.
    result = invoke(["tune", spec, "--out", out, "--no-progress", "--max-trials", "4"])
    check(result, 0, "of them by an earlier run")


# ---------------------------------------------------------------- a damaged study


def test_a_cut_last_line_is_repaired_and_said(tmp_path: Path) -> None:
    out = first_run(tmp_path)
    journal = out / JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:-9])  # the disk filled mid-line
    result = invoke(["tune", manifest(tmp_path), "--out", out, "--max-trials", "3",
                     "--no-progress"])  # fmt: skip
    check(result, 0, "repaired:")
    assert f"{JOURNAL}:{len(lines)}: the last line was cut short" in result.output.replace(
        "\n", " "
    )
    aside = list(out.glob(f"{JOURNAL}.cut-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == lines[-1][:-9]  # kept, not deleted
    assert "3 trials executed" in result.output
    # Loadable for good: a further run appends after a whole line and reads everything back.
    check(invoke(["tune", manifest(tmp_path), "--out", out, "--max-trials", "3",
                  "--no-progress"]), 0, "3 of them by an earlier run")  # fmt: skip


JOURNAL_DAMAGE: list[tuple[str, bytes, str]] = [
    ("junk-line", b"this is not json\n", "not a journal operation (not JSON)"),
    ("unknown-op", b'{"op_code": 99, "worker_id": "w"}\n', "unknown operation code 99"),
    ("no-op-code", b'{"worker_id": "w"}\n', "not a journal operation (no op_code)"),
    ("a-list", b"[1, 2]\n", "not a journal operation (no op_code)"),
    ("bool-op", b'{"op_code": true}\n', "unknown operation code True"),
    ("binary", bytes(range(1, 10)) + b"\xff\xfe\n", "not a journal operation (not JSON)"),
    ("op-without-fields", b'{"op_code": 4, "worker_id": "w"}\n', "the study cannot be read"),
]


@pytest.mark.parametrize(("junk", "fragment"), [c[1:] for c in JOURNAL_DAMAGE],
                         ids=[c[0] for c in JOURNAL_DAMAGE])  # fmt: skip
def test_a_damaged_journal_is_exit_2_with_the_fix(
    tmp_path: Path, junk: bytes, fragment: str
) -> None:
    out = first_run(tmp_path)
    journal = out / JOURNAL
    before = journal.read_bytes()
    journal.write_bytes(before + junk + before.splitlines(keepends=True)[-1])
    result = tune(tmp_path, out)
    check(result, 2, fragment)  # type: ignore[arg-type]
    assert f"move {journal} away" in result.output.replace("\n", " ")  # type: ignore[attr-defined]
    assert journal.read_bytes() == before + junk + before.splitlines(keepends=True)[-1]  # untouched


def test_a_folder_in_place_of_the_journal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / JOURNAL).mkdir(parents=True)
    check(tune(tmp_path, out), 2, f"{out / JOURNAL}: is not a regular file")  # type: ignore[arg-type]


def test_a_folder_in_place_of_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / LOCK).mkdir(parents=True)
    check(tune(tmp_path, out), 2, f"cannot write {out / LOCK}: Is a directory")  # type: ignore[arg-type]


def test_a_stale_journal_lock_is_removed_and_said(tmp_path: Path) -> None:
    out = first_run(tmp_path)
    (out / f"{JOURNAL}.lock").symlink_to(out / "gone")  # Optuna's lock of a killed writer
    result = invoke(["tune", manifest(tmp_path), "--out", out, "--max-trials", "3",
                     "--no-progress"])  # fmt: skip
    check(result, 0, "removed the journal lock")
    assert not (out / f"{JOURNAL}.lock").is_symlink()


def test_the_lock_file_of_a_dead_run_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"pid": 999999, "host": "gone", "started": "then"}))
    check(tune(tmp_path, out), 0, "2 trials executed")  # type: ignore[arg-type]
    holder = (out / LOCK).read_text()
    assert holder == ""  # released: a finished run holds nothing
