"""glibc malloc settings for the long-running service processes (``engram up``, ``engram serve``).

By default glibc gives threads their own malloc arenas, up to eight per core. A service process has
many threads that allocate: Qdrant Edge's search pools (a pool per shard, recreated as shards are
built and swapped), the embedder's workers, asyncio's executor. Memory freed in an arena stays
with that arena, so the process's anonymous memory crept up under steady load: ``make soak``
measured +23 MiB over four minutes with the default, +6 MiB with two arenas, flat after warm-up
(docs/decisions.md, "Resident size").

``MALLOC_ARENA_MAX`` would do the same but glibc reads it once, at process start: an entry point
would have to re-exec itself, and every way of starting the process (the CLI, a container, a test)
would have to remember it. ``mallopt(M_ARENA_MAX)`` applies from the call on, so the process sets
it for itself first thing, before any thread allocates. An operator's ``MALLOC_ARENA_MAX`` wins.
On other C libraries (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

__all__ = ["ARENAS", "limit_malloc_arenas"]

log = logging.getLogger(__name__)

#: Arenas for the whole process: two keep allocation from contending on one lock while the loop
#: thread and a worker both allocate, without the per-thread arenas that hold on to freed memory.
ARENAS = 2
#: ``M_ARENA_MAX`` in glibc's ``malloc.h``.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (unless ``MALLOC_ARENA_MAX`` is set); whether
    the cap was set. Call it at process start, before threads allocate: arenas already made stay."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    if libc.mallopt(_M_ARENA_MAX, arenas) != 1:
        log.warning("mallopt(M_ARENA_MAX, %d) failed; malloc keeps its default arenas", arenas)
        return False
    return True
