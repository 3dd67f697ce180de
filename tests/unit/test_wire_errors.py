"""A store's outage answers UNAVAILABLE (503, retryable), a bug INTERNAL (500): what the cluster
fault test showed requests getting while Postgres restarted."""

from __future__ import annotations

from asyncpg.exceptions import AdminShutdownError, CannotConnectNowError, CrashShutdownError, DiskFullError
from asyncpg.exceptions import InterfaceError as AsyncpgInterfaceError
from nats.js.errors import ServiceUnavailableError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from contracts.errors import NotFound
from shared.messaging.wire import dependency_down, error_reply


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def test_postgres_going_away_is_unavailable() -> None:
    """Refused, terminated, dropped connections — directly or as the cause — answer 503."""
    outages: list[BaseException] = [
        ConnectionRefusedError(111, "Connection refused"),
        AdminShutdownError("terminating connection due to administrator command"),
        CannotConnectNowError("the database system is shutting down"),
        InterfaceError("SELECT 1", {}, Exception("connection is closed"), connection_invalidated=True),
        _caused(RuntimeError("handler failed"), OperationalError("x", {}, ConnectionResetError())),
        CrashShutdownError("terminating connection because of crash of another server process"),
        _caused(RuntimeError("fetch failed"), AsyncpgInterfaceError("connection is closed")),
        PoolTimeout("QueuePool limit of size 5 overflow 0 reached, connection timed out"),
    ]
    for exc in outages:
        assert dependency_down(exc), exc
        assert error_reply(exc)["error"]["code"] == "UNAVAILABLE"
        assert error_reply(exc)["error"]["status"] == 503


def test_bugs_stay_internal_and_typed_errors_keep_their_code() -> None:
    """Anything else unexpected is INTERNAL without detail; an EngramError is its own code."""
    bug = error_reply(KeyError("secret-looking detail"))
    assert bug["error"]["code"] == "INTERNAL"
    assert "secret" not in str(bug)
    misuse = InterfaceError("x", {}, Exception("bad parameter"), connection_invalidated=False)
    assert not dependency_down(misuse)
    assert not dependency_down(
        AsyncpgInterfaceError("cannot perform operation: another operation is in progress")
    )
    assert error_reply(NotFound("no such entry"))["error"]["code"] == "NOT_FOUND"


def test_a_full_disk_is_unavailable_not_internal() -> None:
    """Postgres's "could not extend file: No space left on device" (SQLSTATE 53100), wrapped as
    SQLAlchemy wraps it, and JetStream out of storage ("insufficient resources", a 503 API error)
    answer 503: the write was refused whole and succeeds once space is freed (issue 25 §4)."""
    full = DiskFullError('could not extend file "base/16384/16418": No space left on device')
    wrapped = DBAPIError("INSERT INTO memory_entries ...", {}, full, connection_invalidated=False)
    jetstream_full = ServiceUnavailableError(code=503, err_code=10023, description="insufficient resources")
    for exc in (full, wrapped, _caused(RuntimeError("save failed"), wrapped), jetstream_full):
        assert dependency_down(exc), exc
        assert error_reply(exc)["error"]["code"] == "UNAVAILABLE"
