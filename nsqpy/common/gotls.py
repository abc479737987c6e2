"""TLS contexts that accept what Go's crypto/tls accepts.

OpenSSL refuses, at its default security level (2 on Debian), RSA keys under 2048 bits,
SHA-1 certificate signatures and the TLS 1.0/1.1 handshake; it fails to even load such a
certificate (``EE_KEY_TOO_SMALL``). Go's crypto/tls takes all of them, so an nsqd started
with a 1024-bit RSA / SHA-1 certificate, or ``--tls-min-version=tls1.0``, works with Go.
Security level 0 leaves those choices to what the flags set explicitly (minimum protocol
version, cipher suites, client certificate policy), as Go's ``tls.Config`` does.
"""

from __future__ import annotations

import ssl
from typing import Final

__all__ = ["GO_SECURITY_LEVEL", "accept_as_go", "go_client_context"]

GO_SECURITY_LEVEL: Final = "@SECLEVEL=0"


def accept_as_go(ctx: ssl.SSLContext, ciphers: str = "DEFAULT") -> None:
    """Use ``ciphers`` (an OpenSSL cipher string) at the security level Go's accepts.

    Call it before loading a certificate: the level is checked when the key is loaded."""
    ctx.set_ciphers(f"{ciphers}:{GO_SECURITY_LEVEL}")


def go_client_context(cafile: str | None = None) -> ssl.SSLContext:
    """``ssl.create_default_context`` (verified server certificates, TLS 1.2 or later)
    that also takes the keys and signatures a Go client takes."""
    ctx = ssl.create_default_context(cafile=cafile)
    accept_as_go(ctx)
    return ctx
