"""The study's storage: what a user sees when the database URL is wrong, and that the password
never shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune_tuner.errors import InputError
from infertune_tuner.journal import lock_study
from infertune_tuner.storage import HEARTBEAT_ENV, heartbeat, mask_url, open_storage

URL = "postgresql://tuner:s3cret@127.0.0.1:1/optuna"  # nothing listens on port 1


def test_the_password_is_masked() -> None:
    assert mask_url(URL) == "postgresql://tuner:***@127.0.0.1:1/optuna"
    assert mask_url("not a url") == "<unparsable storage URL>"


def test_an_unreachable_database_is_a_clear_error_without_the_password(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        open_storage(URL, tmp_path)
    message = str(err.value)
    assert "cannot open the study database" in message and "127.0.0.1:1" in message
    assert "s3cret" not in message


def test_a_missing_driver_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"driver is missing \(MySQLdb\)") as err:
        open_storage("mysql://u:s3cret@127.0.0.1:1/x", tmp_path)
    assert "s3cret" not in str(err.value)


def test_no_url_is_the_journal_in_the_output_folder(tmp_path: Path) -> None:
    with lock_study(tmp_path / "out"):  # a run holds the folder before it opens the journal
        open_storage(None, tmp_path / "out")
    assert (tmp_path / "out" / "study.journal").exists()


def test_heartbeat_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HEARTBEAT_ENV, "2")
    beat, grace = heartbeat()
    assert beat == 2 and grace > beat
    monkeypatch.setenv(HEARTBEAT_ENV, "soon")
    with pytest.raises(InputError, match=HEARTBEAT_ENV):
        heartbeat()
