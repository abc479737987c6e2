"""nsqd's TLS (spec §7.10): the server context, client certificate policies, the
``--tls-required`` policy on the TCP protocol and on plain HTTP, and Go's names for
what a connection negotiated (the ``tls_*`` client stats).

Go builds one ``tls.Config`` (``buildTLSConfig``) that serves both the ``tls_v1``
IDENTIFY upgrade on the TCP port and the HTTPS listener; :func:`build_tls_context`
is its counterpart (``NSQDServer.tls_context``, which ``http_api`` also listens with),
:func:`build_client_tls_context` that of ``buildClientTLSConfig`` (outbound HTTPS, i.e.
the auth server).
"""

from __future__ import annotations

import ssl
from typing import Any, Final, cast

from nsqpy.common.gotls import accept_as_go, go_client_context
from nsqpy.nsqd.options import Options
from nsqpy.wire.v2 import MAX_LINE_LENGTH, Command, CommandParser, ProtocolError, wire_str

__all__ = [
    "TLSConfigError",
    "TLSRequiredParser",
    "build_client_tls_context",
    "build_tls_context",
    "cipher_suite_name",
    "peer_common_name",
    "tls_version_name",
]

TLS_HANDSHAKE_TIMEOUT: Final = 5.0  # Go: tlsConn.SetDeadline(now + 5s) around Handshake()

_MIN_VERSIONS: Final = {
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}

# Go's default TLS 1.0-1.2 cipher suites, in Go's order of preference (OpenSSL names);
# the same suites negotiated the same way make the cipher suite in /stats read as Go's.
_GO_CIPHERS: Final = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
    )
)


class TLSConfigError(ValueError):
    """The TLS options cannot be turned into a context (Go: ``failed to build TLS config``)."""


# -- contexts --------------------------------------------------------------------------------


def build_tls_context(opts: Options) -> ssl.SSLContext | None:
    """Go's ``buildTLSConfig``: ``None`` without ``--tls-cert``/``--tls-key``.

    ``--tls-client-auth-policy``: ``require`` asks for a client certificate and takes any
    (Go's ``RequireAnyClientCert``), ``require-verify`` checks it against
    ``--tls-root-ca-file`` (else the system roots); anything else asks for none, even
    with a CA file. ``--tls-min-version`` is the lowest protocol accepted.
    Raises :class:`TLSConfigError`.
    """
    if not opts.tls_cert and not opts.tls_key:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _MIN_VERSIONS[opts.tls_min_version]
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    accept_as_go(ctx, _GO_CIPHERS)  # 1024-bit RSA, SHA-1 certificates, TLS 1.0: as Go
    try:
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    except (OSError, ssl.SSLError) as err:
        raise TLSConfigError(f"failed to build TLS config - {err}") from None
    policy = opts.tls_client_auth_policy
    if policy == "require":
        _require_any_client_certificate(ctx)
    elif policy == "require-verify":
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not opts.tls_root_ca_file:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    if opts.tls_root_ca_file:
        try:
            ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
        except (OSError, ssl.SSLError) as err:
            raise TLSConfigError(f"failed to build TLS config - {err}") from None
    return ctx


def build_client_tls_context(opts: Options) -> ssl.SSLContext:
    """Go's ``buildClientTLSConfig``, for nsqd's outbound HTTPS (the auth server): server
    certificates checked against ``--tls-root-ca-file`` if given, else the system roots."""
    try:
        ctx = go_client_context(opts.tls_root_ca_file or None)
    except (OSError, ssl.SSLError) as err:
        raise TLSConfigError(f"failed to build client TLS config - {err}") from None
    ctx.minimum_version = _MIN_VERSIONS[opts.tls_min_version]
    return ctx


# Go's RequireAnyClientCert has no equivalent in Python's ssl module: CERT_REQUIRED always
# verifies the chain. OpenSSL's own answer is a verify callback that accepts everything,
# which the ssl module does not expose; it is set here through libssl with ctypes, on the
# SSL_CTX pointer that CPython keeps as the first field after the object header.
# (ctypes is imported only then: it is slow to import and most nsqds never need it.)


def _accept(preverify_ok: int, store_ctx: int | None) -> int:
    return 1


_accept_any_certificate: Any = None  # the ctypes callback, kept referenced: OpenSSL calls it


_SSL_VERIFY_PEER: Final = 0x01
_SSL_VERIFY_FAIL_IF_NO_PEER_CERT: Final = 0x02


def _require_any_client_certificate(ctx: ssl.SSLContext) -> None:
    global _accept_any_certificate
    import _ssl
    import ctypes

    verify_callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
    if _accept_any_certificate is None:
        _accept_any_certificate = verify_callback(_accept)

    try:
        libssl = ctypes.CDLL(_ssl.__file__)  # resolves libssl symbols through _ssl's links
        get_verify_mode = libssl.SSL_CTX_get_verify_mode
        set_verify = libssl.SSL_CTX_set_verify
    except (OSError, AttributeError) as err:
        raise TLSConfigError(
            f"failed to build TLS config - --tls-client-auth-policy=require: {err}"
        ) from None
    get_verify_mode.argtypes = [ctypes.c_void_p]
    get_verify_mode.restype = ctypes.c_int
    set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, verify_callback]
    set_verify.restype = None
    ssl_ctx = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    # Make sure the pointer is this context's SSL_CTX before handing it to OpenSSL.
    ctx.verify_mode = ssl.CERT_OPTIONAL
    optional = get_verify_mode(ssl_ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED
    required = get_verify_mode(ssl_ctx)
    if (optional, required) != (
        _SSL_VERIFY_PEER,
        _SSL_VERIFY_PEER | _SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
    ):
        raise TLSConfigError(
            "failed to build TLS config - --tls-client-auth-policy=require is not "
            "supported by this Python's ssl module"
        )
    set_verify(ssl_ctx, required, _accept_any_certificate)


# -- what a connection negotiated (Go's prettyConnectionState) -------------------------------

_GO_VERSION_NAMES: Final = {
    "SSLv3": "SSL30",
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
}
_VERSION_NUMBERS: Final = {
    "SSLv3": 0x0300,
    "TLSv1": 0x0301,
    "TLSv1.1": 0x0302,
    "TLSv1.2": 0x0303,
    "TLSv1.3": 0x0304,
}

# The suites Go's GetCipherSuite names; every other one is "Unknown <IANA number>".
_GO_CIPHER_NAMES: Final = {
    "RC4-SHA": "TLS_RSA_WITH_RC4_128_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-ECDSA-RC4-SHA": "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-RC4-SHA": "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "ECDHE-RSA-DES-CBC3-SHA": "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
}
_cipher_ids: dict[str, int] | None = None


def tls_version_name(ssl_object: ssl.SSLObject) -> str:
    """Go's ``GetVersion``: ``TLS1.2``..., and ``Unknown 772`` for TLS 1.3 (Go's table
    stops at 1.2)."""
    version = ssl_object.version() or ""
    name = _GO_VERSION_NAMES.get(version)
    if name is None:
        return f"Unknown {_VERSION_NUMBERS.get(version, 0)}"
    return name


def cipher_suite_name(ssl_object: ssl.SSLObject) -> str:
    """Go's ``GetCipherSuite``: the Go constant name, or ``Unknown <IANA number>``."""
    cipher = ssl_object.cipher()
    name = cipher[0] if cipher else ""
    go_name = _GO_CIPHER_NAMES.get(name)
    if go_name is not None:
        return go_name
    global _cipher_ids
    if _cipher_ids is None:
        every = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        every.set_ciphers("ALL:@SECLEVEL=0")
        _cipher_ids = {c["name"]: c["id"] & 0xFFFF for c in every.get_ciphers()}
    return f"Unknown {_cipher_ids.get(name, 0)}"


def peer_common_name(ssl_object: ssl.SSLObject) -> str:
    """The client certificate's subject CommonName (the last one, as Go's pkix.Name), or
    ``""``; sent to the auth server as ``common_name``."""
    cert = ssl_object.getpeercert() or {}
    subject = cast(tuple[tuple[tuple[str, str], ...], ...], cert.get("subject", ()))
    common_name = ""
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                common_name = value
    return common_name


# -- --tls-required ---------------------------------------------------------------------------


class TLSRequiredParser(CommandParser):
    """The command parser of a connection that must upgrade to TLS before anything else
    (``--tls-required``, Go's ``enforceTLSPolicy``): every command but IDENTIFY fails with
    ``E_INVALID cannot <CMD> in current state (TLS required)`` as soon as its line is
    complete, before any body is read, unknown commands included.

    Used until the TLS upgrade; the connection then continues with a plain parser.
    """

    __slots__ = ()

    def take_publish(self, data: bytes) -> Command | None:
        return None  # a PUB is refused here: next_command says so

    def next_command(self) -> Command | None:
        # Only at a command boundary: not while a body (IDENTIFY's) is being waited for.
        if not self._need and self._mpub is None:
            buf = self._buf
            pos = self._pos
            nl = buf.find(b"\n", pos)
            if nl >= 0 and nl - pos < MAX_LINE_LENGTH:
                end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
                name = buf[pos:end].split(b" ", 1)[0]
                if name != b"IDENTIFY":
                    raise ProtocolError(
                        "E_INVALID", f"cannot {wire_str(name)} in current state (TLS required)"
                    )
        return super().next_command()
