"""The per-segment manifest: written last by a copy, it marks the copy complete.

It lists every object the copy wrote with its size and CRC-32C (Castagnoli, the
checksum Kafka's record batches use), and the segment's offsets. A segment whose
manifest is missing was never copied completely and is never served; an object
that disagrees with its manifest entry is corrupt.

Encoded as compact JSON so an operator can read it with any S3 tool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import crc32c

from .errors import CorruptRemoteSegment

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    size: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """`objects` maps an object's extension (`log`, `index`, ...) to its entry."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    objects: Mapping[str, ObjectEntry] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Frozen all the way down: a cached manifest is shared between readers.
        object.__setattr__(self, "objects", MappingProxyType(dict(self.objects)))

    def entry(self, extension: str) -> ObjectEntry | None:
        return self.objects.get(extension)

    def encode(self) -> bytes:
        body = {
            "version": MANIFEST_VERSION,
            "segment_id": str(self.segment_id),
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "objects": {ext: {"size": e.size, "crc32c": e.crc32c} for ext, e in sorted(self.objects.items())},
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, *, name: str = "manifest") -> Manifest:
        """Parse a manifest; anything malformed is a CorruptRemoteSegment naming `name`."""
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            version = body["version"]
            if version != MANIFEST_VERSION:
                raise ValueError(f"unknown version {version!r}")
            objects = {}
            for ext, entry in body["objects"].items():
                objects[ext] = ObjectEntry(_non_negative_int(entry["size"]), _crc(entry["crc32c"]))
            return cls(
                segment_id=uuid.UUID(body["segment_id"]),
                start_offset=_non_negative_int(body["start_offset"]),
                end_offset=_non_negative_int(body["end_offset"]),
                objects=objects,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptRemoteSegment(f"{name} is malformed: {e}") from e


def _non_negative_int(value: object) -> int:
    # bool is an int subclass; a manifest with `true` for a size is corrupt, not 1.
    if type(value) is not int or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _crc(value: object) -> int:
    value = _non_negative_int(value)
    if value > 0xFFFFFFFF:
        raise ValueError(f"CRC-32C out of range: {value}")
    return value


class Crc32cAccumulator:
    """CRC-32C and size of a byte stream fed in chunks."""

    __slots__ = ("crc", "size")

    def __init__(self) -> None:
        self.crc = 0
        self.size = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self.crc = crc32c.crc32c(chunk, self.crc)
        self.size += len(chunk)

    def entry(self) -> ObjectEntry:
        return ObjectEntry(self.size, self.crc)


def entry_of(data: bytes | memoryview) -> ObjectEntry:
    return ObjectEntry(len(data), crc32c.crc32c(data))
