"""How tierproxy reaches a secured cluster: the TLS context and SASL credentials of its
own connections, from Kafka's client keys in the configuration, and the same settings
spelled for the other clients it drives (aiokafka for the metadata topic, librdkafka
for `tierproxy loadtest`).

Every error is a ConfigError naming the key to fix; no message carries a secret.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

from tierproxy.config import (
    ConfigError,
    SASL_JAAS_CONFIG,
    SASL_MECHANISM,
    SASL_PASSWORD,
    SASL_USERNAME,
    SECURITY_PROTOCOL,
    SSL_CA_LOCATION,
    SSL_CERTIFICATE_LOCATION,
    SSL_ENDPOINT_IDENTIFICATION_ALGORITHM,
    SSL_KEYSTORE_LOCATION,
    SSL_KEYSTORE_PASSWORD,
    SSL_KEYSTORE_TYPE,
    SSL_KEY_LOCATION,
    SSL_KEY_PASSWORD,
    SSL_TRUSTSTORE_LOCATION,
    SSL_TRUSTSTORE_PASSWORD,
    SSL_TRUSTSTORE_TYPE,
    Settings,
)

from .sasl import Credentials

__all__ = ("Security", "aiokafka_options", "librdkafka_options", "parse_jaas", "security", "ssl_context")

_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\s*(?P<options>.*?)\s*;?\s*$",
                   re.DOTALL)
_JAAS_OPTION = re.compile(r'\s*(?P<key>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class Security:
    """The security of one cluster's connections, ready to use."""

    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    credentials: Credentials | None = None
    ssl_context: ssl.SSLContext | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


PLAINTEXT = Security()


def parse_jaas(text: str, mechanism: str) -> Credentials:
    """username and password of a `sasl.jaas.config` line as Kafka's clients write it."""
    match = _JAAS.match(text)
    if match is None:
        raise ConfigError("sasl.jaas.config: not `<LoginModule class> required username=\"...\" password=\"...\";`")
    expected = _LOGIN_MODULES.get(mechanism)
    if expected is not None and match["module"] != expected:
        raise ConfigError(f"sasl.jaas.config: sasl.mechanism={mechanism} needs {expected}, not {match['module']}")
    options: dict[str, str] = {}
    rest = match["options"]
    while rest.strip():
        option = _JAAS_OPTION.match(rest)
        if option is None:
            raise ConfigError("sasl.jaas.config: options must be key=\"value\" pairs")
        value = option["quoted"] if option["quoted"] is not None else option["bare"]
        options[option["key"]] = re.sub(r"\\(.)", r"\1", value)
        rest = rest[option.end():]
    if "username" not in options or "password" not in options:
        raise ConfigError("sasl.jaas.config: needs both username and password")
    return Credentials(options["username"], options["password"])


def _credentials(config: Settings) -> Credentials:
    if config[SASL_JAAS_CONFIG]:
        return parse_jaas(config[SASL_JAAS_CONFIG], config[SASL_MECHANISM])
    return Credentials(config[SASL_USERNAME], config[SASL_PASSWORD])


def _pkcs12(path: str, password: str, key: str) -> tuple[Any, Any, list[Any]]:
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot read: {e.strerror}") from None
    try:
        return pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError:
        raise ConfigError(f"{key}={path}: not a PKCS12 file, or its password "
                          f"({key.rsplit('.', 1)[0]}.password) is wrong") from None


def _pem(certificates: list[Any]) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certificates)


def _load_trust(context: ssl.SSLContext, config: Settings) -> None:
    if config[SSL_CA_LOCATION]:
        key, path, kind = "ssl.ca.location", config[SSL_CA_LOCATION], "PEM"
    elif config[SSL_TRUSTSTORE_LOCATION]:
        key, path, kind = "ssl.truststore.location", config[SSL_TRUSTSTORE_LOCATION], config[SSL_TRUSTSTORE_TYPE]
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        return
    try:
        if kind == "PKCS12":
            _, certificate, others = _pkcs12(path, config[SSL_TRUSTSTORE_PASSWORD], key)
            context.load_verify_locations(cadata=_pem([c for c in [certificate, *others] if c is not None]))
        else:
            context.load_verify_locations(cafile=path)
    except ssl.SSLError as e:  # before OSError, of which it is one
        raise ConfigError(f"{key}={path}: no {kind} CA certificate in it ({e.reason or e})") from None
    except OSError as e:
        raise ConfigError(f"{key}={path}: cannot read: {e.strerror}") from None


def _load_identity(context: ssl.SSLContext, config: Settings) -> None:
    """The client certificate for mutual TLS, if one is configured."""
    password = config[SSL_KEY_PASSWORD] or None
    if config[SSL_CERTIFICATE_LOCATION]:
        key, certificate, private_key = ("ssl.certificate.location", config[SSL_CERTIFICATE_LOCATION],
                                         config[SSL_KEY_LOCATION])
    elif config[SSL_KEYSTORE_LOCATION] and config[SSL_KEYSTORE_TYPE] == "PEM":
        key, certificate, private_key = "ssl.keystore.location", config[SSL_KEYSTORE_LOCATION], None
    elif config[SSL_KEYSTORE_LOCATION]:
        _pkcs12_identity(context, config)
        return
    else:
        return
    try:
        context.load_cert_chain(certificate, private_key, password)
    except ssl.SSLError as e:  # before OSError, of which it is one
        raise ConfigError(f"{key}={certificate}: cannot load the client certificate and key ({e.reason or e}); "
                          "check ssl.key.location and ssl.key.password") from None
    except OSError as e:
        raise ConfigError(f"{key}={certificate}: cannot read: {e.strerror}") from None


def _pkcs12_identity(context: ssl.SSLContext, config: Settings) -> None:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    path = config[SSL_KEYSTORE_LOCATION]
    private_key, certificate, chain = _pkcs12(path, config[SSL_KEYSTORE_PASSWORD], "ssl.keystore.location")
    if private_key is None or certificate is None:
        raise ConfigError(f"ssl.keystore.location={path}: holds no private key and certificate")
    # ssl loads certificates only from files: a private file, removed once loaded.
    with tempfile.TemporaryDirectory(prefix="tierproxy-keystore-") as directory:
        pem = os.path.join(directory, "identity.pem")
        descriptor = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode())
            f.write(_pem([certificate, *chain]))
        context.load_cert_chain(pem)


def ssl_context(config: Settings) -> ssl.SSLContext | None:
    """The TLS context of connections to the brokers; None unless SSL or SASL_SSL."""
    if config[SECURITY_PROTOCOL] not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = config[SSL_ENDPOINT_IDENTIFICATION_ALGORITHM] == "https"
    context.verify_mode = ssl.CERT_REQUIRED
    _load_trust(context, config)
    _load_identity(context, config)
    return context


def security(config: Settings) -> Security:
    """Everything tierproxy's own connections need, checked now (files read, JAAS parsed)."""
    protocol = config[SECURITY_PROTOCOL]
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    return Security(
        protocol=protocol,
        mechanism=config[SASL_MECHANISM] if sasl else "",
        credentials=_credentials(config) if sasl else None,
        ssl_context=ssl_context(config),
    )


def aiokafka_options(config: Settings) -> dict[str, Any]:
    """Keyword arguments of aiokafka's clients for the same security."""
    settings = security(config)
    options: dict[str, Any] = {"security_protocol": settings.protocol}
    if settings.ssl_context is not None:
        options["ssl_context"] = settings.ssl_context
    if settings.credentials is not None:
        options.update(sasl_mechanism=settings.mechanism, sasl_plain_username=settings.credentials.username,
                       sasl_plain_password=settings.credentials.password)
    return options


def librdkafka_options(config: Settings) -> dict[str, str]:
    """librdkafka (confluent-kafka) settings for the same security."""
    settings = security(config)  # validates files and credentials first
    options = {"security.protocol": settings.protocol}
    if settings.credentials is not None:
        options.update({"sasl.mechanism": settings.mechanism, "sasl.username": settings.credentials.username,
                        "sasl.password": settings.credentials.password})
    if settings.tls:
        if config[SSL_TRUSTSTORE_LOCATION] and config[SSL_TRUSTSTORE_TYPE] != "PEM":
            raise ConfigError("ssl.truststore.type=PKCS12: librdkafka reads CA certificates only as PEM; "
                              "give ssl.ca.location")
        ca = config[SSL_CA_LOCATION] or config[SSL_TRUSTSTORE_LOCATION]
        if ca:
            options["ssl.ca.location"] = ca
        if config[SSL_CERTIFICATE_LOCATION]:
            options["ssl.certificate.location"] = config[SSL_CERTIFICATE_LOCATION]
            options["ssl.key.location"] = config[SSL_KEY_LOCATION]
        elif config[SSL_KEYSTORE_LOCATION] and config[SSL_KEYSTORE_TYPE] == "PEM":
            options["ssl.certificate.location"] = options["ssl.key.location"] = config[SSL_KEYSTORE_LOCATION]
        elif config[SSL_KEYSTORE_LOCATION]:
            options["ssl.keystore.location"] = config[SSL_KEYSTORE_LOCATION]
            options["ssl.keystore.password"] = config[SSL_KEYSTORE_PASSWORD]
        if config[SSL_KEY_PASSWORD]:
            options["ssl.key.password"] = config[SSL_KEY_PASSWORD]
        options["ssl.endpoint.identification.algorithm"] = config[SSL_ENDPOINT_IDENTIFICATION_ALGORITHM] or "none"
    return options
