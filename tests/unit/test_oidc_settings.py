"""Which OpenID Connect issuers a process trusts (docs/adr/0093-oidc-tokens.md, "Configuration"):
read from ``ENGRAM_OIDC_ISSUERS`` and the single-issuer ``ENGRAM_OIDC_*`` variables; an audience
and the organizations are required, and an issuer configured twice or named like Engram's own
stops the start."""

from __future__ import annotations

import json
from uuid import uuid4

import pydantic
import pytest

from shared.runtime.settings import EngramSettings
from shared.security.oidc import build_verifier

KEYS = "k1=" + "s" * 32


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> EngramSettings:
    for name, value in env.items():
        monkeypatch.setenv(f"ENGRAM_{name.upper()}", value)
    return EngramSettings(_env_file=None)  # type: ignore[call-arg]


def test_empty_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose passes the variable through empty when it is unset."""
    assert settings(monkeypatch, oidc_issuers="").oidc_issuer_list() == []


def test_a_json_list_and_one_more_issuer_from_the_single_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    org = uuid4()
    listed = [{"issuer": "https://a.example", "audience": "engram", "orgs": [str(org)], "leeway_s": 5}]
    issuers = settings(
        monkeypatch,
        oidc_issuers=json.dumps(listed),
        oidc_issuer="https://b.example",
        oidc_audience="https://engram.example",
        oidc_orgs="*",
        oidc_org_claim="tenant",
        oidc_permissions_claim="roles",
    ).oidc_issuer_list()
    assert [(i.issuer, i.orgs) for i in issuers] == [
        ("https://a.example", (org,)),
        ("https://b.example", "*"),
    ]
    assert issuers[0].leeway_s == 5
    assert (issuers[1].org_claim, issuers[1].permissions_claim, issuers[1].principal_claim) == (
        "tenant",
        "roles",
        "sub",
    )
    assert issuers[0].may_name(org)
    assert not issuers[0].may_name(uuid4())


@pytest.mark.parametrize(
    "env",
    [
        {"oidc_issuer": "https://b.example", "oidc_orgs": "*"},  # no audience
        {"oidc_issuer": "https://b.example", "oidc_audience": "engram"},  # no orgs
        {"oidc_issuer": "engram", "oidc_audience": "engram", "oidc_orgs": "*"},  # Engram's own issuer
        {
            "oidc_issuers": json.dumps([{"issuer": "https://b.example", "audience": "x", "orgs": "*"}]),
            "oidc_issuer": "https://b.example",
            "oidc_audience": "y",
            "oidc_orgs": "*",
        },  # twice
    ],
)
def test_a_bad_issuer_stops_the_start(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"ENGRAM_OIDC|configured twice"):
        build_verifier(settings(monkeypatch, token_keys=KEYS, **env))


@pytest.mark.parametrize(
    "entry",
    [
        {"issuer": "https://a.example", "audience": "engram"},  # orgs must be written out
        {"issuer": "https://a.example", "orgs": "*"},  # no audience
        {"issuer": "https://a.example", "audience": "engram", "orgs": ["not-a-uuid"]},
        {"issuer": "https://a.example", "audience": "engram", "orgs": "all"},
        {"issuer": "https://a.example", "audience": "engram", "orgs": "*", "jku": "x"},  # unknown field
    ],
)
def test_a_bad_list_entry_is_refused(monkeypatch: pytest.MonkeyPatch, entry: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        settings(monkeypatch, oidc_issuers=json.dumps([entry]))
