"""Start-up benchmark (``make bench``): how long the ``engram`` commands take as whole processes,
as a user meets them — ``engram --help``, every command that only talks to a running deployment
(against a live ``engram up`` on a scratch data dir), and ``engram mcp`` on stdio from launch to
its reply to the first ``tools/list`` after ``initialize`` — a server that can be used, what a
desktop MCP client waits for on every launch (its reply to ``initialize`` is timed too, beside
it). Each is run ``--runs`` times (default 7), interleaved command by command, so all see the same
load; the table gives the median and the max against the targets (issue 24: 0.5 s, and 1 s for
``engram mcp``), and the median CPU time (user + system) of the process — for ``engram mcp`` up to
its ``tools/list`` reply: on a loaded machine the wall time is mostly waiting for a CPU, which the
CPU time is not.

Results go to ``bench-results/startup.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.bench import measure
from tests.engram_up import ENGRAM, EngramUp, clean_env, cli, stack_dir

#: Seconds: a command that only talks to a running deployment, and ``engram mcp``'s first answer.
TARGET_S = 0.5
TARGET_MCP_S = 1.0

#: The commands timed against the live stack; ``{dir}`` is its data dir.
COMMANDS: dict[str, list[str]] = {
    "engram --help": ["--help"],
    "engram recall": ["recall", "--data-dir", "{dir}"],
    "engram config get": ["config", "get", "--data-dir", "{dir}"],
    "engram audit verify": ["audit", "verify", "--data-dir", "{dir}"],
    "engram export": ["export", "--actor", "none", "--data-dir", "{dir}"],
    "engram dlq": ["dlq", "--data-dir", "{dir}"],
    "engram token mint": ["token", "mint", "--kind", "none", "--data-dir", "{dir}"],
    "engram console": ["console", "--data-dir", "{dir}"],
}

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "startup-bench", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
#: The row ``engram mcp`` is judged by, and the one beside it.
MCP = "engram mcp (to tools/list)"
MCP_INITIALIZE = "engram mcp (to initialize)"
_TARGETS: dict[str, float | None] = {MCP: TARGET_MCP_S, MCP_INITIALIZE: None}


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(args: list[str]) -> tuple[float, float]:
    """Seconds from launch to exit, and the CPU seconds the process used (a failing command fails
    the benchmark: it measured nothing)."""
    cpu = _cpu_of_children()
    started = time.perf_counter()
    done = subprocess.run([str(ENGRAM), *args], capture_output=True, timeout=60, env=clean_env(), check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"engram {' '.join(args)} exited {done.returncode}: {done.stderr[-1000:]!r}")
    return elapsed, _cpu_of_children() - cpu


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) the live process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reply(proc: subprocess.Popen[bytes], request_id: int, method: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    reply = json.loads(line)
    if reply.get("id") != request_id or "result" not in reply:
        raise RuntimeError(f"engram mcp answered {method} with {line[:500]!r}")


def time_mcp(data_dir: Path, token: str) -> tuple[float, float, float]:
    """Seconds from launching ``engram mcp`` to its reply to ``initialize``, and to its reply to
    the ``tools/list`` sent right after it; and the CPU seconds it had used by then."""
    env = {**clean_env(), "ENGRAM_TOKEN": token}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(ENGRAM), "mcp", "--data-dir", str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
        proc.stdin.flush()
        _reply(proc, 1, "initialize")
        initialized = time.perf_counter() - started
        for message in (INITIALIZED, TOOLS_LIST):
            proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        _reply(proc, 2, "tools/list")
        usable = time.perf_counter() - started
        return initialized, usable, _cpu_of(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


def _summary(seconds: list[float], target: float | None, cpu: list[float]) -> dict[str, Any]:
    return {
        "n": len(seconds),
        "median_s": round(statistics.median(seconds), 3),
        "max_s": round(max(seconds), 3),
        "target_s": target,
        "runs_s": [round(s, 3) for s in seconds],
        "cpu_median_s": round(statistics.median(cpu), 3) if cpu else None,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in [*COMMANDS, MCP, MCP_INITIALIZE]}
    cpu: dict[str, list[float]] = {name: [] for name in times}
    with stack_dir() as root:
        data_dir = root / "data"
        with EngramUp(data_dir, root / "up.log") as up:
            await up.connection()
            await up.wait_for_output("Engram is up", timeout=120)
            token = cli(
                "token", "mint", "--kind", "end_user", "--id", "bench", "--data-dir", str(data_dir)
            ).stdout.strip()
            machine: dict[str, Any] = {**measure.machine(), "load_avg_before": measure.load_average()}
            for _ in range(args.runs):
                for name, argv in COMMANDS.items():
                    wall, used = time_command([a.replace("{dir}", str(data_dir)) for a in argv])
                    times[name].append(wall)
                    cpu[name].append(used)
                initialized, usable, used = time_mcp(data_dir, token)
                times[MCP_INITIALIZE].append(initialized)
                times[MCP].append(usable)
                cpu[MCP].append(used)
            machine["load_avg_after"] = measure.load_average()
    return {
        "machine": machine,
        "commands": {
            name: _summary(seconds, _TARGETS.get(name, TARGET_S), cpu[name])
            for name, seconds in times.items()
        },
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "| command | median s | max s | target s | within | CPU median s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, row in results["commands"].items():
        target = row["target_s"]
        ok = "—" if target is None else "yes" if row["median_s"] <= target else "**no**"
        cpu = row.get("cpu_median_s") or "—"
        lines.append(f"| `{name}` | {row['median_s']} | {row['max_s']} | {target or '—'} | {ok} | {cpu} |")
    lines.append("")
    lines.append(measure.machine_note(results["machine"]))
    return "\n".join(lines)


def main() -> None:
    parser = measure.bench_parser(__doc__, "bench-results/startup.json")
    parser.add_argument("--runs", type=int, default=7, help="runs of each command")
    measure.run_bench(parser, run, render)


if __name__ == "__main__":
    main()
