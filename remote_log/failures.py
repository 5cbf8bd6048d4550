"""Why a remote read failed: the closed list of causes that the metrics count
(`reason` of tierproxy_remote_read_errors_total, `cause` of
tierproxy_tiered_storage_not_available_total) and the alerts of deploy/rules/ name, and
the one table that gives each error its cause.

Each cause calls for a different remedy, so none is folded into another: a proxy whose
readers are all busy is overloaded (QUEUE_FULL), not failed by its store.
"""

from __future__ import annotations

import enum

from tierproxy.cache.chunk_cache import ChunkCacheFull
from tierproxy.storage.errors import (
    CorruptRemoteSegment,
    EncryptionKeyNotFound,
    MetadataNotReady,
    RemoteResourceNotFound,
    RemoteStorageError,
    UnencryptedSegment,
    WrongEncryptionKey,
)


class ReaderQueueFull(RemoteStorageError):
    """Every remote log reader is busy and `remote.log.reader.max.pending.tasks` reads wait already."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class Cause(enum.Enum):
    """Why a remote read failed; the value is the metrics' label value."""

    QUEUE_FULL = "queue_full"  # the reader pool, or the chunk cache full of held chunks, refused the read: the proxy is overloaded
    STORE_UNAVAILABLE = "store_unavailable"  # the store timed out, was unreachable, throttled, refused or failed
    NOT_FOUND = "not_found"  # metadata points at an object the store does not have
    CORRUPT = "corrupt"  # size, CRC-32C or AES-GCM check failed: never served
    UNENCRYPTED = "unencrypted"  # stored in plaintext where remote.log.storage.encryption.required is set
    KEY_NOT_FOUND = "key_not_found"  # the segment's key id is not among the configured keys
    WRONG_KEY = "wrong_key"  # the key of that id does not unwrap the segment's data key
    METADATA_NOT_READY = "metadata_not_ready"  # the partition's remote log metadata is still loading
    UNEXPECTED = "unexpected"  # not an error of the remote tier: a fault of the proxy itself


# The first kind an error is gives its cause: subclasses before their bases.
_CAUSES: tuple[tuple[type[BaseException], Cause], ...] = (
    (ReaderQueueFull, Cause.QUEUE_FULL),
    (ChunkCacheFull, Cause.QUEUE_FULL),
    (MetadataNotReady, Cause.METADATA_NOT_READY),
    (UnencryptedSegment, Cause.UNENCRYPTED),
    (CorruptRemoteSegment, Cause.CORRUPT),
    (RemoteResourceNotFound, Cause.NOT_FOUND),
    (EncryptionKeyNotFound, Cause.KEY_NOT_FOUND),
    (WrongEncryptionKey, Cause.WRONG_KEY),
    (RemoteStorageError, Cause.STORE_UNAVAILABLE),
)


def cause_of(error: BaseException) -> Cause:
    for kind, cause in _CAUSES:
        if isinstance(error, kind):
            return cause
    return Cause.UNEXPECTED
