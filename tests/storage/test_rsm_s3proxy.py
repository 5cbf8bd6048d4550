"""The S3 backend against the contract on S3Proxy (the testbed's faster S3 endpoint, the one
the S3 benchmarks use), directly and behind the first-byte latency relay."""

from __future__ import annotations

import http.client
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tierproxy.config import parse
from tierproxy.storage.errors import RemoteStorageError
from tierproxy.storage.factory import remote_storage_manager
from tierproxy.storage.s3 import MIB, S3RemoteStorageManager
from tierproxy.storage.s3_bodies import ObjectBodies, tls_context
from testbed.latency import LatencyRelay
from testbed.s3proxy import S3ProxyServer

from tests.helpers.s3 import S3Objects, assert_cut_body_fails_only_what_it_did_not_fill, manager, read_run

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


@pytest.fixture(scope="module")
def s3proxy_tls(tmp_path_factory) -> Iterator[S3ProxyServer]:
    with S3ProxyServer(workdir=tmp_path_factory.mktemp("s3proxy-tls"), tls=True) as server:
        yield server


async def test_over_https_the_store_trusts_the_configured_ca_and_only_it(s3proxy_tls, tmp_path):
    """S3Proxy serving HTTPS only, as object stores are reached: the store configured with
    the endpoint's CA (remote.log.storage.s3.ssl.truststore.location) copies a segment and
    reads it back into a buffer; without that CA the certificate is refused, and no retry
    is spent on it."""
    properties = s3proxy_tls.storage_properties(f"t-{uuid.uuid4().hex[:8]}")
    assert properties["remote.log.storage.s3.endpoint.url"].startswith("https://")
    segment = make_segment(tmp_path, log_size=3 * MIB + 1000)
    async with remote_storage_manager(parse({**properties, "bootstrap.servers": "127.0.0.1:9092"})) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        buffer = memoryview(bytearray(2 * MIB))
        await rsm.read_log_into(segment.metadata, MIB, buffer)
        assert bytes(buffer) == segment.log[MIB:3 * MIB]
    untrusted = {k: v for k, v in properties.items() if k != "remote.log.storage.s3.ssl.truststore.location"}
    async with remote_storage_manager(parse({**untrusted, "bootstrap.servers": "127.0.0.1:9092"})) as rsm:
        with pytest.raises(RemoteStorageError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed") as e:
            await rsm.fetch_manifest(segment.metadata)
        assert not e.value.retriable


async def test_over_https_runs_are_decrypted_into_their_buffers_on_kept_alive_connections(s3proxy_tls, tmp_path):
    """Over TLS the bodies go from the socket into the run's buffers (no ranged GetObject
    through aiobotocore), and the second run reuses the first one's connection."""
    segment = make_segment(tmp_path, log_size=3 * MIB + 5000)
    async with manager(s3proxy_tls) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        client = await rsm._s3()
        get_object = client.get_object
        ranged = []

        async def counted(**kwargs):
            ranged.extend([kwargs["Range"]] if "Range" in kwargs else [])
            return await get_object(**kwargs)

        client.get_object = counted
        filled, error = await read_run(rsm, segment.metadata, 0, [MIB, MIB, MIB])
        assert error is None and filled == [segment.log[i * MIB:(i + 1) * MIB] for i in range(3)]
        (connection,) = rsm._bodies._idle
        assert isinstance(connection, http.client.HTTPSConnection) and connection.sock is not None
        tls = connection.sock
        filled, error = await read_run(rsm, segment.metadata, MIB, [MIB, MIB + 5000])
        assert error is None and b"".join(filled) == segment.log[MIB:]
        assert rsm._bodies._idle == [connection] and connection.sock is tls
        assert ranged == []


async def test_over_https_a_connection_cut_mid_body_fails_only_the_buffers_it_did_not_fill(s3proxy_tls, tmp_path):
    await assert_cut_body_fails_only_what_it_did_not_fill(s3proxy_tls, make_segment(tmp_path, log_size=3 * MIB))


async def test_over_https_the_bodies_refuse_a_certificate_their_ca_did_not_sign(s3proxy_tls, tmp_path):
    """The bodies' connections verify as the client does: with botocore's default bundle
    instead of the endpoint's CA, a ranged read fails, and is not retried."""
    segment = make_segment(tmp_path, log_size=MIB)
    async with manager(s3proxy_tls) as rsm:
        await rsm.copy_log_segment_data(segment.metadata, segment.data)
        await rsm._s3()
        trusting = rsm._bodies
        rsm._bodies = ObjectBodies(trusting.endpoint, max_connections=1, timeout_s=5, tls=tls_context(None))
        trusting.close()
        seen = []
        rsm.observe_requests(lambda operation, seconds, ok: seen.append((operation, ok)))
        with pytest.raises(RemoteStorageError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed") as e:
            await rsm.read_log_into(segment.metadata, 0, memoryview(bytearray(MIB)))
        assert not e.value.retriable and seen == [("get_range", False)]
