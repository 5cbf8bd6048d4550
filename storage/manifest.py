"""The per-segment manifest: written last by a copy, it marks the copy complete.

It lists every object the copy wrote with its size and CRC-32C (Castagnoli, the
checksum Kafka's record batches use), and the segment's offsets. A segment whose
manifest is missing was never copied completely and is never served; an object
that disagrees with its manifest entry is corrupt. Each entry also holds the CRC-32C of
every BLOCK_BYTES block, so a ranged read is checked block by block before it is used.

An encrypted segment (storage.encryption) has manifest version 2 with an `encryption`
block: the cipher, its chunk size, the id of the key-encryption key and the data key
wrapped by it. Its entries give the size of the content (what Kafka wrote) and the
CRC-32C of the stored ciphertext, and no block CRC-32Cs: a CRC of plaintext tells
something about the plaintext, and each chunk's GCM tag checks it instead. Plaintext
segments keep version 1, so readers that predate encryption still read them and refuse
encrypted ones rather than serve ciphertext.

Encoded as compact JSON so an operator can read it with any S3 tool.
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import crc32c

from .errors import CorruptRemoteSegment

MANIFEST_VERSION = 1
ENCRYPTED_MANIFEST_VERSION = 2
# Objects are also checksummed in blocks of this size, so that a ranged read (the proxy's
# chunks, remote.log.chunk.size.bytes: 4 MiB by default, a multiple) is verified before it
# is used. Recorded with each entry: a later size does not misread older manifests.
BLOCK_BYTES = 256 * 1024
_BLOCK_CRC = struct.Struct(">I")
CIPHER = "AES-256-GCM"
TAG_BYTES = 16  # GCM's authentication tag after each chunk


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """`size` is the object's content (Kafka's file); `crc32c` is of the bytes stored, which
    are the content itself unless the segment is encrypted."""

    size: int
    crc32c: int
    # CRC-32C of each `block_bytes` block; empty in manifests written before blocks
    # existed, whose ranged reads get the size check only. Not part of equality: a
    # whole-object check compares size and CRC-32C.
    blocks: tuple[int, ...] = field(default=(), compare=False)
    block_bytes: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class SegmentEncryption:
    """How the objects of an encrypted segment are stored: each object is its content in
    `chunk_bytes` chunks, each sealed with AES-256-GCM (ciphertext, then its 16-byte tag)
    under the segment's data key, which key `key_id` wraps (`wrapped_data_key`)."""

    key_id: str
    wrapped_data_key: bytes
    chunk_bytes: int

    def chunks(self, size: int) -> int:
        """Chunks of an object of `size` bytes; an empty one is one empty chunk (its tag
        alone), so that even emptiness is authenticated."""
        return max(1, -(-size // self.chunk_bytes))

    def stored_size(self, size: int) -> int:
        return size + TAG_BYTES * self.chunks(size)


@dataclass(frozen=True, slots=True)
class Manifest:
    """`objects` maps an object's extension (`log`, `index`, ...) to its entry."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    objects: Mapping[str, ObjectEntry] = field(default_factory=dict)
    encryption: SegmentEncryption | None = None

    def __post_init__(self) -> None:
        # Frozen all the way down: a cached manifest is shared between readers.
        object.__setattr__(self, "objects", MappingProxyType(dict(self.objects)))

    def entry(self, extension: str) -> ObjectEntry | None:
        return self.objects.get(extension)

    def stored_size(self, entry: ObjectEntry) -> int:
        """Bytes the object takes in the store."""
        return entry.size if self.encryption is None else self.encryption.stored_size(entry.size)

    def encode(self) -> bytes:
        body: dict = {
            "version": MANIFEST_VERSION if self.encryption is None else ENCRYPTED_MANIFEST_VERSION,
            "segment_id": str(self.segment_id),
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "objects": {ext: _encode_entry(e) for ext, e in sorted(self.objects.items())},
        }
        if self.encryption is not None:
            body["encryption"] = {
                "cipher": CIPHER,
                "chunk_bytes": self.encryption.chunk_bytes,
                "key_id": self.encryption.key_id,
                "wrapped_data_key": base64.b64encode(self.encryption.wrapped_data_key).decode(),
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
            if version == MANIFEST_VERSION:
                encryption = None
            elif version == ENCRYPTED_MANIFEST_VERSION:
                encryption = _decode_encryption(body["encryption"])
            else:
                raise ValueError(f"unknown version {version!r}")
            if encryption is None and "encryption" in body:
                raise ValueError(f"version {version} has no encryption")
            objects = {}
            for ext, entry in body["objects"].items():
                objects[ext] = _decode_entry(entry)
                if encryption is not None and objects[ext].blocks:
                    raise ValueError(f"encrypted object {ext} has plaintext block checksums")
            return cls(
                segment_id=uuid.UUID(body["segment_id"]),
                start_offset=_non_negative_int(body["start_offset"]),
                end_offset=_non_negative_int(body["end_offset"]),
                objects=objects,
                encryption=encryption,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptRemoteSegment(f"{name} is malformed: {e}") from e


def _decode_encryption(block: dict) -> SegmentEncryption:
    if block["cipher"] != CIPHER:
        raise ValueError(f"unknown cipher {block['cipher']!r}")
    key_id = block["key_id"]
    if not isinstance(key_id, str) or not key_id:
        raise ValueError(f"bad key id {key_id!r}")
    chunk_bytes = _non_negative_int(block["chunk_bytes"])
    if chunk_bytes == 0:
        raise ValueError("chunk_bytes is 0")
    return SegmentEncryption(key_id, base64.b64decode(block["wrapped_data_key"], validate=True), chunk_bytes)


def _encode_entry(entry: ObjectEntry) -> dict:
    out: dict = {"size": entry.size, "crc32c": entry.crc32c}
    if entry.blocks:
        out["block_bytes"] = entry.block_bytes
        out["blocks"] = base64.b64encode(b"".join(_BLOCK_CRC.pack(c) for c in entry.blocks)).decode()
    return out


def _decode_entry(entry: dict) -> ObjectEntry:
    size, crc = _non_negative_int(entry["size"]), _crc(entry["crc32c"])
    if "blocks" not in entry:
        return ObjectEntry(size, crc)
    block_bytes = _non_negative_int(entry["block_bytes"])
    packed = base64.b64decode(entry["blocks"], validate=True)
    blocks = tuple(c for (c,) in _BLOCK_CRC.iter_unpack(packed)) if len(packed) % 4 == 0 else None
    if block_bytes == 0 or blocks is None or len(blocks) != -(-size // block_bytes):
        raise ValueError(f"block checksums do not cover {size} bytes in blocks of {block_bytes}")
    return ObjectEntry(size, crc, blocks, block_bytes)


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
    """CRC-32C, size and block CRC-32Cs of a byte stream fed in chunks."""

    __slots__ = ("_block", "_blocks", "_filled", "crc", "size")

    def __init__(self) -> None:
        self.crc = 0
        self.size = 0
        self._blocks: list[int] = []
        self._block = 0
        self._filled = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self.crc = crc32c.crc32c(chunk, self.crc)
        self.size += len(chunk)
        view = memoryview(chunk).cast("B")
        while view:
            part = view[:BLOCK_BYTES - self._filled]
            self._block = crc32c.crc32c(part, self._block)
            self._filled += len(part)
            view = view[len(part):]
            if self._filled == BLOCK_BYTES:
                self._blocks.append(self._block)
                self._block = self._filled = 0

    def entry(self) -> ObjectEntry:
        blocks = self._blocks + [self._block] if self._filled else list(self._blocks)
        return ObjectEntry(self.size, self.crc, tuple(blocks), BLOCK_BYTES)


def entry_of(data: bytes | memoryview) -> ObjectEntry:
    accumulator = Crc32cAccumulator()
    accumulator.update(data)
    return accumulator.entry()
