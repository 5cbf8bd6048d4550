"""Errors of the remote tier. Only the proxy's Fetch handler turns them into Kafka codes."""


class RemoteStorageError(Exception):
    """A remote storage operation failed.

    `retriable` tells the caller whether the same call may succeed later (a timeout,
    a throttled or unreachable store) or never will (bad credentials, corrupt data).
    """

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class RemoteResourceNotFound(RemoteStorageError):
    """The object a segment's metadata points at does not exist in the store."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class RemoteSegmentNotFound(RemoteResourceNotFound):
    """A segment's manifest is not in the store: never copied, deleted, or its copy (or a
    restore of the store) has not put the manifest back yet. Other objects of the segment
    may be there; a segment is readable only once its manifest is."""


class CorruptRemoteSegment(RemoteStorageError):
    """An object's size or CRC-32C disagrees with its segment's manifest; never serve it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class RemoteObjectMismatch(CorruptRemoteSegment):
    """An object a segment's manifest lists is missing from the store, or its size or
    CRC-32C there is not what the manifest records. `reason` says which: MISSING, SIZE or
    CHECKSUM; `key` names the object."""

    MISSING = "missing"
    SIZE = "size"
    CHECKSUM = "checksum"

    def __init__(self, key: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class EncryptionKeyNotFound(RemoteStorageError):
    """An encrypted segment names a key-encryption key the configuration does not list."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class WrongEncryptionKey(RemoteStorageError):
    """A segment's data key does not unwrap with the key of its id: the key file holds
    other material than the key the segment was written with (or the manifest changed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class DecryptionFailed(CorruptRemoteSegment):
    """A chunk of an encrypted object fails its AES-GCM tag: altered, or moved from another
    place, object or segment. Never served."""


class UnencryptedSegment(CorruptRemoteSegment):
    """A segment stored without encryption where remote.log.storage.encryption.required is
    set: not copied so (or its manifest was replaced by one without encryption). Never served."""


class RemoteLogMetadataError(Exception):
    """Metadata that breaks the remote log's rules (an illegal state transition, say)."""


class IllegalStateTransition(RemoteLogMetadataError):
    pass


class MetadataNotReady(RemoteLogMetadataError):
    """A partition's remote log metadata has not been loaded yet (REPLICA_NOT_AVAILABLE)."""


class CorruptRangeRead(CorruptRemoteSegment):
    """A read into a caller's buffer stopped at corrupt data (`error`, the store's own):
    the first `filled` bytes of the buffer are checked and may be used."""

    def __init__(self, filled: int, error: CorruptRemoteSegment) -> None:
        super().__init__(str(error))
        self.filled = filled
        self.error = error
