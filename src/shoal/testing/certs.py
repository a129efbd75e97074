"""Throw-away PKI for the TLS tests, generated into a test's tmp_path (never committed).

One CA signs a server certificate (for 127.0.0.1 and localhost, good for server and client
auth, so the same file serves a node's ports and its calls to peers) and a client certificate;
a second, unrelated CA signs a certificate nobody trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path  #: the CA certificate every node and client trusts
    server: Pair  #: 127.0.0.1 / localhost, signed by ``ca``
    client: Pair  #: a client certificate signed by ``ca``
    stranger: Pair  #: a client certificate signed by another CA
    stranger_ca: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(cn: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_pair(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    key_path = directory / f"{name}.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Pair(_write_cert(directory / f"{name}.crt", cert), key_path)


def make_pki(directory: Path) -> Pki:
    """A CA, a server and a client certificate it signed, and a stranger from another CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("shoal test CA")
    other, other_key = _ca("somebody else's CA")
    server = _write_pair(directory, "server", *_leaf("shoal node", ca, ca_key))
    client = _write_pair(directory, "client", *_leaf("sdk client", ca, ca_key))
    stranger = _write_pair(directory, "stranger", *_leaf("stranger", other, other_key))
    return Pki(_write_cert(directory / "ca.crt", ca), server, client, stranger,
               _write_cert(directory / "stranger-ca.crt", other))


def encrypted_copy(pair: Pair, directory: Path, password: str) -> Pair:
    """The same certificate with its key encrypted by ``password``."""
    key = serialization.load_pem_private_key(pair.key.read_bytes(), None)
    key_path = directory / f"{pair.key.stem}-encrypted.key"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.BestAvailableEncryption(password.encode())))
    return Pair(pair.cert, key_path)
