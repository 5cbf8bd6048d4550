"""The TLS context of the proxy's client listeners (the broker side is client.security).

TLS ends at the proxy on both sides: the proxy must read request headers. SASL is
carried inside Kafka frames, so it still authenticates the client to the broker.

Clients check the listener's certificate against the host they were told (the
advertised host of the bootstrap listener or of a broker): `CertificateNames` says
whether the certificate's subject alternative names cover a host, so that the proxy
can warn about a name its clients would refuse.
"""

from __future__ import annotations

import ipaddress
import ssl

from tierproxy.config import (
    Config,
    ConfigError,
    PROXY_SSL_CERTIFICATE_LOCATION,
    PROXY_SSL_KEY_LOCATION,
    PROXY_SSL_KEY_PASSWORD,
)

__all__ = ("CertificateNames", "listener_ssl_context")


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


class CertificateNames:
    """The DNS names and IP addresses of a certificate's subject alternative names."""

    def __init__(self, dns: list[str], ips: list[str]) -> None:
        self.dns = [name.lower().rstrip(".") for name in dns]
        self.ips = {ipaddress.ip_address(ip) for ip in ips}

    @classmethod
    def of(cls, config: Config) -> CertificateNames | None:
        """The names of the listeners' certificate (the first of the chain file); None
        without TLS listeners or when the file holds no certificate it can read."""
        from cryptography import x509

        location = config[PROXY_SSL_CERTIFICATE_LOCATION]
        if not location:
            return None
        try:
            with open(location, "rb") as f:
                certificate = x509.load_pem_x509_certificate(f.read())
        except (OSError, ValueError):
            return None  # the listener's context reports what is wrong with the file
        try:
            names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return cls([], [])
        return cls(names.get_values_for_type(x509.DNSName),
                   [str(ip) for ip in names.get_values_for_type(x509.IPAddress)])

    def covers(self, host: str) -> bool:
        """Whether a client checking the host name (RFC 6125) accepts the certificate for
        `host`: an IP entry for an address, else a DNS entry, a wildcard standing for
        exactly one left-most label."""
        try:
            return ipaddress.ip_address(host) in self.ips
        except ValueError:
            pass
        wanted = host.lower().rstrip(".")
        for name in self.dns:
            if name == wanted:
                return True
            if name.startswith("*.") and "." in wanted and wanted.split(".", 1)[1] == name[2:]:
                return True
        return False

    def __str__(self) -> str:
        return ", ".join([f"DNS:{n}" for n in self.dns] + [f"IP:{ip}" for ip in sorted(self.ips, key=str)]) or "none"
