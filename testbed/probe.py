"""Tiny Kafka requests over a plain socket: is the broker serving, which nodes does it know?

Hand-encoded so readiness checks need nothing but the standard library.
Requests use header v1 (api key, api version, correlation id, null client id);
these old response versions use header v0 (correlation id only).

- ApiVersions v0: empty body; response error code, then (api key, min, max)*.
- Metadata v1 with an empty topic array (no topics): response brokers
  (node id, host, port, nullable rack)* first, which is all we read.
"""

from __future__ import annotations

import socket
import struct

API_VERSIONS = 18
METADATA = 3
_CORRELATION_ID = 0x7E57


class ProbeError(Exception):
    pass


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ProbeError(f"connection closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def _round_trip(host: str, port: int, api_key: int, api_version: int, body: bytes,
                timeout: float) -> bytes:
    """The response payload after its correlation id."""
    request = struct.pack(">hhih", api_key, api_version, _CORRELATION_ID, -1) + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        payload = _read_exactly(sock, size)
    (correlation_id,) = struct.unpack_from(">i", payload, 0)
    if correlation_id != _CORRELATION_ID:
        raise ProbeError(f"correlation id {correlation_id}, expected {_CORRELATION_ID}")
    return payload[4:]


def api_versions(host: str, port: int, timeout: float = 2.0) -> dict[int, tuple[int, int]]:
    """Supported (min, max) versions by api key, as the broker answers ApiVersions v0.

    Raises OSError when nothing accepts the connection and ProbeError when the
    answer is not a successful ApiVersions response.
    """
    payload = _round_trip(host, port, API_VERSIONS, 0, b"", timeout)
    error_code, count = struct.unpack_from(">hi", payload, 0)
    if error_code != 0:
        raise ProbeError(f"ApiVersions error code {error_code}")
    versions = {}
    for i in range(count):
        key, min_version, max_version = struct.unpack_from(">hhh", payload, 6 + 6 * i)
        versions[key] = (min_version, max_version)
    return versions


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker this broker's Metadata lists."""
    payload = _round_trip(host, port, METADATA, 1, struct.pack(">i", 0), timeout)
    (count,) = struct.unpack_from(">i", payload, 0)
    offset, brokers = 4, []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", payload, offset)
        offset += 6
        broker_host = payload[offset:offset + host_len].decode()
        offset += host_len
        broker_port, rack_len = struct.unpack_from(">ih", payload, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, broker_host, broker_port))
    return brokers


def answers(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        api_versions(host, port, timeout)
    except (OSError, ProbeError, struct.error):
        return False
    return True
