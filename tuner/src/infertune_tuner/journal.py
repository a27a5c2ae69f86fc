"""The study's home on disk: its output directory, its lock, and its journal kept readable.

One study, one budget. The default storage is an Optuna journal file in the output directory;
two runs appending to it would each spend the whole budget and measure the same configurations
twice. So a run holds an exclusive lock on the directory (``study.lock``, an ``fcntl.flock``)
for as long as it runs, and a second run refuses (exit 2) naming the holder: pid, host and start
time. The kernel drops the lock when its process dies, so a killed run leaves no stale lock: the
next run takes over at once. (Workers sharing one study go through an RDB storage URL instead.)

While it holds the lock a run also repairs what an interrupted write can leave behind: a last
journal line cut short (a full disk, a killed process) is moved aside into
``study.journal.cut-<time>`` (never deleted) so the journal loads again, and an Optuna write
lock left by a killed process is removed. Damage it cannot repair (junk or an unknown operation
in the middle, a folder where the journal should be) is an InputError that says how to start
afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from infertune_tuner.errors import InputError

JOURNAL = "study.journal"
LOCK = "study.lock"
OPTUNA_LOCK_SUFFIX = ".lock"  # JournalFileSymlinkLock's file beside the journal
# The journal's operation codes (optuna.storages.journal JournalOperation, 0 .. 10).
KNOWN_OP_CODES = frozenset(range(11))


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def prepare_out_dir(out_dir: Path) -> None:
    """Create the output directory, or say in one line why it cannot be used."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"output directory {out_dir}: exists and is not a directory") from None
    except OSError as exc:
        raise InputError(f"output directory {out_dir}: cannot create it: {_reason(exc)}") from None
    if not out_dir.is_dir():
        raise InputError(f"output directory {out_dir}: exists and is not a directory")


@dataclass
class StudyLock:
    """An exclusive hold on one output directory's study (see the module's docstring)."""

    path: Path
    notes: list[str] = field(default_factory=list)  # what was repaired, to tell the user
    _file: IO[str] | None = None

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # the lock goes with the descriptor anyway
                self._file.truncate(0)
            self._file.close()  # closing drops the flock
            self._file = None

    def __enter__(self) -> StudyLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(path: Path) -> str:
    try:
        info: Any = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"


def lock_study(out_dir: Path) -> StudyLock:
    """Take the study in ``out_dir`` for this process; InputError when another run holds it."""
    prepare_out_dir(out_dir)
    path = out_dir / LOCK
    try:
        fh = path.open("a+", encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"output directory {out_dir}: cannot write {path}: {_reason(exc)}"
        ) from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise InputError(
            f"{out_dir}: the study there is in use by {_holder(path)} (lock {path}); wait for "
            f"that run to finish, stop it, or give another --out"
        ) from None
    except OSError as exc:
        fh.close()
        raise InputError(f"{path}: cannot lock: {_reason(exc)}") from None
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    try:
        fh.seek(0)
        fh.truncate(0)
        fh.write(json.dumps(holder) + "\n")
        fh.flush()
    except OSError as exc:
        fh.close()
        raise InputError(f"{path}: cannot write: {_reason(exc)}") from None
    lock = StudyLock(path, _file=fh)
    try:
        lock.notes.extend(repair_journal(out_dir / JOURNAL))
    except BaseException:
        lock.release()
        raise
    return lock


def _fix(journal: Path) -> str:
    return f"move {journal} away (or give another --out) to start a new study"


def repair_journal(journal: Path) -> list[str]:
    """Make the journal loadable again where that loses nothing; say what was done.

    Call only while holding the study's lock: then no one else is writing it.
    """
    notes: list[str] = []
    stale = journal.with_name(journal.name + OPTUNA_LOCK_SUFFIX)
    if stale.is_symlink() or stale.exists():
        try:
            stale.unlink()
        except OSError as exc:
            raise InputError(
                f"{stale}: a stale journal lock cannot be removed: {_reason(exc)}"
            ) from None
        notes.append(f"removed the journal lock {stale} an interrupted run left behind")
    if not journal.exists() and not journal.is_symlink():
        return notes
    if not journal.is_file():
        raise InputError(f"{journal}: is not a regular file; {_fix(journal)}")
    try:
        data = journal.read_bytes()
    except OSError as exc:
        raise InputError(f"{journal}: cannot read: {_reason(exc)}") from None
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        aside = journal.with_name(f"{journal.name}.cut-{datetime.now(UTC):%Y%m%dT%H%M%S}")
        try:
            aside.write_bytes(data[keep:])
            with journal.open("r+b") as fh:
                fh.truncate(keep)
        except OSError as exc:
            raise InputError(f"{journal}: its last line was cut short and cannot be repaired: "
                             f"{_reason(exc)}") from None  # fmt: skip
        line = data.count(b"\n", 0, keep) + 1
        notes.append(
            f"{journal}:{line}: the last line was cut short (an interrupted write); moved it "
            f"to {aside} and resumed from the {line - 1} complete operations"
        )
        data = data[:keep]
    for number, raw in enumerate(data.splitlines(), start=1):
        problem = _line_problem(raw)
        if problem is not None:
            raise InputError(f"{journal}:{number}: {problem}; the study cannot be read; "
                             f"{_fix(journal)}")  # fmt: skip
    return notes


def _line_problem(raw: bytes) -> str | None:
    try:
        op = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "not a journal operation (not JSON)"
    if not isinstance(op, dict) or "op_code" not in op:
        return "not a journal operation (no op_code)"
    code = op["op_code"]
    if isinstance(code, bool) or code not in KNOWN_OP_CODES:
        return f"unknown operation code {code!r}"
    return None


def journal_storage(out_dir: Path) -> JournalStorage:
    """The journal storage of ``out_dir`` (locked and repaired by :func:`lock_study`), loaded
    once here so that damage Optuna cannot replay is an InputError, not a traceback."""
    journal = out_dir / JOURNAL
    try:
        storage = JournalStorage(JournalFileBackend(str(journal)))
        storage.get_all_studies()
    except OSError as exc:
        raise InputError(f"{journal}: cannot open: {_reason(exc)}") from None
    except Exception as exc:  # Optuna replays every operation: a malformed one raises anything
        raise InputError(
            f"{journal}: the study cannot be read ({exc!r}); {_fix(journal)}"
        ) from None
    return storage


def storage_fault(exc: BaseException) -> OSError | None:
    """The OSError (a full disk, a folder gone read-only) behind a failure of the study, if
    any: Optuna may end in an error of its own while handling one from the storage."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        if isinstance(node, OSError):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return None
