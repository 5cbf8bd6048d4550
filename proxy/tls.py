"""TLS contexts of the proxy's listeners and of its connections to the brokers.

TLS ends at the proxy on both sides: the proxy must read request headers. SASL is
carried inside Kafka frames, so it still authenticates the client to the broker.
"""

from __future__ import annotations

import ssl

from config import Config, ConfigError

__all__ = ("broker_ssl_context", "listener_ssl_context")


def listener_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server context of the client listeners; None for plaintext."""
    certificate = config["proxy.ssl.certificate.location"]
    if not certificate:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certificate, config["proxy.ssl.key.location"] or None,
                                config["proxy.ssl.key.password"] or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"proxy.ssl.certificate.location={certificate}: cannot load certificate and key: {e}") from e
    return context


def broker_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The client context of the upstream connections; None for plaintext."""
    if not config["broker.ssl.enable"]:
        return None
    ca = config["broker.ssl.ca.location"]
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"broker.ssl.ca.location={ca}: cannot load CA certificates: {e}") from e
    if not config["broker.ssl.endpoint.identification.enable"]:
        context.check_hostname = False
    return context
