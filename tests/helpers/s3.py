"""The S3 backend in tests: a manager of the test's own on an S3 server of the testbed, and
the contract's raw-object hooks over that server's bucket."""

from __future__ import annotations

import asyncio
import uuid

from botocore.exceptions import ClientError

from tierproxy.storage.rsm import RemoteStorageManager
from tierproxy.storage.s3 import MIB, S3RemoteStorageManager
from testbed.s3 import S3Server

# 12 MiB segments go up in three parts: 5 + 5 + 2 MiB.
PART_BYTES = 5 * MIB
THRESHOLD_BYTES = 6 * MIB


def manager(
    server: S3Server, *, endpoint_url: str | None = None, bucket: str | None = None, **options: object
) -> S3RemoteStorageManager:
    """A manager with its own key prefix, small parts and tiny backoffs."""
    settings = dict(
        multipart_threshold_bytes=THRESHOLD_BYTES,
        multipart_part_bytes=PART_BYTES,
        chunk_bytes=256 * 1024,
        max_connections=8,
        retry_backoff_ms=10,
        retry_backoff_max_ms=50,
        max_attempts=3,
        request_timeout_ms=5000,
    )
    settings.update(options)
    return S3RemoteStorageManager(
        bucket or server.bucket,
        prefix=f"t-{uuid.uuid4().hex[:8]}/tiered",
        endpoint_url=endpoint_url or server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        **settings,
    )


class S3Objects:
    """The contract's raw-object hooks (tests/storage/rsm_contract.py) on `self.server`'s bucket."""

    server: S3Server

    def manager_on(self, server: S3Server, **options: object) -> S3RemoteStorageManager:
        """`manager(server, ...)`, whose objects the hooks then reach."""
        self.server = server
        return manager(server, **options)

    async def raw_write(self, rsm: RemoteStorageManager, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.server.client().put_object, Bucket=self.server.bucket, Key=key, Body=data)

    async def raw_delete(self, rsm: RemoteStorageManager, key: str) -> None:
        await asyncio.to_thread(self.server.client().delete_object, Bucket=self.server.bucket, Key=key)

    async def raw_read(self, rsm: RemoteStorageManager, key: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self.server.client().get_object(Bucket=self.server.bucket, Key=key)["Body"].read()
            except ClientError as e:
                if e.response["Error"]["Code"] == "NoSuchKey":
                    return None
                raise

        return await asyncio.to_thread(read)
