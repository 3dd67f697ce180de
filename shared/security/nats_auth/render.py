"""nats-server configuration text for a set of NATS identities (``authorization { users = [...] }``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from shared.security.nats_auth.permissions import Grant, Permissions

__all__ = ["NatsUser", "render_authorization"]


@dataclass(frozen=True)
class NatsUser:
    """One identity in the server's config."""

    #: A public user nkey (``U…``), or ``$VARIABLE`` for nats-server to read from its environment.
    nkey: str
    permissions: Permissions
    #: Comment lines above the user's block.
    comment: str = ""


def _quoted(subject: str) -> str:
    return json.dumps(subject)


def _allow(kind: str, grants: Sequence[Grant], pad: str) -> list[str]:
    subjects = [x for g in grants for x in g.subjects]
    if not subjects:
        # An empty allow list means "no restriction" to nats-server: deny everything instead.
        return [f'{pad}{kind}: {{ deny: [">"] }}']
    lines = [f"{pad}{kind}: {{", f"{pad}  allow: ["]
    for grant in grants:
        lines.append(f"{pad}    # {grant.why}")
        lines += [f"{pad}    {_quoted(x)}" for x in grant.subjects]
    return [*lines, f"{pad}  ]", f"{pad}}}"]


def _user(user: NatsUser) -> list[str]:
    nkey = user.nkey if user.nkey.startswith("$") else _quoted(user.nkey)
    if not (user.nkey.startswith("$") or (user.nkey.startswith("U") and len(user.nkey) == 56)):
        raise ValueError(f"not a public user nkey or a $VARIABLE: {user.nkey!r}")
    lines = [f"    # {line}".rstrip() for line in user.comment.splitlines()]
    lines += ["    {", f"      nkey: {nkey}", "      permissions: {"]
    lines += _allow("publish", user.permissions.publish, "        ")
    lines += _allow("subscribe", user.permissions.subscribe, "        ")
    if user.permissions.allow_responses:
        lines.append("        allow_responses: true")
    return [*lines, "      }", "    }"]


def render_authorization(users: Sequence[NatsUser], header: str = "") -> str:
    """The config block admitting exactly ``users`` (no anonymous user), with their permissions."""
    if not users:
        raise ValueError("at least one user: an empty authorization block would admit anyone")
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    if lines:
        lines.append("")
    lines += ["authorization {", "  users = ["]
    for i, user in enumerate(users):
        if i:
            lines.append("")
        lines += _user(user)
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
