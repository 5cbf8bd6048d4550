"""The TLS context of the proxy's client listeners (the broker side is client.security).

TLS ends at the proxy on both sides: the proxy must read request headers. SASL is
carried inside Kafka frames, so it still authenticates the client to the broker.
"""

from __future__ import annotations

import ssl

from tierproxy.config import (
    Config,
    ConfigError,
    PROXY_SSL_CERTIFICATE_LOCATION,
    PROXY_SSL_KEY_LOCATION,
    PROXY_SSL_KEY_PASSWORD,
)

__all__ = ("listener_ssl_context",)


def listener_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server context of the client listeners; None for plaintext."""
    certificate = config[PROXY_SSL_CERTIFICATE_LOCATION]
    if not certificate:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certificate, config[PROXY_SSL_KEY_LOCATION] or None,
                                config[PROXY_SSL_KEY_PASSWORD] or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"proxy.ssl.certificate.location={certificate}: cannot load certificate and key: {e}") from e
    return context
