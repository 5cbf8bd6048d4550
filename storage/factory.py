"""Builds the configured RemoteStorageManager and RemoteLogMetadataManager.

Takes the parsed configuration as a mapping of key -> typed value (config.Config is
one). The topic backend reaches the cluster with the configured security (client.security).
"""

from __future__ import annotations

from collections.abc import Iterable

from tierproxy.client.security import aiokafka_options

from .encryption import KeyRing
from .metadata import RemoteLogMetadataManager
from .model import TopicIdPartition
from .rsm import RemoteStorageManager
from tierproxy.config import Settings, BOOTSTRAP_SERVERS, REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MAX_MS, REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS, REMOTE_LOG_MANAGER_TASK_RETRY_JITTER, REMOTE_LOG_METADATA_BACKEND, REMOTE_LOG_METADATA_DIR, REMOTE_LOG_METADATA_TOPIC_NUM_PARTITIONS, REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR, REMOTE_LOG_REPLICA_REFRESH_INTERVAL_MS, REMOTE_LOG_STORAGE_BACKEND, REMOTE_LOG_STORAGE_KEY_PREFIX, REMOTE_LOG_STORAGE_LOCAL_DIR, REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID, REMOTE_LOG_STORAGE_S3_BUCKET, REMOTE_LOG_STORAGE_S3_ENDPOINT_URL, REMOTE_LOG_STORAGE_S3_MAX_ATTEMPTS, REMOTE_LOG_STORAGE_S3_MAX_CONNECTIONS, REMOTE_LOG_STORAGE_S3_MULTIPART_PART_BYTES, REMOTE_LOG_STORAGE_S3_MULTIPART_THRESHOLD_BYTES, REMOTE_LOG_STORAGE_S3_REGION, REMOTE_LOG_STORAGE_S3_REQUEST_TIMEOUT_MS, REMOTE_LOG_STORAGE_S3_SECRET_ACCESS_KEY, REMOTE_LOG_STORAGE_S3_SSE, REMOTE_LOG_STORAGE_S3_SSE_KMS_KEY_ID, REMOTE_LOG_STORAGE_S3_SSL_TRUSTSTORE_LOCATION


def remote_storage_manager(config: Settings) -> RemoteStorageManager:
    """Reads the encryption keys' files now: a missing or malformed one is a ConfigError
    naming the key and the file."""
    backend = config[REMOTE_LOG_STORAGE_BACKEND]
    prefix = config[REMOTE_LOG_STORAGE_KEY_PREFIX]
    keys = KeyRing.from_config(config)
    if backend == "local":
        from .local import LocalRemoteStorageManager

        return LocalRemoteStorageManager(config[REMOTE_LOG_STORAGE_LOCAL_DIR], prefix=prefix, keys=keys)
    if backend == "s3":
        from .s3 import S3RemoteStorageManager

        return S3RemoteStorageManager(
            config[REMOTE_LOG_STORAGE_S3_BUCKET],
            prefix,
            endpoint_url=config[REMOTE_LOG_STORAGE_S3_ENDPOINT_URL] or None,
            ca_location=config[REMOTE_LOG_STORAGE_S3_SSL_TRUSTSTORE_LOCATION] or None,
            region=config[REMOTE_LOG_STORAGE_S3_REGION],
            access_key_id=config[REMOTE_LOG_STORAGE_S3_ACCESS_KEY_ID] or None,
            secret_access_key=config[REMOTE_LOG_STORAGE_S3_SECRET_ACCESS_KEY] or None,
            multipart_threshold_bytes=config[REMOTE_LOG_STORAGE_S3_MULTIPART_THRESHOLD_BYTES],
            multipart_part_bytes=config[REMOTE_LOG_STORAGE_S3_MULTIPART_PART_BYTES],
            max_connections=config[REMOTE_LOG_STORAGE_S3_MAX_CONNECTIONS],
            retry_backoff_ms=config[REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS],
            retry_backoff_max_ms=config[REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MAX_MS],
            retry_jitter=config[REMOTE_LOG_MANAGER_TASK_RETRY_JITTER],
            max_attempts=config[REMOTE_LOG_STORAGE_S3_MAX_ATTEMPTS],
            request_timeout_ms=config[REMOTE_LOG_STORAGE_S3_REQUEST_TIMEOUT_MS],
            keys=keys,
            sse=config[REMOTE_LOG_STORAGE_S3_SSE],
            sse_kms_key_id=config[REMOTE_LOG_STORAGE_S3_SSE_KMS_KEY_ID],
        )
    raise ValueError(f"remote.log.storage.backend={backend!r}: must be local or s3")


def remote_log_metadata_manager(
    config: Settings, *, read_only: bool = False, shared: bool = False,
    partitions: Iterable[TopicIdPartition] | None = None,
) -> RemoteLogMetadataManager:
    """Not started yet: `async with` it, or call `start()`.

    `read_only` is for readers such as the proxy, which never write metadata: the file
    backend takes no writer's lock, the topic backend creates no topic and no producer. The
    remote backend is read-only whatever it says (it reads the store with a manager of its own).
    File backend: `shared` for several writers at once (the pipeline's driver and
    tasks), each append under the file's lock. `partitions`: keep only those partitions'
    metadata (a copy task's), loading only what they need.
    """
    backend = config[REMOTE_LOG_METADATA_BACKEND]
    directory = config[REMOTE_LOG_METADATA_DIR]
    if backend == "file":
        from .metadata.file_store import FileRemoteLogMetadataManager

        return FileRemoteLogMetadataManager(directory, read_only=read_only, shared=shared, partitions=partitions)
    if backend == "topic":
        from .metadata.topic_store import TopicRemoteLogMetadataManager

        replication = config[REMOTE_LOG_METADATA_TOPIC_REPLICATION_FACTOR]
        return TopicRemoteLogMetadataManager(
            ",".join(config[BOOTSTRAP_SERVERS]),
            directory=directory,
            num_partitions=config[REMOTE_LOG_METADATA_TOPIC_NUM_PARTITIONS],
            replication_factor=None if replication == -1 else replication,
            client_config=aiokafka_options(config),
            read_only=read_only,
            partitions=partitions,
        )
    if backend == "remote":
        from .metadata.bucket import BucketRemoteLogMetadataManager

        return BucketRemoteLogMetadataManager(
            remote_storage_manager(config), refresh_interval_ms=config[REMOTE_LOG_REPLICA_REFRESH_INTERVAL_MS],
            partitions=partitions, owns_store=True)
    raise ValueError(f"remote.log.metadata.backend={backend!r}: must be file, topic or remote")
