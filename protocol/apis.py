"""Kafka API keys, error codes and ListOffsets special timestamps.

One source of truth each: API keys come from kio's schema index and error codes are
kio's ``ErrorCode``, so a kio upgrade brings new APIs and codes with it.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

__all__ = ("ApiKey", "ErrorCode", "OffsetSpec", "error_name")

if TYPE_CHECKING:
    # What a type checker sees: the keys the code names (tests/protocol/test_apis.py
    # checks each against the enum made from kio below).
    class ApiKey(enum.IntEnum):
        PRODUCE = 0
        FETCH = 1
        LIST_OFFSETS = 2
        METADATA = 3
        FIND_COORDINATOR = 10
        SASL_HANDSHAKE = 17
        API_VERSIONS = 18
        CREATE_TOPICS = 19
        DELETE_RECORDS = 21
        OFFSET_FOR_LEADER_EPOCH = 23
        SASL_AUTHENTICATE = 36
        DESCRIBE_CLUSTER = 60
else:
    # Kafka spells API names in upper snake case (ApiKeys.java: LIST_OFFSETS, ...).
    ApiKey = enum.IntEnum(
        "ApiKey",
        [(name.upper(), key) for key, name in sorted(api_key_map.items())],
        module=__name__,
    )
    ApiKey.__doc__ = "Kafka API keys known to kio, named as in Kafka's ApiKeys."


def error_name(code: int) -> str:
    """Kafka's name of an error code, e.g. ``error_name(1) == "OFFSET_OUT_OF_RANGE"``.

    Codes kio does not know (a newer broker) still get a printable name.
    """
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{code}"


class OffsetSpec(enum.IntEnum):
    """Special ListOffsets timestamps (ListOffsetsRequest.json, KIP-734, KIP-1005).

    Each is valid only from ``min_version`` of the ListOffsets API on; below it the
    broker answers UNSUPPORTED_VERSION for that partition.
    """

    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3
    EARLIEST_LOCAL_TIMESTAMP = -4
    LATEST_TIERED_TIMESTAMP = -5

    @property
    def min_version(self) -> int:
        return _MIN_VERSION[self]


_MIN_VERSION = {
    OffsetSpec.LATEST: 1,
    OffsetSpec.EARLIEST: 1,
    OffsetSpec.MAX_TIMESTAMP: 7,
    OffsetSpec.EARLIEST_LOCAL_TIMESTAMP: 8,
    OffsetSpec.LATEST_TIERED_TIMESTAMP: 9,
}
