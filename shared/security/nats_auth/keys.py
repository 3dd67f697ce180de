"""NATS user nkeys (ed25519): the seed is the secret the client keeps, the public key is all the
server needs. nats-py proves possession by signing the server's nonce with the seed, so the
secret never crosses the wire and the server's config holds nothing worth stealing."""

from __future__ import annotations

import secrets

import nkeys

__all__ = ["new_user_seed", "public_key_of"]


def new_user_seed() -> str:
    """A fresh user seed (``SU…``)."""
    seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode("ascii")


def public_key_of(seed: str) -> str:
    """The public key (``U…``) of a user seed; ``ValueError`` if it is not one."""
    try:
        pair = nkeys.from_seed(bytearray(seed.strip().encode("ascii")))
        public: bytes = pair.public_key
    except (nkeys.NkeysError, UnicodeEncodeError) as exc:
        raise ValueError("not an nkey seed") from exc
    key = public.decode("ascii")
    if not key.startswith("U"):
        raise ValueError("not a user nkey seed")
    return key
