"""The S3 backend against the contract on S3Proxy (the testbed's faster S3 endpoint, the one
the S3 benchmarks use), directly and behind the first-byte latency relay."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tierproxy.storage.s3 import S3RemoteStorageManager
from testbed.latency import LatencyRelay
from testbed.s3proxy import S3ProxyServer

from tests.helpers.s3 import S3Objects, manager

from .rsm_contract import RemoteStorageManagerContract, make_segment, read_all

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def s3proxy(tmp_path_factory) -> Iterator[S3ProxyServer]:
    with S3ProxyServer(workdir=tmp_path_factory.mktemp("s3proxy")) as server:
        yield server


class TestS3RemoteStorageManagerOnS3Proxy(S3Objects, RemoteStorageManagerContract):
    """The contract and the raw-object hooks of the moto tests, on S3Proxy."""

    @pytest_asyncio.fixture(loop_scope="function")
    async def rsm(self, s3proxy: S3ProxyServer) -> AsyncIterator[S3RemoteStorageManager]:
        async with self.manager_on(s3proxy) as rsm:
            yield rsm


async def test_the_relay_holds_back_every_response_by_its_first_byte_latency(s3proxy, tmp_path):
    """Each GET through the relay takes at least the injected latency, and its bytes (megabytes,
    many splices) are the object's."""
    segment = make_segment(tmp_path, log_size=3_000_000)
    delay_ms = 80
    with LatencyRelay(s3proxy.endpoint_url, delay_ms, tmp_path / "relay") as relay:
        async with manager(s3proxy) as direct:
            await direct.copy_log_segment_data(segment.metadata, segment.data)
            async with manager(s3proxy, endpoint_url=relay.endpoint_url) as relayed:
                relayed.prefix = direct.prefix  # the same objects, read through the relay
                for attempt in range(3):
                    started = time.perf_counter()
                    data = await read_all(relayed, segment.metadata, 1000, 2_900_000)
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    assert data == segment.log[1000:2_900_001]
                    assert elapsed_ms >= delay_ms, (attempt, elapsed_ms)
