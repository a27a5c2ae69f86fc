"""A real PostgreSQL server for the shared-study tests (the `pgserver` wheel, a dev dependency).

pgserver runs the server from its wheel on a Unix socket in the data folder (nothing listens on
TCP). As root (CI containers) it runs postgres as the system user `pgserver`, which it creates:
postgres itself refuses to run as root. A server that cannot start fails the tests, never skips
them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a running PostgreSQL server (``postgresql://...``), for the whole session."""
    import pgserver

    # A short path: the Unix socket lives in the data folder and socket paths are short.
    base = Path(tempfile.mkdtemp(prefix="itpg-"))
    os.chmod(base, 0o755)  # postgres runs as another user when we are root
    server = pgserver.get_server(base / "data", cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server (one per test)."""
    import psycopg

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.replace("/postgres?", f"/{name}?", 1)
