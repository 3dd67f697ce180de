"""The service process's memory settings (shared/runtime/process_memory.py), each in a fresh interpreter:
they change process-wide state this test process must keep."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from shared.runtime.process_memory import ARENAS, GC_THRESHOLDS

#: Eight threads alive at once each malloc from C; glibc's malloc_stats() then lists one
#: "Arena N:" per arena on stderr.
_THREADS_MALLOC = """
import ctypes, sys, threading
from shared.runtime.process_memory import limit_malloc_arenas
capped = limit_malloc_arenas() if sys.argv[1] == "limit" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
together = threading.Barrier(8)
def work():
    together.wait()
    libc.malloc(4096)
    together.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(capped, flush=True)
libc.malloc_stats()
"""


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", _THREADS_MALLOC, mode], capture_output=True, text=True, env=environ, check=True
    )
    arenas = sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))
    return done.stdout.strip(), arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_the_process_caps_its_malloc_arenas_unless_the_operator_chose() -> None:
    assert _arenas("default") == ("False", 9)  # the main thread's and one per thread
    assert _arenas("limit") == ("True", ARENAS)
    assert _arenas("limit", MALLOC_ARENA_MAX="5") == ("False", 5)  # glibc applied theirs


def test_settling_the_heap_freezes_what_start_up_made() -> None:
    code = (
        "import gc, json; import shared.runtime.settings; "
        "from shared.runtime.process_memory import settle_heap; "
        "before = gc.get_freeze_count(); settle_heap(); "
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, frozen, thresholds = json.loads(done.stdout)
    assert before == 0
    assert frozen > 10_000  # the modules, classes and functions imported so far
    assert tuple(thresholds) == GC_THRESHOLDS
