"""How the pipeline reports a failure: in one line, with a traceback only for a bug.

What a pass meets when the cluster, the object store or the metadata fail (unreachable,
refused, a full or read-only disk, a missing bucket) is named in one line in the log and
the summary; the operator fixes the store, not the code. Anything else is a bug of ours
and keeps its traceback in the log.
"""

from __future__ import annotations

import logging

from aiokafka.errors import KafkaError

from tierproxy.client.cluster import ClusterError
from tierproxy.storage.errors import RemoteLogMetadataError, RemoteStorageError

__all__ = ("EXPECTED_FAILURES", "log_failure", "one_line")

EXPECTED_FAILURES = (ConnectionError, KafkaError, ClusterError, RemoteStorageError, RemoteLogMetadataError, OSError,
                     TimeoutError)


def one_line(error: BaseException) -> str:
    """`Type: message`, on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def log_failure(log: logging.Logger, level: int, what: str, error: BaseException) -> str:
    """Logs `<what> failed: <error>` and returns the error's one line."""
    line = one_line(error)
    log.log(level, "%s failed: %s", what, line, exc_info=not isinstance(error, EXPECTED_FAILURES))
    return line
