"""``infra/nats/engram-auth.conf``: the production server's users, rendered from the same table
``engram up`` uses (``shared.security.nats_auth.permissions``). ``python -m shared.security.nats_auth.infra``
rewrites the file (``make schema`` runs it); ``tests/unit/test_nats_auth.py`` fails when it is stale."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.security.nats_auth.permissions import (
    ALL_IN_ONE,
    EDGE_VECTOR_PROCESS,
    GATEWAY,
    SERVICES,
    all_in_one_permissions,
    audit_reader_permissions,
    gateway_permissions,
    platform_permissions,
    process_name,
    process_permissions,
    service_permissions,
)
from shared.security.nats_auth.render import NatsUser, render_authorization

__all__ = ["EDGE_VECTORS", "INFRA_AUTH_FILE", "INFRA_USERS", "nkey_variable", "render_infra", "seed_variable"]

INFRA_AUTH_FILE = Path(__file__).resolve().parents[3] / "infra" / "nats" / "engram-auth.conf"
#: Every user of the production config, in file order.
#: The Edge vector process (``engram serve embed recall``): one process, one connection, one user.
EDGE_VECTORS = process_name(EDGE_VECTOR_PROCESS)
INFRA_USERS = (*SERVICES, EDGE_VECTORS, ALL_IN_ONE, GATEWAY, "platform", "audit-reader")

_HEADER = """\
GENERATED from shared/security/nats_auth/permissions.py by `python -m shared.security.nats_auth.infra`
(make schema); tests/unit/test_nats_auth.py fails when this file and the table disagree. Edit the
table, not this.

Least-privilege NATS identities for Engram (SPEC 8), the same model `engram up` runs with:
one nkey user per service, `engram` for a process running every service, and one user per
platform client, each subscribing only under its own inbox prefix. Exercised by
tests/integration/test_nats_permissions.py on a real nats-server.

A config fragment: add `include "engram-auth.conf"` to nats-server.conf (include paths are
relative to the including file). With it every connection must prove an nkey below; there is no
anonymous user. The public keys are read from nats-server's environment
(`nkey: $ENGRAM_NATS_NKEY_INGEST`); they are not secret, but differ per deployment. Generate a
pair with `engram credentials keygen --out ingest.nk` (prints the public key, writes the seed with
mode 0600); the service reads its seed from ENGRAM_NATS_NKEY_SEED. nkeys sign the server's nonce:
no secret crosses the wire and this file holds none.

How to read the lists (all `allow` lists; everything not allowed is refused):
* Subjects match whole tokens (`*` one token, `>` the rest), so streams and consumers are named.
* Every service process runs `ensure_streams` (INFO/CREATE/UPDATE on Engram's streams) and an
  outbox relay over the one shared outbox table, which publishes whichever rows it claims:
  memory.written/purged, engram.audit.*.*, engram.dlq.> and each organization's feed copy of the
  first three, engram.feed.<org_id>.<event> (docs/adr/0102-tenant-feeds.md).
* A durable pull consumer's rights name its stream, durable name and filter subject; no
  CONSUMER.DELETE/UPDATE, no STREAM.DELETE/PURGE for anyone.
* Replies: request handlers answer through `allow_responses`; nobody may publish to inboxes.
  Each identity subscribes only to its own inbox prefix: `_INBOX_engram-<service>` (set by
  services/runtime.py), `_INBOX_engram` for `engram up`, and the client's own prefix, so nobody can
  read another's replies or pulled messages. Clients must connect with it:
      nats.connect(url, nkeys_seed_str=seed, inbox_prefix="_INBOX_platform")
* Internal subjects (engram.session.validated, engram.save.*, engram.memory.written/purged,
  engram.audit.*.*, engram.dlq.>) are published by services only; services also check each
  message's producer signature (shared/security/provenance.py), so a wrong line here is not enough to write
  into a tenant.
* Organizations: give each platform client its own user and inbox prefix (copy the `platform`
  block: new variable, new prefix such as `_INBOX_acme`). Two organizations sharing one user could
  read each other's replies. Tokens still decide tenancy; NATS bounds what a connection can reach.
  The `platform` block belongs to no organization, so it follows no feed; to let a client follow
  its organization's, add what `platform_permissions(prefix, org_id=ORG, consumer=NAME)` renders
  (shared/security/nats_auth/permissions.py; `engram up` does it for minted clients): a subscription to
  engram.feed.ORG.> and one consumer named NAME on ENGRAM_FEED filtered within it."""

_COMMENTS = {
    "ingest": "ingest: consumes engram.session.ended, serves engram.memory.save; hands verified sessions\n"
    "and accepted saves to distill; listens for waiting saves' outcomes.",
    "distill": "distill: consumes engram.session.validated and engram.save.accepted; answers waiting saves\n"
    "on engram.save.result.<request id>; its lessons leave through the outbox.",
    "embed": "embed: consumes engram.memory.written and engram.memory.purged (vectors in, vectors out).",
    "recall": "recall: serves recall, expand and feedback; drops cached replies on written/purged.",
    "governance-audit": "governance-audit: serves config, the audit log and the governance API.",
    EDGE_VECTORS: "embed+recall: embed and recall in one process (`engram serve embed recall`), for a\n"
    "deployment whose vectors live in Qdrant Edge (in-process, one process at a time): the union of\n"
    "the two service users, with one inbox prefix, _INBOX_engram-embed+recall.",
    ALL_IN_ONE: "engram: every service in one process (`engram up --nats-url …`): the union of the five\n"
    "service users, with one inbox prefix, _INBOX_engram.",
    GATEWAY: "gateway: the HTTP gateway (`engram serve gateway`). A platform client's rights under its\n"
    "own inbox, _INBOX_engram-gateway: it forwards each HTTP call with the caller's token unchanged.",
    "platform": "platform: an agent runner or platform backend. Publishes ended sessions and makes\n"
    "the public requests; reads nothing but its own inbox. Copy this block per organization.",
    "audit-reader": "audit-reader: an audit consumer (SIEM, compliance). Its own pull consumers on\n"
    'ENGRAM_AUDIT (pass stream="ENGRAM_AUDIT" to pull_subscribe); connect with\n'
    'inbox_prefix="_INBOX_audit_reader".',
}


def nkey_variable(user: str) -> str:
    """The environment variable nats-server reads ``user``'s public key from."""
    return "ENGRAM_NATS_NKEY_" + _variable_suffix(user)


def seed_variable(user: str) -> str:
    """The variable of a deployment's ``.env`` holding ``user``'s seed, which the deployment files
    hand to that user's processes as ``ENGRAM_NATS_NKEY_SEED``."""
    return "ENGRAM_NATS_SEED_" + _variable_suffix(user)


def _variable_suffix(user: str) -> str:
    return user.upper().replace("-", "_").replace("+", "_")


def render_infra() -> str:
    users = []
    for user in INFRA_USERS:
        if user in SERVICES:
            perms = service_permissions(user)
        elif user == ALL_IN_ONE:
            perms = all_in_one_permissions()
        elif user == EDGE_VECTORS:
            perms = process_permissions(EDGE_VECTOR_PROCESS)
        elif user == GATEWAY:
            perms = gateway_permissions()
        elif user == "platform":
            perms = platform_permissions("_INBOX_platform")
        else:
            perms = audit_reader_permissions("_INBOX_audit_reader")
        users.append(NatsUser(f"${nkey_variable(user)}", perms, _COMMENTS[user]))
    return render_authorization(users, _HEADER)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else INFRA_AUTH_FILE
    target.write_text(render_infra())
    print(f"wrote {target}")
