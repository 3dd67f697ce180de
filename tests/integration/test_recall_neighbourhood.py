"""hybrid's neighbourhood and time grounding, through the real stack: saves in over NATS with a
session and a date, recall out."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from nats.aio.client import Client

from shared.service.infra import Infra
from tests.platform import eventually, request

pytestmark = pytest.mark.integration

BOB = {"kind": "end_user", "id": "bob"}
CAROL = {"kind": "actor", "id": "carol"}
NONE = {"kind": "none"}
#: A conversation whose second and third turns share no word with the cue below.
TRIP = (
    "We finally booked the flights to Lisbon.",
    "Which airline?",
    "TAP, leaving on the third of June.",
)
CUE = "Lisbon flights"


async def _save(
    nc: Client,
    token: str,
    agent: UUID,
    principal: dict[str, str],
    session: str | None,
    *texts: str,
    **fields: Any,
) -> list[str]:
    body: dict[str, Any] = {
        "agent_config_id": str(agent),
        "principal": principal,
        "wait": True,
        "entries": [{"text": t, "memory_type": "episodic", **fields} for t in texts],
    }
    if session is not None:
        body["session_id"] = session
    reply = await request(nc, "engram.memory.save", body, token)
    assert reply["status"] == 200, reply
    return list(reply["ids"])


async def _hybrid(
    nc: Client, token: str, agent: UUID, principal: dict[str, str], **fields: Any
) -> dict[str, Any]:
    body = {
        "agent_config_id": str(agent),
        "principal": principal,
        "strategy": "hybrid",
        "top_k": 10,
        **fields,
    }
    reply = await request(nc, "engram.recall", body, token)
    assert "error" not in reply, reply
    return reply


async def _indexed(nc: Client, token: str, agent: UUID, principal: dict[str, str], n: int) -> None:
    async def ready() -> bool:
        body = {"agent_config_id": str(agent), "principal": principal, "strategy": "semantic", "cue": CUE}
        return (await request(nc, "engram.recall", {**body, "top_k": 20}, token)).get("count") == n

    await eventually(ready, timeout=30, what=f"{n} entries indexed")


async def _configure(
    nc: Client, token: str, agent: UUID, semantic_recall: dict[str, Any], check: Any
) -> None:
    reply = await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"semantic_recall": semantic_recall}},
        token,
    )
    assert "error" not in reply, reply
    await eventually(check, what=f"{semantic_recall} applied")  # recall trusts a config for 1 s


async def test_a_hit_brings_the_turns_around_it_from_its_session(
    engram: Infra, nc: Client, agent: UUID, service_token: str
) -> None:
    """A hit that is a fragment brings the next turns of its session, though they share no word
    with the cue: the next at half the hit's score, the one after at a quarter; turns of another
    session do not come along; with ``neighbourhood`` off the config, they rank as no better than
    any other entry."""
    await _save(nc, service_token, agent, NONE, "trip", *TRIP)
    await _save(
        nc,
        service_token,
        agent,
        NONE,
        "office",
        "The printer upstairs jams on Mondays.",
        "Badges renew yearly.",
    )
    await _indexed(nc, service_token, agent, NONE, 5)
    reply = await _hybrid(nc, service_token, agent, NONE, cue=CUE, top_k=3)
    assert [r["text"] for r in reply["results"]] == list(TRIP)
    top, first, second = (r["score"] for r in reply["results"])
    assert first >= 0.5 * top
    assert second >= 0.25 * top

    async def off() -> bool:
        reply = await _hybrid(nc, service_token, agent, NONE, cue=CUE)
        scores = {r["text"]: r["score"] for r in reply["results"]}
        return scores[TRIP[0]] > 0.9 and scores.get(TRIP[2], 0.0) < 0.25 * scores[TRIP[0]]

    await _configure(nc, service_token, agent, {"neighbourhood": False}, off)


async def test_a_neighbour_is_never_an_entry_the_caller_could_not_see(
    engram: Infra, nc: Client, agent: UUID, service_token: str
) -> None:
    """A session is its owner's: an actor sees the shared pool too, but a shared entry saved
    between two of its turns under the same session id is not their neighbour (the actor's next
    turn is), and another user's entry there is never returned; an entry a filter or a
    session-scoped config leaves out never comes as a neighbour."""
    await _save(nc, service_token, agent, CAROL, "s1", TRIP[0])
    await _save(nc, service_token, agent, NONE, "s1", "The shared drive moved to the new server.")
    await _save(nc, service_token, agent, BOB, "s1", "Bob's bank PIN hint is the dog's name.")
    await _save(nc, service_token, agent, CAROL, "s1", TRIP[1])
    await _save(nc, service_token, agent, CAROL, "s1", TRIP[2], memory_type="fact")
    await _save(nc, service_token, agent, CAROL, "s2", "Dentist appointment moved to Friday.")
    await _indexed(nc, service_token, agent, CAROL, 5)

    async def scores() -> dict[str, float]:
        reply = await _hybrid(nc, service_token, agent, CAROL, cue=CUE)
        return {r["text"]: r["score"] for r in reply["results"]}

    with_neighbours = await scores()
    assert "Bob's bank PIN hint is the dog's name." not in with_neighbours
    alone: dict[str, float] = {}

    async def off() -> bool:
        alone.update(await scores())
        return alone[TRIP[1]] < with_neighbours[TRIP[1]]

    await _configure(nc, service_token, agent, {"neighbourhood": False}, off)
    top = alone[TRIP[0]]  # the hit's own score
    gain = {text: with_neighbours[text] - alone[text] for text in alone}
    # The hit gains from its own neighbours' (small) scores too.
    assert gain[TRIP[0]] == pytest.approx(max(0.5 * alone[TRIP[1]], 0.25 * alone[TRIP[2]]), abs=1e-4)
    assert gain[TRIP[1]] >= 0.5 * top - 1e-4  # next to the hit: the shared entry in between is skipped
    assert gain[TRIP[2]] >= 0.25 * top - 1e-4
    assert gain["The shared drive moved to the new server."] == pytest.approx(0.0, abs=1e-4)

    await _configure(nc, service_token, agent, {"neighbourhood": True}, lambda: _back_on(scores, TRIP[1]))
    filtered = await _hybrid(nc, service_token, agent, CAROL, cue=CUE, filters={"memory_types": ["episodic"]})
    assert TRIP[2] not in [r["text"] for r in filtered["results"]]

    async def session_scoped() -> bool:
        reply = await _hybrid(nc, service_token, agent, CAROL, cue=CUE, session_id="s2")
        return [r["text"] for r in reply["results"]] == ["Dentist appointment moved to Friday."]

    body = {"agent_config_id": str(agent), "config": {"scope": "session"}}
    assert "error" not in await request(nc, "engram.config.put", body, service_token)
    await eventually(session_scoped, what="a session-scoped recall of s2 sees only s2, no neighbour of s1")


async def _back_on(scores: Any, text: str) -> bool:
    return (await scores())[text] > 0.4


async def test_a_cue_that_names_a_date_puts_what_happened_then_first(
    engram: Infra, nc: Client, agent: UUID, service_token: str
) -> None:
    """Entries carry when they happened (``occurred_at``); a cue naming that day ranks them first,
    a cue naming no date ranks by relevance alone, and ``time_grounding`` off the config ignores
    the date."""
    await _save(
        nc,
        service_token,
        agent,
        NONE,
        None,
        "Lisbon flights were cancelled.",
        occurred_at="2022-05-25T15:00:00Z",
    )
    await _save(nc, service_token, agent, NONE, None, "Lisbon flights Lisbon flights booked again.")
    await _indexed(nc, service_token, agent, NONE, 2)
    dated_cue = "What happened to the Lisbon flights on 25 May, 2022?"
    dated = await _hybrid(nc, service_token, agent, NONE, cue=dated_cue)
    assert dated["results"][0]["text"] == "Lisbon flights were cancelled."
    # With one place, the dated entry is lifted from below the relevance ranking's first: it is
    # read whole after grounding (it was neither a winner nor a winner's neighbour before).
    (only,) = (await _hybrid(nc, service_token, agent, NONE, cue=dated_cue, top_k=1))["results"]
    assert (only["text"], only["memory_type"]) == ("Lisbon flights were cancelled.", "episodic")
    plain = await _hybrid(nc, service_token, agent, NONE, cue="Lisbon flights")
    assert plain["results"][0]["text"] == "Lisbon flights Lisbon flights booked again."

    async def off() -> bool:
        reply = await _hybrid(nc, service_token, agent, NONE, cue="Lisbon flights on 25 May, 2022")
        return reply["results"][0]["text"] == "Lisbon flights Lisbon flights booked again."

    await _configure(nc, service_token, agent, {"time_grounding": False}, off)
