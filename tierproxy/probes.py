"""Can the configured brokers and object store be reached? One line each.

`tierproxy config check --connect` runs both probes; `tierproxy serve` probes the store
at start and logs one WARNING line when it fails (and serves anyway: the store may come
back, and the broker's data does not need it). Each probe returns None when all is well,
else what is wrong, naming the thing it tried.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

from tierproxy.client.cluster import check_login
from tierproxy.config import (
    BOOTSTRAP_SERVERS,
    REMOTE_LOG_STORAGE_BACKEND,
    REMOTE_LOG_STORAGE_KEY_PREFIX,
    REMOTE_LOG_STORAGE_LOCAL_DIR,
    REMOTE_LOG_STORAGE_S3_BUCKET,
    REMOTE_LOG_STORAGE_S3_ENDPOINT_URL,
    REMOTE_LOG_STORAGE_S3_MAX_ATTEMPTS,
    SECURITY_PROTOCOL,
    Config,
)
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.model import TopicIdPartition

__all__ = ("brokers_name", "probe_brokers", "probe_store", "store_name")

PROBE_TIMEOUT_S = 10.0

# A partition no topic has: listing its objects asks the store about the bucket (or
# directory) and its credentials, and finds nothing.
_PROBE_PARTITION = TopicIdPartition(uuid.UUID(int=0), "__tierproxy_probe", 0)


def brokers_name(config: Config) -> str:
    return f"brokers {','.join(config[BOOTSTRAP_SERVERS])} ({config[SECURITY_PROTOCOL]})"


def store_name(config: Config) -> str:
    prefix = config[REMOTE_LOG_STORAGE_KEY_PREFIX].strip("/")
    if config[REMOTE_LOG_STORAGE_BACKEND] == "s3":
        endpoint = config[REMOTE_LOG_STORAGE_S3_ENDPOINT_URL]
        where = f"s3://{config[REMOTE_LOG_STORAGE_S3_BUCKET]}/{prefix}"
        return f"remote storage {where}" + (f" at {endpoint}" if endpoint else "")
    return f"remote storage {config[REMOTE_LOG_STORAGE_LOCAL_DIR]} (local)"


async def probe_brokers(config: Config, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """A Metadata round trip to a bootstrap broker with the configured security."""
    try:
        await asyncio.wait_for(check_login(config, client_id="tierproxy-probe"), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except Exception as e:  # noqa: BLE001 - any failure is the answer, in one line
        return _one_line(e)
    return None


async def probe_store(config: Config, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Lists the bucket (S3, one attempt) or checks the directory (local files)."""
    if config[REMOTE_LOG_STORAGE_BACKEND] == "local":
        return await asyncio.to_thread(_probe_directory, Path(config[REMOTE_LOG_STORAGE_LOCAL_DIR]))
    # One attempt: the probe reports the store as it is now, the retries are the serving's.
    once = config.with_overrides({REMOTE_LOG_STORAGE_S3_MAX_ATTEMPTS: "1"})
    try:
        async with remote_storage_manager(once) as rsm:
            await asyncio.wait_for(rsm.list_partition_objects(_PROBE_PARTITION), timeout_s)
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except RemoteStorageError as e:
        return " ".join(str(e).split())  # names the operation, the bucket and the cause
    return None


def _probe_directory(directory: Path) -> str | None:
    """The directory exists and may be read and written, or its nearest existing parent
    may be written (the first copy creates it)."""
    existing = directory
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    mode = os.R_OK | os.W_OK | os.X_OK
    if not os.access(existing, mode):
        return f"{existing} cannot be read and written by this user"
    if existing != directory:
        return None  # created by the first copy
    try:
        next(os.scandir(directory), None)
    except OSError as e:
        return f"cannot list {directory}: {e.strerror}"
    return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if type(error).__name__ in text else f"{type(error).__name__}: {text}"
