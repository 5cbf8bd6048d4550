"""Encrypted remote segments through the proxy, and what it refuses.

Three partitions of one topic, each 60% remote and trimmed on the broker: partition 0
encrypted under key k1, partition 1 under k2, partition 2 copied before encryption (in
plaintext). A proxy with both keys serves everything. A proxy whose configuration lacks
k1, or holds other material under the id k1, and a proxy over a copy of the store with a
byte of partition 1 altered or two chunks of partition 0 swapped: each refuses the one
partition with TIERED_STORAGE_NOT_AVAILABLE (UNKNOWN_SERVER_ERROR on the wire, counted
by cause) and serves the other partitions in full; so does a proxy that requires
encryption, for the plaintext partition. A corrupt block further into a
segment, encrypted or plaintext, still lets a consumer read the records in front of it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tierproxy.client.connection import KafkaConnection
from tierproxy.protocol.apis import ErrorCode
from tierproxy.protocol.records import iter_batches
from tierproxy.protocol.requests import fetch_request
from tierproxy.remote_log.failures import Cause
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.manifest import BLOCK_BYTES, TAG_BYTES
from tierproxy.storage.rsm import ObjectType
from tests.helpers.consume import confluent_key, consume_aiokafka, consume_confluent_assigned, expected_by_partition
from tests.helpers.consume import in_partition_order, record_keys
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Timed, TieredTopic, TopicSpec, encryption_keys, write_key

PARTITIONS = 3
PER_PARTITION = 1500
VALUE_SIZE = 1000  # ~900 KB remote per partition: a first segment of three 256 KiB chunks
SEGMENT_BYTES = 600 * 1024
SPEC = TopicSpec(Timed(PER_PARTITION, value_size=VALUE_SIZE), partitions=PARTITIONS, segment_bytes=SEGMENT_BYTES,
                 encryption=("k1", "k2", None))
KEY_OF_PARTITION = dict(enumerate(SPEC.encryption))
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def encrypted(kafka_cluster, tiered_topics) -> TieredTopic:
    data = tiered_topics(SPEC, kafka_cluster)
    assert all(data.boundary[p] > 0 for p in range(PARTITIONS))
    return data


@pytest.fixture(scope="module")
def impostor(tmp_path_factory) -> Path:
    """Other key material, to be configured under the id k1."""
    return write_key(tmp_path_factory.mktemp("impostor") / "other.key")


def _settings(keys: dict[str, Path] | None = None, remote_root: Path | None = None) -> dict[str, object]:
    """Proxy settings with these keys instead of the store's (k1 and k2), over a copy of the
    store under `remote_root` instead of the store itself."""
    settings: dict[str, object] = {}
    if keys is not None:
        settings["remote.log.storage.encryption.keys"] = encryption_keys(keys)
    if remote_root is not None:
        settings["remote.log.storage.local.dir"] = remote_root / "remote"
    return settings


def _first_log(data: TieredTopic, partition: int, remote_root: Path) -> Path:
    """The stored `.log` of the partition's first remote segment under `remote_root`."""
    metadata = data.segments[partition][0]
    rsm = LocalRemoteStorageManager(remote_root / "remote")
    return rsm.path_of(rsm._key(metadata, ObjectType.LOG))


async def _remote_fetch(proxy: ProxyThread, topic: str, partition: int) -> tuple[int, bytes]:
    """Error code and records of a Fetch of the partition at offset 0 (remote) through the proxy."""
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    async with await KafkaConnection.open(host, int(port)) as conn:
        response = await conn.request(fetch_request(topic, partition, 0, 1 << 20, max_wait_ms=2000))
    (answer,) = response.responses[0].partitions
    return answer.error_code, bytes(answer.records or b"")


def _not_available(proxy: ProxyThread, topic: str, cause: Cause) -> float:
    return proxy.metrics.value("tierproxy_tiered_storage_not_available_total", {"topic": topic, "cause": cause.value})


def _refused_and_others_served(data: TieredTopic, proxy: ProxyThread, refused: int, cause: Cause) -> None:
    code, records = asyncio.run(_remote_fetch(proxy, data.topic, refused))
    assert (code, records) == (ErrorCode.unknown_server_error, b"")
    assert _not_available(proxy, data.topic, cause) >= 1
    assert proxy.metrics.value("tierproxy_remote_read_errors_total", {"topic": data.topic, "reason": cause.value}) >= 1
    others = [p for p in range(PARTITIONS) if p != refused]
    consumed = consume_confluent_assigned({"bootstrap.servers": proxy.bootstrap_servers}, data.topic, others,
                                          sum(len(data.of(p)) for p in others))
    expected = expected_by_partition(data.records)
    assert in_partition_order(consumed) == {p: expected[p] for p in others}


def test_the_partitions_are_stored_as_configured(encrypted):
    for partition, key_id in KEY_OF_PARTITION.items():
        metadata = encrypted.segments[partition][0]
        stored = _first_log(encrypted, partition, encrypted.root).read_bytes()
        value = encrypted.remote(partition)[0].value
        assert (value in stored) == (key_id is None)  # a record's value is in the plaintext segment only
        if key_id is None:
            assert len(stored) == metadata.segment_size_in_bytes
        else:  # at least three chunks, each followed by its tag
            chunks = -(-metadata.segment_size_in_bytes // BLOCK_BYTES)
            assert chunks >= 3 and len(stored) == metadata.segment_size_in_bytes + TAG_BYTES * chunks


async def test_with_both_keys_every_record_is_served(encrypted):
    data = encrypted
    with data.proxy() as proxy:
        consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records))
        assert in_partition_order(record_keys(consumed)) == expected_by_partition(data.records)
        served = proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": data.topic})
        assert served >= PARTITIONS
        assert sum(sample.value for metric in proxy.metrics.registry.collect() for sample in metric.samples
                   if sample.name == "tierproxy_tiered_storage_not_available_total") == 0


def test_a_missing_key_is_refused_and_the_other_partitions_are_served(encrypted):
    with encrypted.proxy(**_settings({"k2": encrypted.keys["k2"]})) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, Cause.KEY_NOT_FOUND)


def test_a_wrong_key_is_refused_and_the_other_partitions_are_served(encrypted, impostor):
    with encrypted.proxy(**_settings({"k1": impostor, "k2": encrypted.keys["k2"]})) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, Cause.WRONG_KEY)


def test_tampered_ciphertext_is_refused_and_the_other_partitions_are_served(encrypted, tmp_path):
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    log = _first_log(encrypted, 1, tmp_path)
    stored = bytearray(log.read_bytes())
    stored[1000] ^= 0x01
    log.write_bytes(stored)
    with encrypted.proxy(**_settings(remote_root=tmp_path)) as proxy:
        _refused_and_others_served(encrypted, proxy, 1, Cause.CORRUPT)


def test_a_chunk_moved_to_another_position_is_refused_and_the_other_partitions_are_served(
        encrypted, tmp_path):
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    log = _first_log(encrypted, 0, tmp_path)
    stored = log.read_bytes()
    step = BLOCK_BYTES + TAG_BYTES
    log.write_bytes(stored[step:2 * step] + stored[:step] + stored[2 * step:])
    with encrypted.proxy(**_settings(remote_root=tmp_path)) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, Cause.CORRUPT)


def test_with_encryption_required_the_plaintext_partition_is_refused_and_the_others_served(encrypted):
    """Partition 2 was copied before encryption: once encryption is required, it is refused as
    a segment whose manifest was replaced by one without encryption would be."""
    required = {"remote.log.storage.encryption.required": "true", "remote.log.storage.encryption.active.key": "k2"}
    with encrypted.proxy(**required) as proxy:
        _refused_and_others_served(encrypted, proxy, 2, Cause.UNENCRYPTED)


@pytest.mark.parametrize("partition", [1, 2], ids=["encrypted", "plaintext"])
def test_a_corrupt_block_serves_the_records_in_front_of_it(encrypted, tmp_path, partition):
    """Block 1 of the partition's first remote segment altered (its GCM tag fails, or its
    CRC-32C in the manifest): librdkafka reading from offset 0 gets every record of the whole
    batches in block 0, then only the partition's error, counted; nothing of block 1."""
    data = encrypted
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    _, segment_data = min((c for c in data.copies if c[0].topic_id_partition.partition == partition),
                          key=lambda c: c[0].start_offset)
    headers = list(iter_batches(segment_data.log_segment.read_bytes()))
    assert headers[-1].end_position > 2 * BLOCK_BYTES, "the segment needs a block after the corrupt one"
    last_intact = max(h.last_offset for h in headers if h.end_position <= BLOCK_BYTES)
    log = _first_log(encrypted, partition, tmp_path)
    stored = bytearray(log.read_bytes())
    stored[(BLOCK_BYTES + TAG_BYTES if KEY_OF_PARTITION[partition] else BLOCK_BYTES) + 1000] ^= 0x01
    log.write_bytes(stored)
    expected = [r for r in expected_by_partition(data.records)[partition] if r[1] <= last_intact]
    with encrypted.proxy(**_settings(remote_root=tmp_path)) as proxy:
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
        consumer.assign([TopicPartition(data.topic, partition, 0)])
        consumed: list[tuple] = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                    len(consumed) < len(expected) or _not_available(proxy, data.topic, Cause.CORRUPT) < 3):
                for message in consumer.consume(500, timeout=0.2):
                    if message.error() is None:
                        consumed.append(confluent_key(message))
        finally:
            consumer.close()
        assert consumed == expected  # in order, and nothing from the corrupt block on
        corrupt = proxy.metrics.value("tierproxy_remote_read_errors_total", {"topic": data.topic, "reason": "corrupt"})
        assert corrupt >= 1 + _not_available(proxy, data.topic, Cause.CORRUPT) >= 4

