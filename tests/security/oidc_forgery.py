"""Forged and broken tokens "from" an OpenID provider, by name: every one must be refused with
``UNAUTHENTICATED`` wherever it is presented (docs/adr/0093-oidc-tokens.md, "Token rules").

Several are signed with the provider's real key but break one other rule (expiry, audience, an
organization the issuer may not name, a header that brings its own key), so what refuses them is
that rule and not a bad signature. Built with PyJWT and by hand, never through Engram's code."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from uuid import UUID

import jwt

from tests.oidc_provider import OidcProvider, new_key
from tests.security.support import b64url

__all__ = ["oidc_forgeries"]


def _hand_signed(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """HS256 by hand (PyJWT refuses to key HMAC with a PEM public key, which is the attack)."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def oidc_forgeries(idp: OidcProvider, org: UUID, foreign_org: UUID) -> dict[str, str]:
    """``foreign_org``: an organization the provider's issuer is not configured to name."""
    rs, es, ed = idp.key("RS256"), idp.key("ES256"), idp.key("EdDSA")
    claims = idp.claims(org, scope="memory.read memory.write memory.admin memory.purge")
    attacker = new_key("RS256", "attacker-1")
    attacker_jwk = {
        k: v for k, v in attacker.private_jwk().items() if k not in {"d", "p", "q", "dp", "dq", "qi"}
    }
    now = int(time.time())
    body = b64url(json.dumps(claims).encode())
    return {
        "alg_none": f"{b64url(json.dumps({'alg': 'none', 'kid': rs.kid}).encode())}.{body}.",
        "alg_none_no_kid": f"{b64url(json.dumps({'alg': 'none'}).encode())}.{body}.",
        "hs256_keyed_with_rsa_public_pem": _hand_signed(
            {"alg": "HS256", "kid": rs.kid}, claims, rs.public_pem()
        ),
        "hs256_keyed_with_ec_public_pem": _hand_signed(
            {"alg": "HS256", "kid": es.kid}, claims, es.public_pem()
        ),
        "rs256_header_on_the_ec_kid": jwt.encode(
            claims, rs.private, algorithm="RS256", headers={"kid": es.kid}
        ),  # type: ignore[arg-type]
        "es256_header_on_the_eddsa_kid": jwt.encode(
            claims, es.private, algorithm="ES256", headers={"kid": ed.kid}
        ),  # type: ignore[arg-type]
        "ps256_with_the_real_rsa_key": jwt.encode(
            claims, rs.private, algorithm="PS256", headers={"kid": rs.kid}
        ),  # type: ignore[arg-type]
        "unknown_kid": attacker.sign(claims),
        "forged_with_the_real_kid": jwt.encode(
            claims, attacker.private, algorithm="RS256", headers={"kid": rs.kid}
        ),  # type: ignore[arg-type]
        "no_kid_real_key": jwt.encode(claims, rs.private, algorithm="RS256"),  # type: ignore[arg-type]
        "jku_to_the_attackers_keys": attacker.sign(claims, jku="http://127.0.0.1:9/attacker/jwks.json"),
        "x5u_to_the_attackers_cert": attacker.sign(claims, x5u="http://127.0.0.1:9/attacker.pem"),
        "embedded_jwk": attacker.sign(claims, jwk=attacker_jwk),
        "embedded_x5c": attacker.sign(claims, x5c=["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]),
        "jku_on_a_real_signature": rs.sign(claims, jku=f"{idp.issuer}/jwks"),
        "crit_header_real_key": es.sign(claims, crit=["exp"]),
        "expired_real_key": rs.sign({**claims, "iat": now - 7200, "exp": now - 3600}),
        "not_yet_valid_real_key": es.sign({**claims, "nbf": now + 3600}),
        "issued_in_the_future_real_key": ed.sign({**claims, "iat": now + 3600}),
        "no_exp_real_key": rs.sign({k: v for k, v in claims.items() if k != "exp"}),
        "wrong_audience_real_key": rs.sign({**claims, "aud": "https://another-app.example"}),
        "no_audience_real_key": es.sign({k: v for k, v in claims.items() if k != "aud"}),
        "wrong_issuer_real_key": rs.sign({**claims, "iss": "https://evil.example"}),
        "engram_issuer_real_rsa_key": rs.sign({**claims, "iss": "engram"}),
        "foreign_organization_real_key": ed.sign({**claims, "org_id": str(foreign_org)}),
        "organization_not_a_uuid_real_key": rs.sign({**claims, "org_id": "*"}),
        "organization_as_object_real_key": rs.sign({**claims, "org_id": {"id": str(org)}}),
        "no_organization_real_key": rs.sign({k: v for k, v in claims.items() if k != "org_id"}),
        "principal_id_with_colon_real_key": es.sign({**claims, "sub": "end_user:alice"}),
        "principal_kind_unknown_real_key": es.sign({**claims, "principal_kind": "root"}),
        "scope_as_object_real_key": ed.sign({**claims, "scope": {"memory.admin": True}}),
        "nul_in_subject_real_key": ed.sign({**claims, "sub": "run\x00ner"}),
        "tampered_payload": ".".join(
            [
                rs.sign(claims).split(".")[0],
                b64url(json.dumps({**claims, "org_id": str(foreign_org)}).encode()),
                rs.sign(claims).split(".")[2],
            ]
        ),
    }
