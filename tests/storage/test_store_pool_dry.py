"""A store whose connection pool runs dry names, in its log, the threads holding the
connections and where each is, so a holder that never gives one back can be found."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import storage.base as base
from domain.errors import StoreBusy
from storage.base import Database


def test_a_dry_pool_logs_the_threads_that_hold_its_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(base, "LEASE_TIMEOUT_S", 0.2)
    db = Database(tmp_path / "store.sqlite3", max_connections=1)
    leased = threading.Event()
    release = threading.Event()

    def hold_the_only_connection() -> None:
        with db.lease():
            leased.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_only_connection, name="the-holder")
    holder.start()
    try:
        assert leased.wait(10)
        with (
            caplog.at_level(logging.ERROR, logger="storage.base"),
            pytest.raises(StoreBusy, match="stayed in use"),
            db.lease(),
        ):
            pass
        text = caplog.text
        assert "held by the-holder" in text
        assert "leased at test_store_pool_dry.py" in text  # the call site that took it
        assert "hold_the_only_connection" in text  # where the holder is now
    finally:
        release.set()
        holder.join(10)
    with db.lease():  # given back: leased again at once
        pass
    db.close()
