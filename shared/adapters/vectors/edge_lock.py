"""One process per Qdrant Edge store: an advisory lock beside the store's directory.

Qdrant Edge is a library: its shards are files that one process opens. Two processes on one store
would each keep their own live shard and builds, and each would see half of the writes. So the
process that opens a store first holds ``<store>.lock`` (``flock``, released by the kernel when
the process exits, however it exits), and any other process is refused at start-up with what to do
instead — run embed and recall in that one process, or share a Qdrant server.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["EdgeStoreInUse", "exclusive_edge_store"]


class EdgeStoreInUse(RuntimeError):
    """Another process holds this Qdrant Edge store; ``holder`` says which, as a user would
    call it (``a running `engram up` (pid 12)``)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def describe_holder(pid: str) -> str:
    """The process holding a store, named by its command line where the OS shows it."""
    try:
        argv = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return f"another process (pid {pid})"
    words = [Path(a.decode(errors="replace")).name for a in argv if a]
    if "engram" not in words:
        return f"another process (pid {pid})"
    command = " ".join(["engram", *words[words.index("engram") + 1 :]])
    return f"a running `{command[:80]}` (pid {pid})"


@contextmanager
def exclusive_edge_store(store: Path) -> Iterator[None]:
    """Hold ``store``'s lock for the duration, or raise :class:`EdgeStoreInUse` at once."""
    store.parent.mkdir(parents=True, exist_ok=True)
    lock = store.parent / f"{store.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        holder = describe_holder(pid)
        raise EdgeStoreInUse(
            f"the Qdrant Edge vector store {store} is held by {holder}. "
            "Edge is in-process and opens in one process only: run embed and recall together in that "
            "process (`engram serve embed recall`, or `engram up`), or give every process a Qdrant "
            "server with ENGRAM_VECTOR_STORE=http://qdrant:6333",
            holder,
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
