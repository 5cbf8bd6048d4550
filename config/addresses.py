"""Broker addresses as Kafka writes them: `host:port`, `[ipv6]:port`."""

from __future__ import annotations

__all__ = ("parse_host_port",)


def parse_host_port(text: str) -> tuple[str, int]:
    """(host, port) of `host:port` or `[ipv6]:port` (surrounding blanks ignored).

    As Kafka's `Utils.getHost`/`getPort`, an IPv6 address without brackets is split at its
    last colon. Raises ValueError naming the text when there is no host or no port in
    0..65535.
    """
    address = text.strip()
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket:
            raise ValueError(f"{text!r} is not host:port: no ']' after the IPv6 address")
        if not rest.startswith(":"):
            raise ValueError(f"{text!r} is not host:port: no ':port' after the IPv6 address")
        port = rest[1:]
    else:
        host, colon, port = address.rpartition(":")
        if not colon:
            raise ValueError(f"{text!r} is not host:port: no port")
    if not host:
        raise ValueError(f"{text!r} is not host:port: no host")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{text!r} is not host:port: the port must be a number from 0 to 65535")
    return host, int(port)
