"""Attacker-side security tests: tenancy, tokens, authorization, erasure, page tokens, injection
and the audit chain, each counting what it tried and what got through."""
