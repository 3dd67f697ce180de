"""Schemathesis hooks for tests/conformance/test_openapi_schemathesis.py (loaded by its CLI through
``SCHEMATHESIS_HOOKS``). Each narrows what is generated, never what is checked, for a rule no
schema can state (docs/adr/0097-schemathesis-conformance.md)."""

from __future__ import annotations

import schemathesis
from schemathesis.generation import GenerationMode


@schemathesis.hook
def filter_case(context: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    """A page token is valid only as a previous page issued it: signed, bound to the caller, the
    query and an expiry (shared/security/page_tokens.py). The document states its grammar; no token made
    up from it can be valid, so the cases that claim to be valid carry none (those meant to be
    refused still do)."""
    positive = case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE
    return not (positive and case.query and "page_token" in case.query)
