"""Security settings from the configuration: validation names the key, files are read
at start, the same settings come out for aiokafka and librdkafka, and no secret is
ever printed."""

import datetime
import ipaddress
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from tierproxy.client.security import aiokafka_options, librdkafka_options, parse_jaas, security, ssl_context
from tierproxy.config import ConfigError, effective, parse

SECRET = "Sup3r-s3cret"
JAAS_SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
              f'username="alice" password="{SECRET}";')


def cfg(**values):
    return parse({"bootstrap.servers": "127.0.0.1:9092", **{k.replace("_", "."): v for k, v in values.items()}})


def _certificate(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tierproxy-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "c.pem", tmp_path / "k.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    p12 = tmp_path / "store.p12"
    p12.write_bytes(pkcs12.serialize_key_and_certificates(
        b"t", key, cert, None, serialization.BestAvailableEncryption(b"storepass")))
    return cert_path, key_path, p12


def test_plaintext_needs_nothing():
    settings = security(cfg())
    assert (settings.tls, settings.sasl, settings.ssl_context) == (False, False, None)
    assert aiokafka_options(cfg()) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("values, key", [
    ({"security.protocol": "SASL_SSL"}, "sasl.mechanism is required"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs credentials"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism='GSSAPI'"),
    ({"security.protocol": "TLS"}, "security.protocol='TLS'"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "a",
      "sasl.jaas.config": JAAS_SCRAM}, "give only one"),
    ({"ssl.ca.location": "a", "ssl.truststore.location": "b"}, "give only one"),
    ({"ssl.certificate.location": "a"}, "go together"),
    ({"ssl.truststore.type": "JKS"}, "ssl.truststore.type='JKS'"),
])
def test_bad_settings_name_the_key(values, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(".", r"\.")):
        parse({"bootstrap.servers": "h:1", **values})


def test_jaas_config_as_kafka_writes_it():
    credentials = parse_jaas(JAAS_SCRAM, "SCRAM-SHA-256")
    assert (credentials.username, credentials.password) == ("alice", SECRET)
    escaped = parse_jaas('org.apache.kafka.common.security.plain.PlainLoginModule required\n'
                         '  username="a\\"b" password=p;', "PLAIN")
    assert (escaped.username, escaped.password) == ('a"b', "p")


@pytest.mark.parametrize("text, message", [
    (JAAS_SCRAM, "needs org.apache.kafka.common.security.plain.PlainLoginModule"),
    ("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\";", "needs both"),
    ("username=a password=b", "not `<LoginModule"),
])
def test_bad_jaas_config_never_shows_the_password(text, message):
    with pytest.raises(ConfigError, match=message) as raised:
        parse_jaas(text, "PLAIN")
    assert SECRET not in str(raised.value)


def test_secrets_are_hidden_in_config_check():
    config = cfg(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": JAAS_SCRAM,
                    "ssl.key.password": SECRET})
    shown = {key.name: value for key, value, _ in effective(config)}
    assert shown["sasl.jaas.config"] == shown["ssl.key.password"] == "[hidden]"
    assert SECRET not in repr(security(config).credentials)


def test_tls_context_from_pem_and_pkcs12(tmp_path):
    cert, key, p12 = _certificate(tmp_path)
    pem = ssl_context(cfg(**{"security.protocol": "SSL", "ssl.ca.location": str(cert),
                             "ssl.certificate.location": str(cert), "ssl.key.location": str(key)}))
    assert pem.verify_mode == ssl.CERT_REQUIRED and pem.check_hostname
    assert [c["subject"] for c in pem.get_ca_certs()] == [((("commonName", "tierproxy-test"),),)]
    store = ssl_context(cfg(**{"security.protocol": "SSL", "ssl.truststore.location": str(p12),
                               "ssl.truststore.type": "PKCS12", "ssl.truststore.password": "storepass",
                               "ssl.keystore.location": str(p12), "ssl.keystore.type": "PKCS12",
                               "ssl.keystore.password": "storepass",
                               "ssl.endpoint.identification.algorithm": ""}))
    assert len(store.get_ca_certs()) == 1 and not store.check_hostname


def test_tls_file_errors_name_the_key_not_the_password(tmp_path):
    cert, key, p12 = _certificate(tmp_path)
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location=.*missing\.pem: cannot read"):
        ssl_context(cfg(**{"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "missing.pem")}))
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location=.*k\.pem: no PEM CA certificate"):
        ssl_context(cfg(**{"security.protocol": "SSL", "ssl.ca.location": str(key)}))
    with pytest.raises(ConfigError, match=r"ssl\.truststore\.password\) is wrong") as raised:
        ssl_context(cfg(**{"security.protocol": "SSL", "ssl.truststore.location": str(p12),
                           "ssl.truststore.type": "PKCS12", "ssl.truststore.password": SECRET}))
    assert SECRET not in str(raised.value)


def test_the_same_security_for_aiokafka_and_librdkafka(tmp_path):
    cert, key, _ = _certificate(tmp_path)
    config = cfg(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
                    "sasl.password": SECRET, "ssl.ca.location": str(cert), "ssl.certificate.location": str(cert),
                    "ssl.key.location": str(key)})
    options = aiokafka_options(config)
    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("bob", SECRET)
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert librdkafka_options(config) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
        "sasl.password": SECRET, "ssl.ca.location": str(cert), "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key), "ssl.endpoint.identification.algorithm": "https"}
