"""TLS client contexts for NATS and Postgres, built from file paths in the settings."""

from __future__ import annotations

import ssl

__all__ = ["client_tls_context"]


def client_tls_context(ca_file: str = "", cert_file: str = "", key_file: str = "") -> ssl.SSLContext | None:
    """A context verifying the server against ``ca_file`` (and its host name), presenting
    ``cert_file``/``key_file`` when given; None when no TLS setting is given at all.

    A client certificate without a CA uses the system's trust store; a certificate without its
    key (or the reverse) is a configuration error, reported now rather than at the first connect.
    """
    if not (ca_file or cert_file or key_file):
        return None
    if bool(cert_file) != bool(key_file):
        raise ValueError("a TLS client certificate needs both its certificate file and its key file")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context
