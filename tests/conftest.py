"""Shared fixtures: repository paths, an in-process CLI runner, a real PostgreSQL server.

The PostgreSQL server (for shared-study tests) runs from the `pgserver` wheel, a dev
dependency, on a Unix socket in its data folder (nothing listens on TCP). As root (CI
containers) pgserver runs postgres as the system user `pgserver`, which it creates: postgres
itself refuses to run as root. A server that cannot start fails the tests that need it, never
skips them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infertune_tuner.request import TuningRequest

REPO = Path(__file__).resolve().parent.parent
# The tests never reach the Hugging Face Hub (a checkpoint's hf_quant_config.json is looked up
# there when a space is built for real trials): offline, such a lookup answers "unknown" at
# once instead of retrying a network that CI may not have. The download tests run the real
# client against a stand-in Hub (tests/runtime_tests/fake_hub.py) and switch this off.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
EXAMPLES = REPO / "examples"


@pytest.fixture
def repo() -> Path:
    return REPO


# Starts a command with SIGINT as at a terminal: a suite started in the background (`cmd &` in a
# script) hands its children SIGINT ignored, and Ctrl-C could not be tried. Reset by a Python
# that then becomes the command (exec: the same pid), not by Popen's preexec_fn: that runs
# Python in a fork of this process, where the gRPC threads earlier tests started leave state
# that aborts the child before it execs (SIGABRT, "epoll_wait error: Bad file descriptor").
_SIGINT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.fixture
def ctrl_c_reaches() -> Callable[[list[str]], list[str]]:
    """`argv` -> the command line that runs it with SIGINT at its default (see above)."""
    import sys

    return lambda argv: [sys.executable, "-c", _SIGINT_THEN_EXEC, *map(str, argv)]


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


TrialRequest = Callable[..., TuningRequest]


@pytest.fixture(scope="session")
def trial_request() -> TrialRequest:
    """A small request for trial-path tests: llama-3-8b on H100, ITL p50 <= 100 ms; keyword
    arguments set the workload's input/output tokens and the model's fields (uri, ...)."""

    def make(*, input_tokens: int = 64, output_tokens: int = 8, **model: Any) -> TuningRequest:
        return TuningRequest.model_validate({
            "name": "t", "model": {"name": "llama-3-8b", **model},
            "gpu": {"product": "H100-SXM-80GB"},
            "workload": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
        })  # fmt: skip

    return make


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a running PostgreSQL server (``postgresql://...``), for the whole session."""
    with warnings.catch_warnings():  # pgserver's lock file: /tmp when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
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
