"""Builds the configured RemoteStorageManager and RemoteLogMetadataManager.

Takes the parsed configuration as a mapping of key -> typed value (config.Config is
one). The topic backend reaches the cluster with the configured security (client.security).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.security import aiokafka_options

from .metadata import RemoteLogMetadataManager
from .rsm import RemoteStorageManager


def remote_storage_manager(config: Mapping[str, Any] | Any) -> RemoteStorageManager:
    backend = config["remote.log.storage.backend"]
    prefix = config["remote.log.storage.key.prefix"]
    if backend == "local":
        from .local import LocalRemoteStorageManager

        return LocalRemoteStorageManager(config["remote.log.storage.local.dir"], prefix=prefix)
    if backend == "s3":
        from .s3 import S3RemoteStorageManager

        return S3RemoteStorageManager(
            config["remote.log.storage.s3.bucket"],
            prefix,
            endpoint_url=config["remote.log.storage.s3.endpoint.url"] or None,
            region=config["remote.log.storage.s3.region"],
            access_key_id=config["remote.log.storage.s3.access.key.id"] or None,
            secret_access_key=config["remote.log.storage.s3.secret.access.key"] or None,
            multipart_threshold_bytes=config["remote.log.storage.s3.multipart.threshold.bytes"],
            multipart_part_bytes=config["remote.log.storage.s3.multipart.part.bytes"],
            max_connections=config["remote.log.storage.s3.max.connections"],
            retry_backoff_ms=config["remote.log.manager.task.retry.backoff.ms"],
            retry_backoff_max_ms=config["remote.log.manager.task.retry.backoff.max.ms"],
            retry_jitter=config["remote.log.manager.task.retry.jitter"],
            max_attempts=config["remote.log.storage.s3.max.attempts"],
            request_timeout_ms=config["remote.log.storage.s3.request.timeout.ms"],
        )
    raise ValueError(f"remote.log.storage.backend={backend!r}: must be local or s3")


def remote_log_metadata_manager(
    config: Mapping[str, Any] | Any, *, read_only: bool = False, shared: bool = False
) -> RemoteLogMetadataManager:
    """Not started yet: `async with` it, or call `start()`.

    `read_only` is for readers such as the proxy, which never write metadata: the file
    backend takes no writer's lock, the topic backend creates no topic and no producer.
    File backend: `shared` for several writers at once (the pipeline's driver and
    tasks), each append under the file's lock.
    """
    backend = config["remote.log.metadata.backend"]
    directory = config["remote.log.metadata.dir"]
    if backend == "file":
        from .metadata.file_store import FileRemoteLogMetadataManager

        return FileRemoteLogMetadataManager(directory, read_only=read_only, shared=shared)
    if backend == "topic":
        from .metadata.topic_store import TopicRemoteLogMetadataManager

        replication = config["remote.log.metadata.topic.replication.factor"]
        return TopicRemoteLogMetadataManager(
            ",".join(config["bootstrap.servers"]),
            directory=directory,
            num_partitions=config["remote.log.metadata.topic.num.partitions"],
            replication_factor=None if replication == -1 else replication,
            client_config=aiokafka_options(config),
            read_only=read_only,
        )
    raise ValueError(f"remote.log.metadata.backend={backend!r}: must be file or topic")
