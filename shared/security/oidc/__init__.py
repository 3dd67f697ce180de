"""Tokens from OpenID Connect issuers (docs/adr/0093-oidc-tokens.md): an issuer's key set
(:mod:`shared.security.oidc.keys`), its token rules and claim mapping (:mod:`shared.security.oidc.issuer`),
and the verifier every process builds from its settings (:func:`build_verifier`)."""

from __future__ import annotations

from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenService, TokenVerifier
from shared.security.oidc.issuer import OidcIssuer

__all__ = ["OidcIssuer", "build_verifier"]


def build_verifier(settings: EngramSettings) -> TokenVerifier:
    """Engram's own tokens (``ENGRAM_TOKEN_KEYS``) and every configured issuer's. Raises
    ValueError — the process does not start — on missing keys or a bad issuer list."""
    own = TokenService(settings.signing_keys(), settings.token_issuer)
    return TokenVerifier(own, [OidcIssuer(issuer) for issuer in settings.oidc_issuer_list()])
