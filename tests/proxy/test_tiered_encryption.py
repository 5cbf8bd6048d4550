"""Encrypted remote segments through the proxy, and what it refuses.

Three partitions of one topic, each 60% remote and trimmed on the broker: partition 0
encrypted under key k1, partition 1 under k2, partition 2 copied before encryption (in
plaintext). A proxy with both keys serves everything. A proxy whose configuration lacks
k1, or holds other material under the id k1, and a proxy over a copy of the store with a
byte of partition 1 altered or two chunks of partition 0 swapped: each refuses the one
partition with TIERED_STORAGE_NOT_AVAILABLE (UNKNOWN_SERVER_ERROR on the wire, counted
by cause) and serves the other partitions in full. A corrupt block further into a
segment, encrypted or plaintext, still lets a consumer read the records in front of it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tierproxy.client.connection import KafkaConnection
from tierproxy.protocol.apis import ErrorCode
from tierproxy.protocol.records import iter_batches
from tierproxy.protocol.requests import fetch_request
from tierproxy.storage.encryption import KeyRing
from tierproxy.storage.local import LocalRemoteStorageManager
from tierproxy.storage.manifest import BLOCK_BYTES, TAG_BYTES
from tierproxy.storage.metadata.file_store import FileRemoteLogMetadataManager
from tierproxy.storage.rsm import ObjectType
from tierproxy.config import parse
from tests.proxy.test_passthrough import ProxyThread, consume_aiokafka, running_proxy
from tests.proxy.tiered_helpers import (
    TieredTopic,
    consume_confluent_assigned,
    expected_by_partition,
    in_partition_order,
    local_proxy_settings,
    produce_timed,
    record_keys,
    tier_and_trim,
)

PARTITIONS = 3
PER_PARTITION = 1500
VALUE_SIZE = 1000  # ~900 KB remote per partition: a first segment of three 256 KiB chunks
SEGMENT_BYTES = 600 * 1024
KEY_OF_PARTITION = {0: "k1", 1: "k2", 2: None}
pytestmark = pytest.mark.timeout(300)


@dataclass
class Encrypted:
    data: TieredTopic
    root: Path
    keys: dict[str, Path]  # id -> file

    def settings(self, keys: dict[str, Path] | None = None, remote_root: Path | None = None) -> dict[str, object]:
        """Proxy settings over the store (or a copy of it under `remote_root`) with these keys
        (by default k1 and k2)."""
        keys = keys if keys is not None else {"k1": self.keys["k1"], "k2": self.keys["k2"]}
        settings: dict[str, object] = {**local_proxy_settings(self.root), "remote.log.storage.encryption.keys":
                                       ",".join(f"{key_id}:{path}" for key_id, path in keys.items())}
        if remote_root is not None:
            settings["remote.log.storage.local.dir"] = remote_root / "remote"
        return settings

    def first_log(self, partition: int, remote_root: Path) -> Path:
        """The stored `.log` of the partition's first remote segment under `remote_root`."""
        metadata = min((m for m, _ in self.data.copies if m.topic_id_partition.partition == partition),
                       key=lambda m: m.start_offset)
        rsm = LocalRemoteStorageManager(remote_root / "remote")
        return rsm.path_of(rsm._key(metadata, ObjectType.LOG))


def _write_key(path: Path) -> Path:
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    return path


@pytest.fixture(scope="module")
def encrypted(kafka_cluster, tmp_path_factory) -> Iterator[Encrypted]:
    topic = f"encrypted-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(topic, partitions=PARTITIONS)
    root = tmp_path_factory.mktemp("encrypted")
    (root / "keys").mkdir()
    keys = {key_id: _write_key(root / "keys" / f"{key_id}.key") for key_id in ("k1", "k2")}
    keys["k1-impostor"] = _write_key(root / "keys" / "other.key")
    records = produce_timed(kafka_cluster.client_config(), topic, PARTITIONS, PER_PARTITION, value_size=VALUE_SIZE)

    async def build() -> TieredTopic:
        boundary, copies, leaders = {}, [], {}
        for partition, key_id in KEY_OF_PARTITION.items():
            config = parse({"bootstrap.servers": kafka_cluster.bootstrap_servers,
                            "remote.log.storage.encryption.keys": f"k1:{keys['k1']},k2:{keys['k2']}",
                            "remote.log.storage.encryption.active.key": key_id or ""})
            async with LocalRemoteStorageManager(root / "remote", keys=KeyRing.from_config(config)) as rsm, \
                    FileRemoteLogMetadataManager(root / "metadata") as rlmm:
                part = await tier_and_trim(kafka_cluster.bootstrap_servers, topic, records, rsm=rsm, rlmm=rlmm,
                                           work_dir=root / "work", partitions=[partition],
                                           segment_bytes=SEGMENT_BYTES)
            boundary[partition] = part.boundary[partition]
            copies += part.copies
            leaders = part.leaders
        return TieredTopic(topic, part.topic_id, part.records, boundary, copies, leaders)

    data = asyncio.run(build())
    assert all(data.boundary[p] > 0 for p in range(PARTITIONS))
    yield Encrypted(data, root, {"k1": keys["k1"], "k2": keys["k2"], "impostor": keys["k1-impostor"]})
    kafka_cluster.delete_topic(topic)


async def _remote_fetch(proxy: ProxyThread, topic: str, partition: int) -> tuple[int, bytes]:
    """Error code and records of a Fetch of the partition at offset 0 (remote) through the proxy."""
    host, port = proxy.bootstrap_servers.rsplit(":", 1)
    async with await KafkaConnection.open(host, int(port)) as conn:
        response = await conn.request(fetch_request(topic, partition, 0, 1 << 20, max_wait_ms=2000))
    (answer,) = response.responses[0].partitions
    return answer.error_code, bytes(answer.records or b"")


def _not_available(proxy: ProxyThread, topic: str, cause: str) -> float:
    return proxy.metrics.value("tierproxy_tiered_storage_not_available_total", {"topic": topic, "cause": cause})


def _refused_and_others_served(encrypted: Encrypted, proxy: ProxyThread, refused: int, cause: str,
                               reason: str) -> None:
    data = encrypted.data
    code, records = asyncio.run(_remote_fetch(proxy, data.topic, refused))
    assert (code, records) == (ErrorCode.unknown_server_error, b"")
    assert _not_available(proxy, data.topic, cause) >= 1
    assert proxy.metrics.value("tierproxy_remote_read_errors_total", {"topic": data.topic, "reason": reason}) >= 1
    others = [p for p in range(PARTITIONS) if p != refused]
    consumed = consume_confluent_assigned({"bootstrap.servers": proxy.bootstrap_servers}, data.topic, others,
                                          sum(len(data.of(p)) for p in others))
    expected = expected_by_partition(data)
    assert in_partition_order(consumed) == {p: expected[p] for p in others}


def test_the_partitions_are_stored_as_configured(encrypted):
    for partition, key_id in KEY_OF_PARTITION.items():
        metadata = min((m for m, _ in encrypted.data.copies if m.topic_id_partition.partition == partition),
                       key=lambda m: m.start_offset)
        stored = encrypted.first_log(partition, encrypted.root).read_bytes()
        value = encrypted.data.remote(partition)[0].value
        assert (value in stored) == (key_id is None)  # a record's value is in the plaintext segment only
        if key_id is None:
            assert len(stored) == metadata.segment_size_in_bytes
        else:  # at least three chunks, each followed by its tag
            chunks = -(-metadata.segment_size_in_bytes // BLOCK_BYTES)
            assert chunks >= 3 and len(stored) == metadata.segment_size_in_bytes + TAG_BYTES * chunks


async def test_with_both_keys_every_record_is_served(kafka_cluster, encrypted):
    data = encrypted.data
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **encrypted.settings()) as proxy:
        consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records))
        assert in_partition_order(record_keys(consumed)) == expected_by_partition(data)
        served = proxy.metrics.value("tierproxy_remote_partitions_served_total", {"topic": data.topic})
        assert served >= PARTITIONS
        assert sum(sample.value for metric in proxy.metrics.registry.collect() for sample in metric.samples
                   if sample.name == "tierproxy_tiered_storage_not_available_total") == 0


def test_a_missing_key_is_refused_and_the_other_partitions_are_served(kafka_cluster, encrypted):
    settings = encrypted.settings({"k2": encrypted.keys["k2"]})
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **settings) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, "EncryptionKeyNotFound", "storage")


def test_a_wrong_key_is_refused_and_the_other_partitions_are_served(kafka_cluster, encrypted):
    settings = encrypted.settings({"k1": encrypted.keys["impostor"], "k2": encrypted.keys["k2"]})
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **settings) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, "WrongEncryptionKey", "storage")


def test_tampered_ciphertext_is_refused_and_the_other_partitions_are_served(kafka_cluster, encrypted, tmp_path):
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    log = encrypted.first_log(1, tmp_path)
    stored = bytearray(log.read_bytes())
    stored[1000] ^= 0x01
    log.write_bytes(stored)
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **encrypted.settings(remote_root=tmp_path)) as proxy:
        _refused_and_others_served(encrypted, proxy, 1, "DecryptionFailed", "corrupt")


def test_a_chunk_moved_to_another_position_is_refused_and_the_other_partitions_are_served(
        kafka_cluster, encrypted, tmp_path):
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    log = encrypted.first_log(0, tmp_path)
    stored = log.read_bytes()
    step = BLOCK_BYTES + TAG_BYTES
    log.write_bytes(stored[step:2 * step] + stored[:step] + stored[2 * step:])
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **encrypted.settings(remote_root=tmp_path)) as proxy:
        _refused_and_others_served(encrypted, proxy, 0, "DecryptionFailed", "corrupt")


@pytest.mark.parametrize("partition", [1, 2], ids=["encrypted", "plaintext"])
def test_a_corrupt_block_serves_the_records_in_front_of_it(kafka_cluster, encrypted, tmp_path, partition):
    """Block 1 of the partition's first remote segment altered (its GCM tag fails, or its
    CRC-32C in the manifest): librdkafka reading from offset 0 gets every record of the whole
    batches in block 0, then only the partition's error, counted; nothing of block 1."""
    data = encrypted.data
    shutil.copytree(encrypted.root / "remote", tmp_path / "remote")
    _, segment_data = min((c for c in data.copies if c[0].topic_id_partition.partition == partition),
                          key=lambda c: c[0].start_offset)
    headers = list(iter_batches(segment_data.log_segment.read_bytes()))
    assert headers[-1].end_position > 2 * BLOCK_BYTES, "the segment needs a block after the corrupt one"
    last_intact = max(h.last_offset for h in headers if h.end_position <= BLOCK_BYTES)
    log = encrypted.first_log(partition, tmp_path)
    stored = bytearray(log.read_bytes())
    stored[(BLOCK_BYTES + TAG_BYTES if KEY_OF_PARTITION[partition] else BLOCK_BYTES) + 1000] ^= 0x01
    log.write_bytes(stored)
    expected = [r for r in expected_by_partition(data)[partition] if r[1] <= last_intact]
    with running_proxy(kafka_cluster.bootstrap_servers, nodes=1, **encrypted.settings(remote_root=tmp_path)) as proxy:
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
        consumer.assign([TopicPartition(data.topic, partition, 0)])
        consumed: list[tuple] = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                    len(consumed) < len(expected) or _not_available(proxy, data.topic, _CAUSES[partition]) < 3):
                for message in consumer.consume(500, timeout=0.2):
                    if message.error() is None:
                        consumed.append((message.partition(), message.offset(), message.key(), message.value()))
        finally:
            consumer.close()
        assert consumed == expected  # in order, and nothing from the corrupt block on
        corrupt = proxy.metrics.value("tierproxy_remote_read_errors_total", {"topic": data.topic, "reason": "corrupt"})
        assert corrupt >= 1 + _not_available(proxy, data.topic, _CAUSES[partition]) >= 4


_CAUSES = {1: "DecryptionFailed", 2: "CorruptRemoteSegment"}
