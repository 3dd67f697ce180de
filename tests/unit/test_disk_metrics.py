"""What shows a full disk coming (docs/adr/0099-full-disks.md): the free-space gauges read the
filesystem a store lives on, and the embedded nats-server's storage limit leaves a quarter of the
free space as headroom for JetStream's own files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shared.embedded.nats_server import STORE_SHARE_OF_FREE, NatsServerProcess, store_limit
from shared.observability.metrics import FILESYSTEM_FREE, FILESYSTEM_SIZE, set_filesystem


def test_free_space_gauges_read_the_stores_filesystem(tmp_path: Path) -> None:
    set_filesystem("postgres", str(tmp_path))
    stat = os.statvfs(tmp_path)
    free = FILESYSTEM_FREE.labels("postgres")._value.get()
    size = FILESYSTEM_SIZE.labels("postgres")._value.get()
    assert size == stat.f_blocks * stat.f_frsize
    assert 0 < free <= size
    # Free space moves while we look; the gauge is what statvfs said a moment ago.
    assert abs(free - stat.f_bavail * stat.f_frsize) < 64 * 2**20


def test_the_storage_limit_counts_what_is_stored_and_a_share_of_what_is_free(tmp_path: Path) -> None:
    store = tmp_path / "jetstream"
    (store / "streams").mkdir(parents=True)
    (store / "streams" / "1.blk").write_bytes(b"x" * 10_000)
    limit = store_limit(store)
    expected = 10_000 + int(shutil.disk_usage(store).free * STORE_SHARE_OF_FREE)
    assert abs(limit - expected) < 64 * 2**20  # the free space may move while we look
    assert limit < 10_000 + shutil.disk_usage(store).free  # headroom left for JetStream's files


def test_the_embedded_config_states_the_limit(tmp_path: Path) -> None:
    server = NatsServerProcess(tmp_path / "nats")
    conf = server._write_config().read_text()
    assert server.max_file_store > 0
    assert f"max_file_store: {server.max_file_store}\n" in conf
