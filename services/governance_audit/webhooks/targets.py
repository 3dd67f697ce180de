"""Where a webhook may point (the SSRF rule, docs/adr/0102-tenant-feeds.md).

A tenant chooses the URL and Engram makes the request, from inside the deployment: a URL naming
Postgres, NATS' monitoring port, a cloud metadata endpoint (169.254.169.254) or any other internal
address would make Engram a proxy into its own network. So, unless the deployment says otherwise
(``ENGRAM_WEBHOOK_ALLOW_PRIVATE_NETWORKS``, for tests and receivers on the same private network):

- only ``http`` and ``https``, no user info in the URL, a port of 1-65535;
- every address the host resolves to must be global unicast: loopback, private (RFC 1918,
  unique-local), link-local, shared (CGNAT), multicast, reserved and unspecified addresses are
  refused — checked at registration and again before every delivery (a name may be re-pointed
  after it was registered);
- redirects are not followed (a 3xx is a failed attempt), so a public receiver cannot bounce the
  request inside.
What remains: a name re-pointed between the check and the connection (DNS rebinding within one
delivery); egress filtering at the network is the complete answer and is documented as such.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from contracts.errors import Forbidden, InvalidRequest

__all__ = ["check_target"]


async def check_target(url: str, *, allow_private: bool) -> None:
    """Refuse ``url`` unless it is one Engram may call: ``FORBIDDEN`` for where it points (a
    non-public address, or a host that does not resolve, so cannot be shown to be public);
    ``INVALID_REQUEST`` for a malformed URL (the request model's pattern already refuses those)."""
    try:
        parts = urlsplit(url)
        parts.hostname  # noqa: B018 (parses a bracketed host: "[00]" is no IPv6 address)
    except ValueError:
        raise Forbidden("a webhook URL's host must be a name or an address that Engram may call") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest("a webhook URL is http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequest("a webhook URL carries no user or password; sign with the secret instead")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidRequest("a webhook URL's port is 1-65535") from None
    if allow_private:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # UnicodeError: a label IDNA cannot encode (over 63 characters)
        raise Forbidden(
            "a webhook URL's host must resolve to a public address; this one does not resolve"
        ) from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            raise Forbidden(
                "a webhook URL may not point at a loopback, private, link-local or reserved address "
                "(the deployment's operator may allow it: ENGRAM_WEBHOOK_ALLOW_PRIVATE_NETWORKS)"
            )
