"""tierproxy's own client against the real broker: the cluster queries, and ApiVersions."""

from __future__ import annotations

import pytest

from tierproxy.client.cluster import READ_COMMITTED, Cluster, ClusterError
from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tests.helpers.produce import produce_values


async def test_topics_offsets_fetch_and_delete_records(kafka_cluster, topic):
    name = topic(partitions=2)
    await produce_values(kafka_cluster.bootstrap_servers, name, 100, 2, linger_ms=5)

    async with Cluster(kafka_cluster.bootstrap_servers.split(",")) as cluster:
        topics = await cluster.topics([name, "no-such-topic"])
        assert list(topics) == [name] and sorted(topics[name].partitions) == [0, 1]
        tps = [(name, 0), (name, 1)]
        earliest = await cluster.list_offsets(topics, tps, OffsetSpec.EARLIEST)
        latest = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST)
        stable = await cluster.list_offsets(topics, tps, OffsetSpec.LATEST, isolation_level=READ_COMMITTED)
        assert {tp: o.offset for tp, o in earliest.items()} == {(name, 0): 0, (name, 1): 0}
        assert {tp: o.offset for tp, o in latest.items()} == {(name, 0): 50, (name, 1): 50}
        assert stable == latest  # no open transaction

        response = await cluster.fetch_raw(topics, name, 0, 10, 1 << 20)
        batches = list(iter_batches(response.records, verify_crc=True))
        assert batches[0].base_offset <= 10 and batches[-1].next_offset == 50

        assert await cluster.delete_records(topics, {(name, 0): 20}) == {(name, 0): 20}
        earliest = await cluster.list_offsets(topics, tps, OffsetSpec.EARLIEST)
        assert earliest[(name, 0)].offset == 20 and earliest[(name, 1)].offset == 0
        below = await cluster.fetch_raw(topics, name, 0, 5, 1 << 20)
        assert below.error_code == ErrorCode.offset_out_of_range

        with pytest.raises(ClusterError, match="DeleteRecords"):
            await cluster.delete_records(topics, {(name, 1): 1000})


async def test_every_connection_negotiates_versions_and_refuses_what_the_broker_does_not_accept(kafka_cluster):
    from tierproxy.client.connection import KafkaConnection, UnsupportedVersionError
    from tierproxy.config.addresses import parse_host_port
    from tierproxy.protocol.apis import ApiKey
    from tierproxy.protocol.requests import delete_records_request, metadata_request

    host, port = parse_host_port(kafka_cluster.bootstrap_servers.split(",")[0])
    async with await KafkaConnection.open(host, int(port)) as connection:
        versions = connection.api_versions
        assert versions[ApiKey.FETCH][1] >= 12 and versions[ApiKey.LIST_OFFSETS][1] >= 7
        assert versions[ApiKey.METADATA][0] <= 12 <= versions[ApiKey.METADATA][1]
        assert (await connection.request(metadata_request([]))).topics == ()
        # A broker that accepts only Metadata v13 (as a future one might): refused before a byte is sent.
        versions[ApiKey.METADATA] = (13, 13)
        with pytest.raises(UnsupportedVersionError, match=r"accepts METADATA v13-v13; tierproxy sends v12"):
            await connection.request(metadata_request([]))
        del versions[ApiKey.DELETE_RECORDS]
        with pytest.raises(UnsupportedVersionError, match="does not support DELETE_RECORDS"):
            await connection.request(delete_records_request({"t": [(0, 1)]}, 1000))
