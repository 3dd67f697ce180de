"""ingest's subscribers: the front door for platforms."""

from __future__ import annotations

from faststream.nats import NatsRouter

from contracts.events import SessionEnded
from contracts.operations import INGEST_SESSIONS, MEMORY_SAVE, SESSION_SUBMIT
from contracts.requests import Accepted, SaveOutcome, SaveRequest, SessionAccepted
from services.ingest.saves import handle_save
from services.ingest.sessions import handle_sessions_ended, submit_session
from shared.security.access import Caller
from shared.service.consumer import Batch, batch_consumer
from shared.service.edge import route
from shared.service.infra import Infra

__all__ = ["build_router"]


def build_router(infra: Infra) -> NatsRouter:
    router = NatsRouter()

    # Batches amortize the inbox transaction; the timeout bounds a lone session's wait. Bad input
    # is dead-lettered on its first delivery; what is redelivered failed on an outage (NATS,
    # Postgres), so it is retried until the outage ends rather than dropped.
    @batch_consumer(router, infra, INGEST_SESSIONS)
    async def on_sessions_ended(batch: Batch) -> None:
        await handle_sessions_ended(infra, batch)

    async def save(caller: Caller, request: SaveRequest) -> Accepted | SaveOutcome:
        """Elective save: answered 202 once durably accepted."""
        return await handle_save(infra, caller, request)

    async def submit(caller: Caller, session: SessionEnded) -> SessionAccepted:
        """A session over request-reply: checked before anything is stored, answered at once."""
        return await submit_session(infra, caller, session)

    infra.edge.serve_group("ingest", [route(MEMORY_SAVE, save), route(SESSION_SUBMIT, submit)])

    return router
