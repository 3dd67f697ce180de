"""Whatever a caller types as a cue, recall answers 200 or a typed 4xx, never INTERNAL: a cue without
a word for the lexical leg ("x", "C++", "a b") is searched by vectors alone, and a cue without a
letter or digit ("?") falls back to the config's strategy with a warning."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from shared.service.infra import Infra
from tests.platform import eventually, request

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
CUE_STRATEGIES = ("pack", "semantic", "hybrid", None)  # None: the default, hybrid for a cue
TEXTS = ("C++ builds fail without the x64 toolchain.", "Refund order A-1042 was declined.")


@pytest.fixture(scope="module")
def seeded() -> dict[str, Any]:
    """One organization and agent config for every example (filled by the first test that needs it)."""
    return {}


async def _recall(nc: Client, token: str, agent: UUID, cue: str, strategy: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent_config_id": str(agent), "principal": ALICE, "cue": cue}
    if strategy is not None:
        body["strategy"] = strategy
    return await request(nc, "engram.recall", body, token, timeout=30)


async def _memory(nc: Client, token: str) -> UUID:
    agent = uuid4()
    body = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": ALICE,
        "entries": [{"text": t, "importance": 0.5, "memory_type": "fact"} for t in TEXTS],
    }
    assert (await request(nc, "engram.memory.save", body, token))["status"] == 200

    async def indexed() -> bool:
        reply = await _recall(nc, token, agent, "toolchain builds", "semantic")
        return reply.get("count") == len(TEXTS)

    await eventually(indexed, timeout=60, what="entries indexed")
    return agent


@pytest.mark.parametrize("cue", ["x", "1", "I", "a b", "C++", "x64"])
async def test_a_cue_without_a_lexical_word_is_searched_by_vectors(
    engram: Infra, nc: Client, service_token: str, cue: str
) -> None:
    agent = await _memory(nc, service_token)
    reply = await _recall(nc, service_token, agent, cue, "hybrid")
    assert "error" not in reply, reply
    assert reply["strategy"] == "hybrid"
    assert reply["count"] == len(TEXTS)  # found by the vector leg
    assert "cue_without_content_fallback" not in reply["warnings"]


@pytest.mark.parametrize("strategy", ["semantic", "hybrid", None])
@pytest.mark.parametrize("cue", ["?", "!", "...", "¿¡"])
async def test_a_cue_without_letters_or_digits_falls_back_with_a_warning(
    engram: Infra, nc: Client, service_token: str, agent: UUID, cue: str, strategy: str | None
) -> None:
    put = {"agent_config_id": str(agent), "config": {"top_k": 10}}  # a known agent config, defaults
    assert "error" not in await request(nc, "engram.config.put", put, service_token)
    reply = await _recall(nc, service_token, agent, cue, strategy)
    assert "error" not in reply, reply
    assert reply["strategy"] == "last_k"  # the config's default strategy
    assert "cue_without_content_fallback" in reply["warnings"]


@pytest.mark.parametrize("cue", ["\x00refund", "refund \ud800 order", "\udfff", "\x00"])
async def test_nul_and_lone_surrogates_answer_without_internal(
    engram: Infra, nc: Client, service_token: str, cue: str
) -> None:
    agent = await _memory(nc, service_token)
    for strategy in CUE_STRATEGIES:
        reply = await _recall(nc, service_token, agent, cue, strategy)
        if "error" in reply:
            assert reply["error"]["code"] == "INVALID_REQUEST", reply
        else:
            assert isinstance(reply["count"], int), reply


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    # Any code point, lone surrogates included (JSON can carry them as \\ud800 escapes).
    cue=st.text(alphabet=st.characters(exclude_categories=()), min_size=1, max_size=2000),
    strategy=st.sampled_from(CUE_STRATEGIES),
)
async def test_any_cue_answers_ok_or_a_typed_client_error(
    engram: Infra, nc: Client, service_token: str, seeded: dict[str, Any], cue: str, strategy: str | None
) -> None:
    if "agent" not in seeded:
        seeded["agent"] = await _memory(nc, service_token)
    reply = await _recall(nc, service_token, seeded["agent"], cue, strategy)
    if "error" in reply:
        assert 400 <= reply["error"]["status"] < 500, reply
    else:
        assert isinstance(reply["count"], int), reply
