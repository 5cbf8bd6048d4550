"""Captures golden frames from a real broker into tests/data/golden/.

    python -m tests.protocol.capture_golden

Requests come from two sources: our codecs, and librdkafka (confluent-kafka) through
a recording relay, so the unit tests decode what a real client sends. Responses are
the broker's bytes as received. Re-run after a Kafka upgrade; the unit tests in
test_golden.py need no broker.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import struct
from pathlib import Path

from confluent_kafka.admin import AdminClient
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8, i32, i32Timedelta, i64

from tierproxy.protocol.codecs import encode_request
from tierproxy.protocol.framing import FrameDecoder, encode_frame
from tierproxy.protocol.headers import peek_request_header
from testbed.kafka import KafkaCluster
from tests.helpers.produce import produce_mixed

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
TOPIC = "golden"


async def _exchange(host: str, port: int, request_body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.writelines(encode_frame(request_body))
    await writer.drain()
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    response = struct.pack(">i", size) + await reader.readexactly(size)
    writer.close()
    return response


async def _relay_capture(host: str, port: int, count: int) -> list[tuple[bytes, bytes]]:
    """The first `count` request/response pairs librdkafka sends on its bootstrap connection."""
    pairs: list[tuple[bytes, bytes]] = []
    done = asyncio.Event()

    async def handle(client_reader, client_writer):
        broker_reader, broker_writer = await asyncio.open_connection(host, port)
        decoder = FrameDecoder()
        while not done.is_set():
            data = await client_reader.read(65536)
            if not data:
                break
            for body in decoder.feed(data):
                request = struct.pack(">i", len(body)) + bytes(body)
                broker_writer.write(request)
                (size,) = struct.unpack(">i", await broker_reader.readexactly(4))
                response = struct.pack(">i", size) + await broker_reader.readexactly(size)
                client_writer.write(response)
                pairs.append((request, response))
                if len(pairs) >= count:
                    done.set()
        client_writer.close()
        broker_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    relay_port = server.sockets[0].getsockname()[1]
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{relay_port}", "client.id": "golden-librdkafka"})
    await asyncio.to_thread(admin.list_topics, TOPIC, 10)
    await asyncio.wait_for(done.wait(), 10)
    server.close()
    return pairs[:count]


async def capture() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    index = []
    with KafkaCluster(1) as cluster:
        cluster.create_topic(TOPIC, partitions=1)
        await produce_mixed(cluster.bootstrap_servers, TOPIC, 1, per_codec=20, per_transaction=5)
        _, host, port = cluster.brokers[0]

        def save(name: str, request: bytes, response: bytes, source: str) -> None:
            (GOLDEN / f"{name}.request.bin").write_bytes(request)
            (GOLDEN / f"{name}.response.bin").write_bytes(response)
            header = peek_request_header(request[4:])
            index.append({"name": name, "api_key": header.api_key, "api_version": header.api_version,
                          "correlation_id": header.correlation_id, "source": source})

        for i, (request, response) in enumerate(await _relay_capture(host, port, 2)):
            header = peek_request_header(request[4:])
            save(f"librdkafka-{i}-key{header.api_key}-v{header.api_version}", request, response, "librdkafka")

        ours = {
            "metadata-v12": MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=TOPIC),),
                allow_auto_topic_creation=False, include_topic_authorized_operations=False,
            ),
            "list-offsets-v7-earliest": list_offsets7.ListOffsetsRequest(
                replica_id=i32(-1), isolation_level=i8(0),
                topics=(list_offsets7.ListOffsetsTopic(name=TOPIC, partitions=(
                    list_offsets7.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(-2)),)),),
            ),
            "fetch-v12": fetch12.FetchRequest(
                max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)), min_bytes=i32(1),
                max_bytes=i32(1 << 20), isolation_level=i8(0),
                topics=(fetch12.FetchTopic(topic=TOPIC, partitions=(
                    fetch12.FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),)),),
                forgotten_topics_data=(),
            ),
        }
        for correlation_id, (name, request) in enumerate(ours.items(), start=100):
            body = encode_request(request, correlation_id, "golden-tierproxy")
            response = await _exchange(host, port, body)
            save(name, struct.pack(">i", len(body)) + body, response, "tierproxy")
    (GOLDEN / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"captured {len(index)} request/response pairs into {GOLDEN}")


if __name__ == "__main__":
    asyncio.run(capture())
