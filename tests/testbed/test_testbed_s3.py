"""moto's S3 server from testbed/, reached over HTTP with aiobotocore."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from testbed.processes import is_alive
from testbed.s3 import S3Server, s3_client


async def test_put_and_get_object(s3_server: S3Server) -> None:
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    async with s3_client(s3_server) as s3:
        await s3.put_object(Bucket=s3_server.bucket, Key="segments/0.log", Body=b"batch bytes")
        got = await s3.get_object(Bucket=s3_server.bucket, Key="segments/0.log",
                                  Range="bytes=6-10")
        assert await got["Body"].read() == b"bytes"
        listed = await s3.list_objects_v2(Bucket=s3_server.bucket, Prefix="segments/")
        assert [o["Key"] for o in listed["Contents"]] == ["segments/0.log"]


async def test_s3_client_accepts_an_endpoint_url(s3_server: S3Server) -> None:
    async with s3_client(s3_server.endpoint_url) as s3:
        buckets = await s3.list_buckets()
    assert s3_server.bucket in [b["Name"] for b in buckets["Buckets"]]


@pytest.mark.s3
async def test_restart_keeps_the_port_and_loses_the_data() -> None:
    server = S3Server(bucket="restarted").start()
    try:
        port, first_pid = server.port, server.pid
        server.client().put_object(Bucket="restarted", Key="k", Body=b"v")

        server.stop()
        assert not server.answers()
        server.restart()
        assert (server.port, server.answers()) == (port, True)
        assert server.pid != first_pid
        assert server.client().list_buckets()["Buckets"] == []  # moto keeps no state

        server.restart(create_bucket=True)
        async with s3_client(server) as s3:
            with pytest.raises(ClientError, match="NoSuchKey"):
                await s3.get_object(Bucket="restarted", Key="k")
            await s3.put_object(Bucket="restarted", Key="k", Body=b"again")
            assert await (await s3.get_object(Bucket="restarted", Key="k"))["Body"].read() == b"again"
    finally:
        last_pid = server.pid
        server.close()
    assert last_pid is not None and not is_alive(last_pid)
