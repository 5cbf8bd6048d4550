"""Kafka requests as raw bytes on a plain socket, for checks that must control every
byte a client sends: pipelined writes, frames cut anywhere, SASL by hand."""

from __future__ import annotations

import socket
import struct

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.framing import FrameDecoder
from tierproxy.protocol.headers import encode_request_header

CLIENT_ID = "testbed-raw"


def frame(body: bytes) -> bytes:
    """A frame: the int32 size, then ``body``."""
    return struct.pack(">i", len(body)) + body


def api_versions(correlation_id: int) -> bytes:
    return frame(encode_request_header(ApiKey.API_VERSIONS, 0, correlation_id, CLIENT_ID, 1))


def sasl_handshake(mechanism: str, correlation_id: int) -> bytes:
    name = mechanism.encode()
    return frame(encode_request_header(ApiKey.SASL_HANDSHAKE, 1, correlation_id, CLIENT_ID, 1)
                 + struct.pack(">h", len(name)) + name)


def sasl_plain(user: str, password: str, correlation_id: int) -> bytes:
    """SaslAuthenticate v1 with a PLAIN token (RFC 4616)."""
    token = b"\x00" + user.encode() + b"\x00" + password.encode()
    return frame(encode_request_header(ApiKey.SASL_AUTHENTICATE, 1, correlation_id, CLIENT_ID, 1)
                 + struct.pack(">i", len(token)) + token)


def plain_login(user: str, password: str) -> bytes:
    """The two frames of a SASL/PLAIN login (correlation ids 1 and 2)."""
    return sasl_handshake("PLAIN", 1) + sasl_plain(user, password, 2)


def read_frames(sock: socket.socket, count: int, timeout: float = 20) -> list[bytes]:
    """The next ``count`` frame bodies; AssertionError if the peer closes first."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    out: list[bytes] = []
    while len(out) < count:
        data = sock.recv(1 << 16)
        assert data, f"connection closed after {len(out)} responses"
        out.extend(bytes(body) for body in decoder.feed(data))
    return out


def closed_by_peer(sock: socket.socket, timeout: float = 10) -> bool:
    """True once the peer closed (EOF or a reset) with no bytes sent before; False on
    bytes or on the timeout."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
