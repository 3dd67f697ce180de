"""Who is who and who may do what (SPEC 3, 8): signed tokens and OpenID Connect issuers, the one
``authorize()``, tenancy's owner keys, the internal messages' signatures, signed page tokens,
TLS client contexts and the NATS identities with their permissions."""
