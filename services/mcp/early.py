"""``engram mcp``'s first answer, before the MCP SDK is loaded.

A desktop MCP client starts ``engram mcp`` on every launch and waits for its reply to
``initialize``. Loading the SDK (its protocol types, its client and HTTP transports, which its
package imports whatever part one uses) takes longer than that wait should, so the command answers
``initialize`` from here — the standard library only — while a thread loads the SDK and Engram's
server, then hands the session to the SDK (``services/mcp/stdio.py``): the ``initialize`` request
is replayed to it, so its session is initialized as if it had read the request itself, and its
own reply to that request is dropped (it was answered; a reply that differs from the one sent is
logged).

The answer is the SDK's, recorded: ``initialize.json`` holds what the SDK answers for this server
(``python -m services.mcp.initialize_export`` writes it, ``make schema`` runs that, and
``tests/unit/test_mcp_early.py`` fails when it drifts from the SDK). A first message this module
is not sure of — not ``initialize``, a protocol version the record does not list, parameters of
another shape — is not answered here: the SDK reads it and answers, as without this module
(docs/adr/0092-commands-that-start-fast.md).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["INITIALIZE_RECORD", "EarlyStdio", "answer_for", "load_record"]

#: What the SDK answers ``initialize`` with, for each protocol version it negotiates.
INITIALIZE_RECORD = Path(__file__).resolve().parent / "initialize.json"


def load_record(path: Path = INITIALIZE_RECORD) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def answer_for(line: bytes, record: dict[str, Any]) -> dict[str, Any] | None:
    """The reply to ``line`` if it is an ``initialize`` request the SDK would answer with the
    recorded result (a listed protocol version, parameters of the shape the SDK takes), else None."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    if message.get("jsonrpc") != "2.0" or not _is_id(message.get("id")):
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    version, client = params.get("protocolVersion"), params.get("clientInfo")
    results = record["results"]
    if not isinstance(version, str) or version not in results:
        return None
    if not isinstance(params.get("capabilities"), dict):
        return None
    if not isinstance(client, dict) or not all(isinstance(client.get(k), str) for k in ("name", "version")):
        return None
    return {"jsonrpc": "2.0", "id": message["id"], "result": results[version]}


def _wire(message: dict[str, Any]) -> bytes:
    # As the SDK writes a message: compact JSON on one line, UTF-8.
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


@dataclass
class EarlyStdio:
    """The MCP wire (stdin and stdout) held by ``engram mcp`` from its start: private duplicates
    of fds 0 and 1, which then point at the null device and stderr — as the SDK's
    ``stdio_server`` does, so stray output of a library never lands on the wire."""

    stdin: BinaryIO
    stdout: BinaryIO
    #: The first line read, to replay to the SDK (``b""``: stdin was closed before one came).
    first_line: bytes = b""
    #: The reply sent to it here, if one was.
    answered: dict[str, Any] | None = None
    _restore: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def claim(cls) -> EarlyStdio:
        sys.stdout.flush()
        wire_in, wire_out = os.dup(0), os.dup(1)
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        os.dup2(2, 1)
        early = cls(os.fdopen(wire_in, "rb", closefd=False), os.fdopen(wire_out, "wb", closefd=False))
        early._restore = [(wire_in, 0), (wire_out, 1)]
        return early

    def answer_initialize(self, record_path: Path = INITIALIZE_RECORD) -> None:
        """Read the first message; answer it here if it is an ``initialize`` the record covers."""
        self.first_line = self.stdin.readline()
        if not self.first_line.strip():
            return
        try:
            record = load_record(record_path)
        except (OSError, ValueError, KeyError):  # no record: the SDK answers, only later
            return
        self.answered = answer_for(self.first_line, record)
        if self.answered is not None:
            self.stdout.write(_wire(self.answered))
            self.stdout.flush()

    def release(self) -> None:
        """Point fds 0 and 1 back at the wire (the process is ending)."""
        for private, fd in self._restore:
            try:
                os.dup2(private, fd)
            except OSError:
                continue
        self._restore = []
