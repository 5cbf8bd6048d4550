"""Every error of the remote tier has exactly one cause, its own: a full reader queue is
overload, never the store's failure."""

from __future__ import annotations

import pytest

from tierproxy.cache.chunk_cache import CorruptChunk
from tierproxy.remote_log.failures import Cause, ReaderQueueFull, cause_of
from tierproxy.storage.errors import (
    CorruptRangeRead,
    CorruptRemoteSegment,
    DecryptionFailed,
    EncryptionKeyNotFound,
    MetadataNotReady,
    RemoteResourceNotFound,
    RemoteSegmentNotFound,
    RemoteStorageError,
    UnencryptedSegment,
    WrongEncryptionKey,
)

CORRUPT = CorruptRemoteSegment("bad crc")


@pytest.mark.parametrize(("error", "cause"), [
    (ReaderQueueFull("3 readers busy"), Cause.QUEUE_FULL),
    (RemoteStorageError("timeout", retriable=True), Cause.STORE_UNAVAILABLE),
    (RemoteStorageError("AccessDenied (HTTP 403)", retriable=False), Cause.STORE_UNAVAILABLE),
    (RemoteResourceNotFound("no such key"), Cause.NOT_FOUND),
    (RemoteSegmentNotFound("copy incomplete: no manifest"), Cause.NOT_FOUND),  # a store being restored
    (CORRUPT, Cause.CORRUPT),
    (DecryptionFailed("tag"), Cause.CORRUPT),
    (CorruptChunk(1, b"", CORRUPT), Cause.CORRUPT),
    (CorruptRangeRead(0, CORRUPT), Cause.CORRUPT),
    (UnencryptedSegment("plaintext"), Cause.UNENCRYPTED),
    (EncryptionKeyNotFound("k1"), Cause.KEY_NOT_FOUND),
    (WrongEncryptionKey("k1"), Cause.WRONG_KEY),
    (MetadataNotReady("loading"), Cause.METADATA_NOT_READY),
    (KeyError("a bug"), Cause.UNEXPECTED),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.value)
def test_each_error_has_its_cause(error, cause):
    assert cause_of(error) is cause

