"""A throwaway certificate authority for the secured testbed cluster.

Generated at every start, so no key material lives in the repository. All
files are PEM, which Kafka (``ssl.keystore.type=PEM``), librdkafka and
Python's ``ssl`` read alike. Keys are EC P-256: generating them costs
milliseconds where RSA costs a noticeable part of the start-up, and every
client we test with speaks ECDSA.

- ``ca.pem``: the CA certificate clients and the broker trust.
- ``broker.pem``/``broker-key.pem``: the broker certificate (SANs
  ``IP:127.0.0.1`` and ``DNS:localhost``, so hostname verification passes)
  and its unencrypted PKCS#8 key; ``broker-keystore.pem`` holds both plus
  the CA, which is what Kafka's ``ssl.keystore.location`` wants.
- ``client.pem``/``client-key.pem``: a client certificate (CN ``tierproxy``)
  for mutual TLS.
- ``other-ca.pem``: a CA that signed nothing here, for clients that must fail
  to verify the broker.
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

CLIENT_COMMON_NAME = "tierproxy"
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    broker_cert: Path
    broker_key: Path
    broker_keystore: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


@dataclass(frozen=True)
class _Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tierproxy testbed"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             issuer_key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    # Backdated a little: the JVM and OpenSSL reject a certificate "not yet valid"
    # when clocks differ by a second.
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                issuer_key.public_key()), critical=False))


def _new_ca(common_name: str) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (_builder(name, name, key, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _Issued(cert, key)


def _new_leaf(ca: _Issued, common_name: str, usage: x509.ObjectIdentifier,
              sans: list[x509.GeneralName] | None = None) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(_name(common_name), ca.cert.subject, key, ca.key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(
                   digital_signature=True, key_cert_sign=False, crl_sign=False,
                   content_commitment=False, key_encipherment=False, data_encipherment=False,
                   key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _Issued(builder.sign(ca.key, hashes.SHA256()), key)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # Unencrypted PKCS#8: Kafka's PEM keystore reads no other unencrypted form.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def write_tls_files(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                    client_common_name: str = CLIENT_COMMON_NAME) -> TlsFiles:
    """A fresh CA, broker and client certificates, and an unrelated CA, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    ca = _new_ca("tierproxy testbed CA")
    broker = _new_leaf(ca, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, sans)
    client = _new_leaf(ca, client_common_name, ExtendedKeyUsageOID.CLIENT_AUTH)
    other = _new_ca("tierproxy testbed untrusted CA")
    chain = _cert_pem(broker.cert) + _cert_pem(ca.cert)
    return TlsFiles(
        ca=_write(directory / "ca.pem", _cert_pem(ca.cert)),
        broker_cert=_write(directory / "broker.pem", chain),
        broker_key=_write(directory / "broker-key.pem", _key_pem(broker.key), private=True),
        broker_keystore=_write(directory / "broker-keystore.pem",
                               _key_pem(broker.key) + chain, private=True),
        client_cert=_write(directory / "client.pem", _cert_pem(client.cert)),
        client_key=_write(directory / "client-key.pem", _key_pem(client.key), private=True),
        other_ca=_write(directory / "other-ca.pem", _cert_pem(other.cert)),
    )
