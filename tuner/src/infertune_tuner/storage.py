"""Where the study lives, and how several worker processes share it.

- No storage URL: an Optuna journal file in the output directory (one process; its worker
  threads share it).
- An RDB URL (``postgresql://...``): Optuna's RDB storage, shared by every ``infertune tune``
  process given the same request and URL: they are workers of one study. Each running trial
  sends a heartbeat; a trial whose worker died (pod evicted, node lost, process killed) goes
  stale after the grace period, another worker marks it failed and re-runs the same
  configuration (Optuna's ``RetryHeartbeatStaleTrialCallback``).

What must not race between workers - choosing the next configuration and counting it against
the budget, deciding who writes the report - happens under :class:`ClaimLock`: a thread lock
inside one process, plus a PostgreSQL advisory lock (or MySQL's ``GET_LOCK``) across processes.

A storage URL may carry a password: :func:`mask_url` is what logs, errors and reports show.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.storages import (
    BaseStorage,
    RDBStorage,
    RetryHeartbeatStaleTrialCallback,
)
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from infertune_tuner.env import positive_int
from infertune_tuner.errors import InputError
from infertune_tuner.journal import journal_storage

# A running trial beats every HEARTBEAT_S; one silent for GRACE_S is stale and re-run elsewhere.
# Overridable (tests, clusters with slow networks) through the environment.
HEARTBEAT_ENV, GRACE_ENV = "INFERTUNE_HEARTBEAT_SECONDS", "INFERTUNE_HEARTBEAT_GRACE_SECONDS"
HEARTBEAT_S, GRACE_S = 30, 120
MAX_RETRY = 2  # re-runs of one configuration whose workers keep dying


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (what may be shown anywhere)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable storage URL>"


def is_shared(storage: str | None) -> bool:
    """True when the study lives in an RDB that other worker processes can join."""
    return bool(storage)


def _seconds(name: str, default: int) -> int:
    value = positive_int(os.environ, name, "seconds")
    return default if value is None else value


def heartbeat() -> tuple[int, int]:
    """(heartbeat interval, grace period) in seconds."""
    beat = _seconds(HEARTBEAT_ENV, HEARTBEAT_S)
    return beat, max(_seconds(GRACE_ENV, max(GRACE_S, 2 * beat)), beat + 1)


def open_storage(url: str | None, out_dir: Path) -> BaseStorage:
    """The study's storage: the journal in `out_dir`, or the RDB at `url` with heartbeats.

    Raises:
        InputError: the URL cannot be parsed, its driver is not installed, or the database
            cannot be reached (the message shows the URL without its password).
    """
    if not url:  # journal.lock_study holds the folder and repairs the journal first
        return journal_storage(out_dir)
    beat, grace = heartbeat()
    try:
        # Workers starting together on an empty database would race to create Optuna's tables.
        with _schema_lock(url), warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # heartbeats: we rely on them
            return RDBStorage(
                url,
                engine_kwargs={"pool_pre_ping": True},
                heartbeat_interval=beat,
                grace_period=grace,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    max_retry=MAX_RETRY
                ),
            )
    except ImportError as exc:
        raise InputError(
            f"spec.tuning.storage {mask_url(url)}: the database driver is missing ({exc.name or exc}); "
            "for postgresql:// URLs install infertune[postgres]"
        ) from None
    except Exception as exc:  # SQLAlchemy's errors carry the URL: say it without the password
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"spec.tuning.storage {mask_url(url)}: cannot open the study database: {_scrub(detail, url)}"
        ) from None


@contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Hold PostgreSQL's advisory lock for creating the schema (other databases: no lock)."""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        if engine.dialect.name != "postgresql":
            yield
            return
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _SCHEMA_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _SCHEMA_KEY})
                conn.commit()
    finally:
        engine.dispose()


_SCHEMA_KEY = int.from_bytes(hashlib.sha256(b"infertune:schema").digest()[:8], "big", signed=True)


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose worker stopped beating (each is queued to run again)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _scrub(message: str, url: str) -> str:
    try:
        password = make_url(url).password
    except (ArgumentError, ValueError):
        return message
    return message.replace(str(password), "***") if password else message


class ClaimLock:
    """Serialises claims on one study across threads and, on an RDB, across processes."""

    def __init__(self, storage: BaseStorage | None, study_name: str = "") -> None:
        self._local = threading.Lock()
        self._engine: Any = storage.engine if isinstance(storage, RDBStorage) else None
        digest = hashlib.sha256(f"infertune:{study_name}".encode()).digest()
        self._key = int.from_bytes(digest[:8], "big", signed=True)  # a bigint lock id
        self._name = f"infertune-{digest[:16].hex()}"

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._local:
            if self._engine is None:
                yield
                return
            dialect = self._engine.dialect.name
            with self._engine.connect() as conn:
                if dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
                    try:
                        yield
                    finally:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                        conn.commit()
                elif dialect in ("mysql", "mariadb"):
                    conn.execute(text("SELECT GET_LOCK(:n, -1)"), {"n": self._name})
                    try:
                        yield
                    finally:
                        conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self._name})
                        conn.commit()
                else:  # SQLite and others: one process at a time is all they promise
                    yield


def storage_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an Optuna RDB storage here, or None: it must parse as a database
    URL, name a dialect SQLAlchemy knows, and that dialect's driver must be importable."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return f"{url!r} is not a database URL (dialect[+driver]://user:password@host/db)"
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        return f"unknown database dialect {parsed.drivername!r} in the storage URL"
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        return (
            f"the storage URL's driver for {parsed.drivername!r} is not installed "
            f"(cannot import {exc.name or exc}); install it or name an installed driver"
        )
    return None
