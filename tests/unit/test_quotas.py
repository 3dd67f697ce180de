"""Token buckets per organization, token and operation class (shared.runtime.quotas), in-process: the
arithmetic on a clock the test moves, and which operations spend which budget."""

from __future__ import annotations

from uuid import uuid4

import pytest
from pydantic import ValidationError

from contracts.errors import RateLimited
from contracts.operations import MEMORY_PURGE, MEMORY_SAVE, OPERATIONS, OPS_LAG, RECALL, SESSION_SUBMIT
from shared.runtime.quotas import Limit, Quotas, QuotaSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quotas(clock: Clock, **settings: object) -> Quotas:
    return Quotas(QuotaSettings.model_validate(settings), clock=clock)


async def test_a_burst_then_the_rate_with_a_retry_hint() -> None:
    clock = Clock()
    q = quotas(clock, org={"read": {"rate": 2, "burst": 3}})
    org = uuid4()
    for _ in range(3):
        await q.charge("read", org)
    with pytest.raises(RateLimited) as refused:
        await q.charge("read", org)
    assert refused.value.status == 429
    assert refused.value.details == {"retry_after_s": 1}
    clock.now += 0.5  # one token at 2/s
    await q.charge("read", org)
    with pytest.raises(RateLimited):
        await q.charge("read", org)


async def test_a_slow_rate_hints_whole_seconds_rounded_up() -> None:
    clock = Clock()
    q = quotas(clock, org={"write": {"rate": 0.1, "burst": 1}})
    org = uuid4()
    await q.charge("write", org)
    with pytest.raises(RateLimited) as refused:
        await q.charge("write", org)
    assert refused.value.details == {"retry_after_s": 10}


async def test_organizations_classes_and_tokens_have_budgets_of_their_own() -> None:
    clock = Clock()
    q = quotas(clock, org={"read": {"rate": 1, "burst": 2}}, token={"read": {"rate": 1, "burst": 1}})
    a, b = uuid4(), uuid4()
    await q.charge("read", a, "token-1")
    with pytest.raises(RateLimited, match="token's read quota"):
        await q.charge("read", a, "token-1")  # the token's budget, the organization has one left
    await q.charge("read", a, "token-2")
    with pytest.raises(RateLimited, match="organization's read quota"):
        await q.charge("read", a, "token-3")
    await q.charge("read", b, "token-4")  # another organization is not touched
    await q.charge("write", a, "token-1")  # nor another class (write is not limited here)


async def test_an_override_per_organization_and_no_limits_by_default() -> None:
    clock = Clock()
    big, other = uuid4(), uuid4()
    q = quotas(
        clock,
        org={"sessions": {"rate": 1, "burst": 1}},
        orgs={str(big): {"sessions": {"rate": 1, "burst": 5}}},
    )
    for _ in range(5):
        await q.charge("sessions", big)
    await q.charge("sessions", other)
    with pytest.raises(RateLimited):
        await q.charge("sessions", other)
    unlimited = quotas(clock)
    assert not unlimited.enabled
    for _ in range(1000):
        await unlimited.charge("read", other)
    await q.charge(None, other)  # the deployment operator's operations spend nothing


def test_every_operation_spends_the_budget_its_permission_says() -> None:
    assert RECALL.quota_class == "read"
    assert MEMORY_SAVE.quota_class == "write"
    assert SESSION_SUBMIT.quota_class == "sessions"
    assert MEMORY_PURGE.quota_class == "governance"
    assert OPS_LAG.quota_class is None
    assert {op.quota_class for op in OPERATIONS} == {"read", "write", "governance", "sessions", None}


def test_limits_are_bounded() -> None:
    with pytest.raises(ValidationError, match="greater than 0"):
        Limit(rate=0, burst=1)
    with pytest.raises(ValidationError, match="reads"):
        QuotaSettings.model_validate({"org": {"reads": {"rate": 1, "burst": 1}}})


async def test_dated_charges_judge_a_backlog_by_when_it_was_published() -> None:
    """Sessions published at the budget's rate and taken at once all pass; published faster, the
    excess is refused, however they are taken; a charge dated earlier refills nothing."""
    clock = Clock()
    q = quotas(clock, org={"sessions": {"rate": 1, "burst": 1}})
    steady, flood = uuid4(), uuid4()
    for i in range(5):
        await q.charge("sessions", steady, at=900.0 + i)  # one a second, all taken now
    taken = 0
    for i in range(10):
        try:
            await q.charge("sessions", flood, at=900.0 + i / 10)  # ten a second
            taken += 1
        except RateLimited:
            pass
    assert taken == 1  # the burst; 0.9 s of refill is not a whole token
    with pytest.raises(RateLimited):
        await q.charge("sessions", steady, at=899.0)  # late redelivery: no refill backwards


async def test_a_known_spent_budget_is_refused_without_spending_anything() -> None:
    """``refuse_known`` (what ingest asks before it reads a session) refuses only what this
    process already knows is over budget, and takes nothing: a budget with tokens left keeps them."""
    clock = Clock()
    q = quotas(clock, org={"sessions": {"rate": 1, "burst": 2}})
    org, other = uuid4(), uuid4()
    for _ in range(5):
        q.refuse_known("sessions", org, at=clock.now)  # nothing known yet, nothing spent
    await q.charge("sessions", org, at=clock.now)
    q.refuse_known("sessions", org, at=clock.now)  # one token left
    await q.charge("sessions", org, at=clock.now)
    with pytest.raises(RateLimited) as refused:
        q.refuse_known("sessions", org, at=clock.now)
    assert refused.value.details == {"retry_after_s": 1}
    assert "sessions quota" in refused.value.message
    q.refuse_known("sessions", other, at=clock.now)  # another organization's budget
    q.refuse_known("sessions", org, at=clock.now + 1)  # refilled by then
    await q.charge("sessions", org, at=clock.now + 1)
