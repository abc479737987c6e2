"""A throw-away certificate authority and a server certificate for 127.0.0.1/localhost."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TLSFiles", "make_tls_files"]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: ``ca`` signed ``cert`` (whose private key is ``key``)."""

    ca: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` that trusts :attr:`ca` (for a client to verify nsqd)."""
        return ssl.create_default_context(cafile=str(self.ca))

    def nsqd_flags(self) -> dict[str, object]:
        """nsqd's ``--tls-cert``, ``--tls-key`` and ``--tls-root-ca-file`` for these files."""
        return {
            "tls_cert": str(self.cert),
            "tls_key": str(self.key),
            "tls_root_ca_file": str(self.ca),
        }


def make_tls_files(directory: Path | str) -> TLSFiles:
    """Write ``ca.pem``, ``cert.pem`` and ``key.pem`` into ``directory``.

    The certificate is valid for ``127.0.0.1``, ``::1`` and ``localhost`` for a day.
    Needs the ``cryptography`` package (``pip install cryptography``).
    """
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise RuntimeError(
            "nsqpy.testing makes TLS certificates with the 'cryptography' package: "
            'pip install cryptography (or pip install "nsqpy[testing]")'
        ) from None

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("nsqpy.testing CA"))
        .issuer_name(name("nsqpy.testing CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = TLSFiles(
        ca=directory / "ca.pem", cert=directory / "cert.pem", key=directory / "key.pem"
    )
    files.ca.write_bytes(ca_cert.public_bytes(pem))
    files.cert.write_bytes(cert.public_bytes(pem))
    files.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files.key.chmod(0o600)
    return files
