"""TLS on nsqd's TCP port (spec §1, §2.2, §2.4, §7.10): the IDENTIFY ``tls_v1`` upgrade,
``--tls-required``, client certificate policies and ``--tls-min-version``, with
certificates made by trustme, raw clients on Python's ssl and the real pynsq client."""

from __future__ import annotations

import datetime
import json
import ssl
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from nsqpy.client._config import tls_context_from_go
from tests.support.procs import ServerProcess
from tests.support.pynsq_client import pynsq_round_trip
from tests.support.rawclient import ConnectionClosed
from tests.support.secure_client import SecureClient, client_context

pytestmark = pytest.mark.timeout(60)

NsqdFactory = Callable[..., ServerProcess]


@dataclass(frozen=True)
class Certs:
    ca: str  # the CA nsqd and the clients trust
    server_cert: str
    server_key: str
    client: tuple[str, str]  # cert, key, issued by ca (CN "client-a")
    stranger: tuple[str, str]  # cert, key, issued by another CA (CN "client-b")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    path = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    other_ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client-a@example.com", common_name="client-a")
    stranger = other_ca.issue_cert("client-b@example.com", common_name="client-b")

    def write(name: str, blob: trustme.Blob) -> str:
        blob.write_to_path(str(path / name))
        return str(path / name)

    return Certs(
        ca=write("ca.pem", ca.cert_pem),
        server_cert=write("server.pem", server.cert_chain_pems[0]),
        server_key=write("server.key", server.private_key_pem),
        client=(
            write("client.pem", client.cert_chain_pems[0]),
            write("client.key", client.private_key_pem),
        ),
        stranger=(
            write("stranger.pem", stranger.cert_chain_pems[0]),
            write("stranger.key", stranger.private_key_pem),
        ),
    )


def tls_nsqd(factory: NsqdFactory, certs: Certs, **options: Any) -> ServerProcess:
    return factory(tls_cert=certs.server_cert, tls_key=certs.server_key, **options)


def client_stats(server: ServerProcess, topic: str) -> list[dict[str, Any]]:
    url = f"http://{server.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        stats = json.load(resp)
    clients: list[dict[str, Any]] = []
    for t in stats["topics"]:
        for channel in t["channels"]:
            clients.extend(channel["clients"])
    clients.extend(stats.get("producers") or [])
    return clients


def assert_refused(client: SecureClient, ctx: ssl.SSLContext) -> None:
    """The TLS handshake fails (TLS 1.2), or the server's alert arrives instead of the OK
    (TLS 1.3 clients finish their side of the handshake before the server checks them)."""
    with pytest.raises((ssl.SSLError, ConnectionError, ConnectionClosed, OSError)):
        client.negotiate(tls=ctx)
        client.pub("never", b"x")


# -- the upgrade ---------------------------------------------------------------------------


def test_tls_upgrade_publish_and_consume(
    nsqd_factory: NsqdFactory, certs: Certs, topic: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs)
    ctx = client_context(certs.ca)
    producer = SecureClient(server.tcp_address)
    reply = producer.negotiate(tls=ctx)
    assert isinstance(reply, dict) and reply["tls_v1"] is True
    assert producer.ssl_version in ("TLSv1.2", "TLSv1.3")
    producer.pub(topic, b"secret-1")
    producer.mpub(topic, [b"secret-2", b"secret-3"])

    consumer = SecureClient(server.tcp_address)
    consumer.negotiate(tls=ctx)
    consumer.sub(topic, "ch")
    consumer.rdy(10)
    messages = consumer.read_messages(3)
    assert [m.body for m in messages] == [b"secret-1", b"secret-2", b"secret-3"]
    for m in messages:
        consumer.fin(m.id)

    stats = {c["client_id"]: c for c in client_stats(server, topic)}
    assert len(stats) == 1  # the producer's and consumer's client_id are the same host
    [entry] = stats.values()
    assert entry["tls"] is True
    assert entry["tls_version"] in ("TLS1.2", "Unknown 772")  # Go's names stop at TLS 1.2
    assert entry["tls_cipher_suite"]
    assert entry["tls_negotiated_protocol_is_mutual"] is True
    producer.close()
    consumer.close()


def test_tls12_client_gets_go_names_in_stats(
    nsqd_factory: NsqdFactory, certs: Certs, topic: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs)
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca, max_version=ssl.TLSVersion.TLSv1_2))
    client.sub(topic, "ch")
    [entry] = client_stats(server, topic)
    assert entry["tls_version"] == "TLS1.2"
    # trustme keys are ECDSA; AES-128-GCM first, as Go prefers
    assert entry["tls_cipher_suite"] == "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
    client.close()


def test_tls_not_granted_without_a_certificate(
    shared_nsqd: ServerProcess, certs: Certs, topic: str
) -> None:
    client = SecureClient(shared_nsqd.tcp_address)
    reply = client.negotiate(tls=client_context(certs.ca))
    assert isinstance(reply, dict) and reply["tls_v1"] is False
    client.pub(topic, b"plain")  # the connection goes on in the clear
    client.close()


def test_tls_not_asked_for(nsqd_factory: NsqdFactory, certs: Certs, topic: str) -> None:
    server = tls_nsqd(nsqd_factory, certs)
    client = SecureClient(server.tcp_address)
    reply = client.negotiate()
    assert isinstance(reply, dict) and reply["tls_v1"] is False
    client.pub(topic, b"plain")
    client.close()


def test_tls_handshake_garbage_closes(nsqd_factory: NsqdFactory, certs: Certs) -> None:
    server = tls_nsqd(nsqd_factory, certs)
    client = SecureClient(server.tcp_address)
    client.send(
        b"IDENTIFY\n" + len(b'{"feature_negotiation":true,"tls_v1":true}').to_bytes(4, "big")
    )
    client.send(b'{"feature_negotiation":true,"tls_v1":true}')
    assert client.read_clear_frame().type == 0
    client.send(b"this is not a ClientHello\n")
    client.assert_closed()
    server.wait_for_log(r"E_IDENTIFY_FAILED IDENTIFY failed")


# -- --tls-required -----------------------------------------------------------------------


@pytest.mark.parametrize("required", ["true", "tcp-https"])
@pytest.mark.parametrize(
    ("command", "name"),
    [
        (b"PUB t\n\x00\x00\x00\x01x", "PUB"),
        (b"PUB bad!topic\n", "PUB"),  # refused on the line, before the topic or body
        (b"MPUB t\n", "MPUB"),
        (b"SUB t c\n", "SUB"),
        (b"NOP\n", "NOP"),
        (b"AUTH\n", "AUTH"),
        (b"RDY 1\n", "RDY"),
        (b"FOO bar\n", "FOO"),
        (b"\n", ""),
    ],
)
def test_tls_required_refuses_plain_commands(
    nsqd_factory: NsqdFactory, certs: Certs, required: str, command: bytes, name: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_required=required)
    client = SecureClient(server.tcp_address)
    client.send(command)
    client.expect_error(f"E_INVALID cannot {name} in current state (TLS required)")


def test_tls_required_allows_identify_then_refuses(nsqd_factory: NsqdFactory, certs: Certs) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_required="true")
    client = SecureClient(server.tcp_address)
    client.identify_ok()  # IDENTIFY without tls_v1 is answered
    client.send(b"NOP\n")
    client.expect_error("E_INVALID cannot NOP in current state (TLS required)")


def test_tls_required_after_upgrade(nsqd_factory: NsqdFactory, certs: Certs, topic: str) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_required="true")
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca))
    client.pub(topic, b"ok")
    client.sub(topic, "ch")
    client.rdy(1)
    assert client.read_message().body == b"ok"
    client.close()


def test_tls_required_plain_http_gets_403(nsqd_factory: NsqdFactory, certs: Certs) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_required="true", https_address="127.0.0.1:0")
    server.wait_for_log(r"HTTPS: listening on")
    https_port = int(server.address("https").rpartition(":")[2])
    try:
        urllib.request.urlopen(f"http://{server.http_address}/ping", timeout=5)
        raise AssertionError("plain HTTP was served")
    except urllib.error.HTTPError as err:
        assert err.code == 403
        assert json.loads(err.read()) == {"message": "TLS_REQUIRED", "https_port": https_port}
    ctx = client_context(certs.ca)
    with urllib.request.urlopen(
        f"https://127.0.0.1:{https_port}/ping", context=ctx, timeout=5
    ) as resp:
        assert resp.read() == b"OK"


# -- client certificates -------------------------------------------------------------------


def test_policy_require_needs_a_certificate(nsqd_factory: NsqdFactory, certs: Certs) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_client_auth_policy="require")
    assert_refused(SecureClient(server.tcp_address), client_context(certs.ca))


@pytest.mark.parametrize("who", ["client", "stranger"])
def test_policy_require_takes_any_certificate(
    nsqd_factory: NsqdFactory, certs: Certs, topic: str, who: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_client_auth_policy="require")
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca, cert=getattr(certs, who)))
    client.pub(topic, b"with a cert")  # also proves --tls-required was implied
    client.close()
    plain = SecureClient(server.tcp_address)
    plain.send(b"NOP\n")
    plain.expect_error("E_INVALID cannot NOP in current state (TLS required)")


def test_policy_require_verify(nsqd_factory: NsqdFactory, certs: Certs, topic: str) -> None:
    server = tls_nsqd(
        nsqd_factory, certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca
    )
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca, cert=certs.client))
    client.pub(topic, b"verified")
    client.close()
    assert_refused(SecureClient(server.tcp_address), client_context(certs.ca, cert=certs.stranger))
    assert_refused(SecureClient(server.tcp_address), client_context(certs.ca))


def test_ca_file_alone_asks_for_no_certificate(
    nsqd_factory: NsqdFactory, certs: Certs, topic: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_root_ca_file=certs.ca)
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca))
    client.pub(topic, b"no client cert needed")
    client.close()


# -- --tls-min-version -------------------------------------------------------------------------


def test_tls_min_version(nsqd_factory: NsqdFactory, certs: Certs, topic: str) -> None:
    server = tls_nsqd(nsqd_factory, certs, tls_min_version="tls1.3")
    old = client_context(certs.ca, max_version=ssl.TLSVersion.TLSv1_2)
    assert_refused(SecureClient(server.tcp_address), old)
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=client_context(certs.ca))
    assert client.ssl_version == "TLSv1.3"
    client.sub(topic, "ch")
    [entry] = client_stats(server, topic)
    assert entry["tls_version"] == "Unknown 772"  # Go's GetVersion has no TLS 1.3 name
    client.close()


# -- material Go accepts (asyncnsq's suite: 1024-bit RSA, SHA-1, self-signed) ----------------


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def weak_rsa_sha1_pair(path: Path) -> tuple[str, str]:
    """A self-signed 1024-bit RSA certificate signed with SHA-1, as (cert, key) paths.

    cryptography no longer signs certificates with SHA-1, so the certificate is signed
    with SHA-256 and then re-signed by hand: the two signature algorithm identifiers have
    the same DER length, so the TBS part only has one OID byte changed."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    modern = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    sha256_rsa = bytes.fromhex("06092a864886f70d01010b")  # 1.2.840.113549.1.1.11
    sha1_rsa = bytes.fromhex("06092a864886f70d010105")  # 1.2.840.113549.1.1.5
    tbs = modern.tbs_certificate_bytes
    assert tbs.count(sha256_rsa) == 1
    tbs = tbs.replace(sha256_rsa, sha1_rsa)
    signature = key.sign(tbs, padding.PKCS1v15(), hashes.SHA1())
    der = _der(0x30, tbs + _der(0x30, sha1_rsa + b"\x05\x00") + _der(0x03, b"\x00" + signature))
    cert = x509.load_der_x509_certificate(der)
    assert cert.signature_algorithm_oid == x509.SignatureAlgorithmOID.RSA_WITH_SHA1
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA1)
    cert_path, key_path = path / "weak.pem", path / "weak.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def old_client_context(ca: str, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client speaking only ``version``, trusting ``ca``, at OpenSSL's security level 0."""
    ctx = client_context(ca)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():  # ssl.TLSVersion.TLSv1/TLSv1_1 are deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def test_1024_bit_rsa_sha1_certificate_and_tls10_client(
    nsqd_factory: NsqdFactory, tmp_path: Path, topic: str
) -> None:
    cert, key = weak_rsa_sha1_pair(tmp_path)
    server = nsqd_factory(tls_cert=cert, tls_key=key, tls_min_version="tls1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tls10 = ssl.TLSVersion.TLSv1
    old = SecureClient(server.tcp_address)
    old.negotiate(tls=old_client_context(cert, tls10))
    assert old.ssl_version == "TLSv1"
    old.sub(topic, "ch")
    [entry] = client_stats(server, topic)
    assert (entry["tls"], entry["tls_version"]) == (True, "TLS1.0")
    assert entry["tls_cipher_suite"] == "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
    old.close()
    # a current client (TLS 1.2+) is served by the same certificate
    modern = SecureClient(server.tcp_address)
    modern.negotiate(tls=old_client_context(cert, ssl.TLSVersion.TLSv1_2))
    modern.pub(topic, b"x")
    modern.close()


def test_go_style_client_options_take_the_1024_bit_certificate(
    nsqd_factory: NsqdFactory, tmp_path: Path, topic: str
) -> None:
    # the tools' --producer-opt/--consumer-opt tls_* options (go-nsq's), verifying the peer
    cert, key = weak_rsa_sha1_pair(tmp_path)
    server = nsqd_factory(tls_cert=cert, tls_key=key)
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=tls_context_from_go({"tls_root_ca_file": cert}))
    client.pub(topic, b"verified")
    client.close()


def test_tls_min_version_tls11_refuses_tls10(nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    cert, key = weak_rsa_sha1_pair(tmp_path)
    server = nsqd_factory(tls_cert=cert, tls_key=key, tls_min_version="tls1.1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tls10, tls11 = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
    assert_refused(SecureClient(server.tcp_address), old_client_context(cert, tls10))
    client = SecureClient(server.tcp_address)
    client.negotiate(tls=old_client_context(cert, tls11))
    assert client.ssl_version == "TLSv1.1"
    client.close()


def test_key_not_matching_the_certificate_is_fatal(
    nsqd_factory: NsqdFactory, certs: Certs, tmp_path: Path
) -> None:
    _, other_key = weak_rsa_sha1_pair(tmp_path)
    server = nsqd_factory(tls_cert=certs.server_cert, tls_key=other_key, wait=False)
    assert server.wait(15) == 1
    assert "FATAL: failed to instantiate nsqd - failed to build TLS config" in server.log_text()


def test_bad_certificate_path_fails_at_start(nsqd_factory: NsqdFactory, tmp_path: Path) -> None:
    server = nsqd_factory(
        tls_cert=str(tmp_path / "missing.pem"), tls_key=str(tmp_path / "k"), wait=False
    )
    assert server.wait(15) == 1
    assert "failed to build TLS config" in server.log_text()


# -- with compression -------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_tls_with_compression(
    nsqd_factory: NsqdFactory, certs: Certs, topic: str, compression: str
) -> None:
    server = tls_nsqd(nsqd_factory, certs)
    ctx = client_context(certs.ca)
    big = bytes(range(256)) * 400  # > 64 KiB: several snappy chunks
    producer = SecureClient(server.tcp_address)
    reply = producer.negotiate(tls=ctx, **{compression: True})
    assert isinstance(reply, dict) and reply["tls_v1"] and reply[compression]
    producer.pub(topic, big)
    producer.mpub(topic, [b"a" * 1000, b"b"])
    consumer = SecureClient(server.tcp_address)
    consumer.negotiate(tls=ctx, **{compression: True})
    consumer.sub(topic, "ch")
    consumer.rdy(5)
    assert [m.body for m in consumer.read_messages(3)] == [big, b"a" * 1000, b"b"]
    [entry] = [c for c in client_stats(server, topic) if c["state"] == 3]
    assert entry["tls"] and entry[compression]
    producer.close()
    consumer.close()


# -- pynsq ------------------------------------------------------------------------------------


def test_pynsq_over_tls(nsqd_factory: NsqdFactory, certs: Certs, topic: str) -> None:
    server = tls_nsqd(
        nsqd_factory, certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca
    )
    tls_options = {"ca_certs": certs.ca, "certfile": certs.client[0], "keyfile": certs.client[1]}
    bodies = [f"tls-{i}".encode() for i in range(10)]

    responses, received = pynsq_round_trip(
        server.tcp_address, topic, "tls", bodies, tls_v1=True, tls_options=tls_options
    )
    assert responses == [b"OK"] * len(bodies)
    assert received == bodies
