"""Messages between Engram's own services (not for platforms, but still a versioned wire)."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import Field

from engram_client.contracts.common import Inbound, Principal
from engram_client.contracts.requests import SaveEntry

__all__ = ["AcceptedSave"]


class AcceptedSave(Inbound):
    """ingest → distill on ``engram.save.accepted``: a save whose caller was verified.

    ``org_id``, ``owner`` and ``requested_by`` come from the verified token, not the request.
    """

    schema_version: Literal[1] = 1
    request_id: UUID
    org_id: UUID
    agent_config_id: UUID
    owner: Principal
    session_id: str | None = None
    entries: list[SaveEntry] = Field(min_length=1, max_length=100)
    wait: bool = False
    requested_by: str
