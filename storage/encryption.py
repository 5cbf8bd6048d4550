"""Envelope encryption of remote segments.

Each copy of a segment gets a data key of its own: 32 random bytes, never stored in the
clear. A key-encryption key of the configuration (`remote.log.storage.encryption.keys`;
new segments use `remote.log.storage.encryption.active.key`) wraps it, and the manifest
records the wrapped data key beside the id of the key that wrapped it
(`manifest.SegmentEncryption`). A retried copy draws a new data key.

Every object of an encrypted segment is its content in chunks of `chunk_bytes`
(manifest.BLOCK_BYTES, 256 KiB, of which the proxy's chunks are a multiple), each sealed
with AES-256-GCM under the data key and stored as its ciphertext followed by its tag:

    chunk 0 | tag 0 | chunk 1 | tag 1 | ... | last chunk (may be short) | its tag

Chunk i starts at byte i * (chunk_bytes + 16) of the object, so a ranged read fetches
and decrypts only the chunks it covers. An empty object is one empty chunk: its tag.

- nonce (96 bits): the object's number (32 bits, OBJECT_NUMBERS) and the chunk's index
  (64 bits). A data key seals one copy of one segment only, so no nonce repeats under it.
- associated data: a label, the segment id (16 bytes), the object's extension, the chunk
  index and the object's content size. A chunk moved to another position, object or
  segment, or an object cut short at a chunk boundary, fails its tag.
- wrapped data key: nonce (12 random bytes) | ciphertext (32) | tag (16), AES-256-GCM
  under the key-encryption key, with the segment id and the key's id as associated data.

Decryption happens in the RemoteStorageManager: everything above it sees plaintext. No
key material is ever printed, logged or put into an error message.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import NoReturn

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tierproxy.config import Settings, REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY, REMOTE_LOG_STORAGE_ENCRYPTION_KEYS, \
    REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED, ConfigError, key_files

from .errors import CorruptRemoteSegment, DecryptionFailed, EncryptionKeyNotFound, UnencryptedSegment, WrongEncryptionKey
from .manifest import BLOCK_BYTES, TAG_BYTES, SegmentEncryption

KEY_BYTES = 32
NONCE_BYTES = 12
WRAPPED_KEY_BYTES = NONCE_BYTES + KEY_BYTES + TAG_BYTES
# Part of the stored format: an object's number is in the nonce of each of its chunks.
OBJECT_NUMBERS = {"log": 1, "index": 2, "timeindex": 3, "txnindex": 4, "snapshot": 5, "leader_epoch_checkpoint": 6}
_NONCE = struct.Struct(">IQ")  # object number, chunk index
_CHUNK_AAD = struct.Struct(">QQ")  # chunk index, content size
_CHUNK_LABEL = b"tierproxy segment chunk\x00"
_WRAP_LABEL = b"tierproxy data key\x00"
_KEYS = REMOTE_LOG_STORAGE_ENCRYPTION_KEYS.name
_HOW_TO_MAKE = "make one with `openssl rand -base64 32`"


class KeyEncryptionKey:
    """One key of remote.log.storage.encryption.keys; its material lives in its cipher only."""

    __slots__ = ("_aead", "key_id", "path")

    def __init__(self, key_id: str, path: Path, material: bytes) -> None:
        if len(material) != KEY_BYTES:
            raise ValueError(f"key {key_id!r}: {len(material)} bytes, a key is {KEY_BYTES}")
        self.key_id = key_id
        self.path = path
        self._aead = AESGCM(material)

    @classmethod
    def read(cls, key_id: str, path: Path) -> KeyEncryptionKey:
        """The key in `path`: one line, the base64 of 32 bytes. ConfigError names the key
        and the file, never what the file holds."""
        where = f"{_KEYS}: key {key_id!r} (file {path})"
        try:
            text = path.read_bytes().strip()
        except OSError as e:
            raise ConfigError(f"{where}: cannot read it: {e.strerror or type(e).__name__}") from None
        try:
            material = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: not one line of base64 ({_HOW_TO_MAKE})") from None
        if len(material) != KEY_BYTES:
            raise ConfigError(f"{where}: holds {len(material)} bytes, a key is {KEY_BYTES} ({_HOW_TO_MAKE})")
        return cls(key_id, path, material)

    def wrap(self, data_key: bytes, segment_id: uuid.UUID) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data_key, self._wrap_aad(segment_id))

    def unwrap(self, wrapped: bytes, segment_id: uuid.UUID) -> bytes | None:
        """The data key, or None when it does not unwrap with this key (another key wrapped
        it, or the wrapped key or its segment id were changed)."""
        if len(wrapped) != WRAPPED_KEY_BYTES:
            return None
        try:
            return self._aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], self._wrap_aad(segment_id))
        except InvalidTag:
            return None

    def _wrap_aad(self, segment_id: uuid.UUID) -> bytes:
        return _WRAP_LABEL + segment_id.bytes + self.key_id.encode()

    def __repr__(self) -> str:
        return f"KeyEncryptionKey({self.key_id!r}, {str(self.path)!r})"


class KeyRing:
    """The configured key-encryption keys by id, and the active one that wraps the data keys
    of new segments (None: new segments are copied unencrypted). `required`: a segment stored
    unencrypted is refused when read."""

    def __init__(self, keys: Iterable[KeyEncryptionKey] = (), active: str = "", required: bool = False) -> None:
        self.keys: Mapping[str, KeyEncryptionKey] = {key.key_id: key for key in keys}
        if active and active not in self.keys:
            raise ValueError(f"active key {active!r} is not one of {sorted(self.keys)}")
        self.active = self.keys[active] if active else None
        self.required = required

    @classmethod
    def from_config(cls, config: Settings) -> KeyRing:
        """The configuration's keys, each read from its file now (empty when it lists none)."""
        try:
            files = key_files(config[REMOTE_LOG_STORAGE_ENCRYPTION_KEYS])
        except ValueError as e:
            raise ConfigError(f"{_KEYS}: {e}") from None
        keys = [KeyEncryptionKey.read(key_id, path) for key_id, path in files.items()]
        try:
            return cls(keys, config[REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY],
                       config[REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED])
        except ValueError as e:
            raise ConfigError(f"{REMOTE_LOG_STORAGE_ENCRYPTION_ACTIVE_KEY.name}: {e}") from None

    def __repr__(self) -> str:
        active = self.active.key_id if self.active else None
        return f"KeyRing(ids={list(self.keys)}, active={active!r})"

    def seal_segment(self, segment_id: uuid.UUID) -> SegmentCipher | None:
        """A fresh data key for one copy of a segment, wrapped by the active key; None when
        no key is active."""
        if self.active is None:
            return None
        data_key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)
        encryption = SegmentEncryption(self.active.key_id, self.active.wrap(data_key, segment_id), BLOCK_BYTES)
        return SegmentCipher(data_key, segment_id, encryption)

    def refuse_unencrypted(self, segment: str) -> NoReturn:
        """Raises UnencryptedSegment: `segment` is stored unencrypted and encryption is required."""
        raise UnencryptedSegment(f"{segment} is stored unencrypted and {REMOTE_LOG_STORAGE_ENCRYPTION_REQUIRED.name}"
                                 "=true: not copied by an encrypting pipeline, or its manifest was replaced")

    def open_segment(self, segment_id: uuid.UUID, encryption: SegmentEncryption, segment: str) -> SegmentCipher:
        """The cipher of a stored segment (`segment` names it in errors)."""
        key = self.keys.get(encryption.key_id)
        if key is None:
            listed = ", ".join(self.keys) or "no key"
            raise EncryptionKeyNotFound(f"{segment} is encrypted with key {encryption.key_id!r}, which {_KEYS} "
                                        f"does not list (it lists {listed})")
        data_key = key.unwrap(encryption.wrapped_data_key, segment_id)
        if data_key is None:
            raise WrongEncryptionKey(f"the data key of {segment} does not unwrap with key {key.key_id!r} (file "
                                     f"{key.path}): the file holds another key than the one the segment was "
                                     "written with, or the manifest was changed")
        return SegmentCipher(data_key, segment_id, encryption)


class SegmentCipher:
    """The data key of one copy of one segment."""

    __slots__ = ("_aead", "encryption", "segment_id")

    def __init__(self, data_key: bytes, segment_id: uuid.UUID, encryption: SegmentEncryption) -> None:
        self._aead = AESGCM(data_key)
        self.segment_id = segment_id
        self.encryption = encryption

    def object(self, extension: str, size: int) -> ObjectCipher:
        """The chunks of the segment's object `extension`, whose content is `size` bytes."""
        return ObjectCipher(self._aead, self.segment_id, self.encryption, extension, size)


class ObjectCipher:
    __slots__ = ("_aad_head", "_aead", "_number", "chunk_bytes", "chunks", "size", "stored_size")

    def __init__(self, aead: AESGCM, segment_id: uuid.UUID, encryption: SegmentEncryption, extension: str,
                 size: int) -> None:
        self._aead = aead
        self._number = OBJECT_NUMBERS[extension]
        self._aad_head = _CHUNK_LABEL + segment_id.bytes + extension.encode() + b"\x00"
        self.chunk_bytes = encryption.chunk_bytes
        self.size = size
        self.chunks = encryption.chunks(size)
        self.stored_size = encryption.stored_size(size)

    def _nonce_and_aad(self, index: int) -> tuple[bytes, bytes]:
        return _NONCE.pack(self._number, index), self._aad_head + _CHUNK_AAD.pack(index, self.size)

    def _stored_length(self, index: int) -> int:
        return min(self.chunk_bytes, self.size - index * self.chunk_bytes) + TAG_BYTES

    def seal(self, index: int, content: bytes | memoryview) -> bytes:
        nonce, aad = self._nonce_and_aad(index)
        return self._aead.encrypt(nonce, content, aad)

    def open(self, index: int, sealed: bytes | bytearray | memoryview, where: str,
             into: memoryview | None = None) -> bytes | memoryview:
        """Chunk `index`'s content; with `into` (exactly its length) decrypted there, and
        `into` returned. On a failed tag nothing of `into` may be used."""
        nonce, aad = self._nonce_and_aad(index)
        try:
            if into is None:
                return self._aead.decrypt(nonce, sealed, aad)
            self._aead.decrypt_into(nonce, sealed, aad, into)
            return into
        except InvalidTag:
            raise DecryptionFailed(f"{where}: chunk {index} fails its AES-GCM tag (altered, or moved from another "
                                   "position, object or segment)") from None

    def seal_pieces(self, pieces: Iterable[bytes | memoryview]) -> Iterator[bytes]:
        """The stored form of the content, given in pieces of chunk_bytes (the last may be short)."""
        index = 0
        for piece in pieces:
            yield self.seal(index, piece)
            index += 1
        if index == 0:
            yield self.seal(0, b"")

    def seal_all(self, content: bytes) -> bytes:
        view = memoryview(content)
        return b"".join(self.seal_pieces(view[i:i + self.chunk_bytes] for i in range(0, len(view), self.chunk_bytes)))

    def open_all(self, stored: bytes, where: str) -> bytes:
        """The content of the whole stored object (its size checked by the caller)."""
        view, step = memoryview(stored), self.chunk_bytes + TAG_BYTES
        return b"".join(self.open(i, view[i * step:i * step + self._stored_length(i)], where)
                        for i in range(self.chunks))

    def stored_range(self, start: int, last: int) -> tuple[int, int]:
        """Stored bytes [first, end) of the whole chunks holding content bytes [start, last]."""
        step = self.chunk_bytes + TAG_BYTES
        return start // self.chunk_bytes * step, min(self.stored_size, (last // self.chunk_bytes + 1) * step)

    async def open_range(self, stored: AsyncIterator[bytes | memoryview], start: int, last: int,
                         where: str, into: memoryview | None = None) -> AsyncGenerator[bytes | memoryview, None]:
        """Content bytes [start, last] from the stored bytes of `stored_range(start, last)`, in
        pieces as they come; each chunk's tag is checked before any of it is passed on. A
        chunk that lies whole inside a piece is opened where it lies; one split between
        pieces is copied together first. With `into` (the caller's buffer for [start, last])
        a chunk wholly inside the range is decrypted straight into its place there, and
        the piece passed on is that view of `into`."""
        index = start // self.chunk_bytes
        pending = bytearray()
        async for piece in stored:
            view = memoryview(piece)
            while view:
                if index >= self.chunks:
                    raise CorruptRemoteSegment(f"{where}: more bytes than its {self.chunks} chunks")
                length = self._stored_length(index)
                sealed: bytearray | memoryview
                if pending or len(view) < length:
                    taken = view[:length - len(pending)]
                    pending += taken
                    view = view[len(taken):]
                    if len(pending) < length:
                        break
                    sealed, pending = pending, bytearray()
                else:
                    sealed, view = view[:length], view[length:]
                begin = index * self.chunk_bytes
                if into is not None and begin >= start and begin + length - TAG_BYTES <= last + 1:
                    yield self.open(index, sealed, where, into[begin - start:begin - start + length - TAG_BYTES])
                    index += 1
                    continue
                content = self.open(index, sealed, where)
                low, high = max(start, begin) - begin, min(last + 1, begin + len(content)) - begin
                if low == 0 and high == len(content):
                    yield content
                elif low < high:
                    yield memoryview(content)[low:high]
                index += 1
