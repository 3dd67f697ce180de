"""How a long-running service process (``engram up``, ``engram serve``) keeps its memory: glibc's
malloc arenas, set first thing, and Python's garbage collector, settled once start-up is done.

**Malloc arenas.** By default glibc gives threads their own arenas, up to eight per core. A service
process has many threads that allocate: Qdrant Edge's search pools (a pool per shard, recreated
as shards are built and swapped), the embedder's workers, asyncio's executor. Memory freed in an
arena stays with that arena, so anonymous memory crept up under steady load. ``MALLOC_ARENA_MAX``
would cap them, but glibc reads it once, at process start: an entry point would have to re-exec
itself, and every way of starting the process (the CLI, a container, a test) would have to
remember it. ``mallopt(M_ARENA_MAX)`` applies from the call on, so the process sets it for itself
before any thread allocates. An operator's ``MALLOC_ARENA_MAX`` wins. Other C libraries (musl,
macOS): nothing to do.

**Garbage collector.** Start-up leaves over a million objects behind (libraries, the embedding
model's tokenizer, routers, schemas), and the write path allocates fast: under load CPython ran a
full collection every ~3 s, each traversing all of them — 250 ms to 1.4 s with every thread
stopped, recall included (``make overload``: 13 s of a 150 s run). Freezing what start-up made
moves it out of the collector's sight (``gc.freeze``), and a larger young generation makes
collections rarer. Numbers: docs/benchmarks.md, "2026-12-01 — Overload
before and after".
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform

__all__ = ["ARENAS", "GC_THRESHOLDS", "limit_malloc_arenas", "settle_heap"]

log = logging.getLogger(__name__)

#: Arenas for the whole process: two keep allocation from contending on one lock while the loop
#: thread and a worker both allocate, without the per-thread arenas that hold on to freed memory.
ARENAS = 2
#: ``M_ARENA_MAX`` in glibc's ``malloc.h``.
_M_ARENA_MAX = -8
#: Young-generation size and how many collections of each generation trigger the next one
#: (CPython's defaults: 700, 10, 10). 50,000 objects between young collections keeps each one
#: short while running them ~70 times less often; older generations follow suit.
GC_THRESHOLDS = (50_000, 20, 10)


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


def settle_heap() -> None:
    """Once start-up is done: collect its garbage, freeze what is left (it lives as long as the
    process) so no later collection traverses it, and collect less often from now on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.debug("froze %d objects; gc thresholds %s", gc.get_freeze_count(), GC_THRESHOLDS)
