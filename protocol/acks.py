"""Whether the broker answers a request: every request gets a response except a Produce
with ``acks=0`` (Kafka's ``ProduceRequest.acks``; the broker then sends nothing back).

A connection that reserves a response slot for each request it forwards must not
reserve one for such a Produce, or every later response would wait behind it.

Field layout (Kafka's ProduceRequest.json): v0-v2 start with ``acks``; v3+ put the
nullable ``transactional_id`` before it; v9+ are flexible (compact string, and a
request header with tagged fields).
"""

from __future__ import annotations

import struct

from typing import TYPE_CHECKING

from .apis import ApiKey
from .errors import DecodeError
from .headers import RequestHeader, read_unsigned_varint, skip_tagged_fields

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ("expects_response", "produce_acks")

_INT16 = struct.Struct(">h")
_TRANSACTIONAL_ID_VERSION = 3
_FIRST_FLEXIBLE_VERSION = 9


def expects_response(header: RequestHeader, body: Buffer) -> bool:
    """False for a Produce request with acks=0, True for every other request. ``body``
    is the whole frame body (request header included). Raises DecodeError for a Produce
    request too short to hold its acks."""
    return header.api_key != ApiKey.PRODUCE or produce_acks(header, body) != 0


def produce_acks(header: RequestHeader, body: Buffer) -> int:
    """``acks`` of a Produce request frame body (request header included)."""
    view = memoryview(body).cast("B")
    pos = header.header_size
    end = len(view)
    version = header.api_version
    flexible = version >= _FIRST_FLEXIBLE_VERSION
    if flexible and header.header_version is None:
        # A version kio does not know: peeking the header left its tagged fields unread.
        pos = skip_tagged_fields(view, pos, end)
    if version >= _TRANSACTIONAL_ID_VERSION:
        if flexible:
            length_plus_one, pos = read_unsigned_varint(view, pos, end)
            pos += max(length_plus_one - 1, 0)
        else:
            if pos + _INT16.size > end:
                raise DecodeError(f"Produce v{version} request ends inside its transactional id")
            (length,) = _INT16.unpack_from(view, pos)
            pos += _INT16.size + max(length, 0)
    if pos + _INT16.size > end:
        raise DecodeError(f"Produce v{version} request ends before acks")
    return _INT16.unpack_from(view, pos)[0]
