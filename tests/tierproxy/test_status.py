"""`tierproxy status` against the real broker and real remote log metadata.

A tiered topic of three partitions, each in another state: part of the log in remote
storage and the broker trimmed to just after it (healthy), no remote data with an open
transaction (Ly < Lz), and one trimmed past the remote end (a gap: exit 1, named).
The command runs as a process, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

from tierproxy.client.cluster import Cluster
from tierproxy.client.connection import KafkaConnection
from tierproxy.config import load
from tierproxy.config.addresses import parse_host_port
from tierproxy.status import broken_invariants
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.model import TopicIdPartition
from tests.helpers.commands import write_properties
from tests.helpers.remote_tier import cut_segments, fetch_raw_log, tier_from_broker, tier_log, topic_id_of

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the invariants alone


def test_invariants_of_seed_001():
    assert broken_invariants(lx=10, ly=20, lz=30, rx=0, ry=9) == ()
    assert broken_invariants(lx=0, ly=0, lz=0, rx=None, ry=None) == ()
    assert broken_invariants(lx=5, ly=5, lz=5, rx=0, ry=50) != ()  # Ry past the LSO
    (gap,) = broken_invariants(lx=15, ly=20, lz=30, rx=0, ry=9)
    assert gap.startswith("gap: offsets [10, 14]")
    assert any("Lz >= Ly" in p for p in broken_invariants(lx=0, ly=9, lz=8, rx=None, ry=None))
    assert any("Ly >= Lx" in p for p in broken_invariants(lx=9, ly=8, lz=10, rx=None, ry=None))
    assert any("Ry >= Rx" in p for p in broken_invariants(lx=0, ly=20, lz=20, rx=10, ry=5))


# --------------------------------------------------------------------------- against the broker


def _status(properties: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tierproxy.cli", "status", "--config", str(properties), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


async def _produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, max_batch_size=2048)
    await producer.start()
    try:
        for partition, count in counts.items():
            for i in range(count):
                await producer.send(topic, value=b"v%05d" % i + b"x" * 200, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def _open_transaction(bootstrap: str, topic: str, partition: int, count: int) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"status-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, value=b"open %d" % i, partition=partition)
    assert producer.flush(30) == 0
    return producer


async def _tier_prefix(bootstrap: str, topic: str, partition: int, end: int, rsm, rlmm, work_dir: Path):
    """Tier the batches below `end` (as the pipeline would), in two segments."""
    return await tier_from_broker(bootstrap, topic, partition, end=end, rsm=rsm, rlmm=rlmm, work_dir=work_dir,
                                  cut_offsets=[end // 2])


def _write_properties(path: Path, bootstrap: str, tmp: Path, topics: list[str], **extra: str) -> Path:
    lines = [
        f"bootstrap.servers={bootstrap}",
        "remote.log.storage.backend=local",
        f"remote.log.storage.local.dir={tmp / 'remote'}",
        "remote.log.metadata.backend=file",
        f"remote.log.metadata.dir={tmp / 'metadata'}",
        *(f"topic.{name}.remote.storage.enable=true" for name in topics),
        *(f"{k}={v}" for k, v in extra.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def test_healthy_untiered_and_gap_partitions(kafka_cluster, topic, tmp_path):
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=3)
    properties = _write_properties(tmp_path / "tierproxy.properties", bootstrap, tmp_path, [name, "no-such-topic"])
    config = load(properties)
    await _produce(bootstrap, name, {0: 300, 1: 50, 2: 300})
    transaction = await asyncio.to_thread(_open_transaction, bootstrap, name, 1, 5)
    try:
        async with remote_storage_manager(config) as rsm, remote_log_metadata_manager(config) as rlmm:
            tiered = {p: await _tier_prefix(bootstrap, name, p, 200, rsm, rlmm, tmp_path / "work") for p in (0, 2)}
        ry = {p: segments[-1].end_offset for p, segments in tiered.items()}
        async with Cluster([bootstrap]) as cluster:
            topics = await cluster.topics([name])
            # Local retention as the pipeline does it: never past the remote end + 1.
            await cluster.delete_records(topics, {(name, 0): ry[0] + 1, (name, 2): ry[2] + 1})

            healthy = _status(properties, "--json")
            assert healthy.returncode == 0, healthy.stderr
            report = json.loads(healthy.stdout)
            assert report["ok"] is True and report["missing_topics"] == ["no-such-topic"]
            assert "no-such-topic does not exist" in healthy.stderr
            rows = {p["partition"]: p for p in report["partitions"]}
            assert sorted(rows) == [0, 1, 2]
            for p in (0, 2):
                assert rows[p]["topic"] == name and rows[p]["ok"] and rows[p]["problems"] == []
                assert (rows[p]["rx"], rows[p]["ry"], rows[p]["lx"]) == (0, ry[p], ry[p] + 1)
                assert (rows[p]["ly"], rows[p]["lz"]) == (300, 300)
                assert rows[p]["remote_segments"] == len(tiered[p]) == 2
                assert rows[p]["remote_bytes"] == sum(s.segment_size_in_bytes for s in tiered[p]) > 0
                assert rows[p]["topic_id"] == str(topics[name].topic_id)
            # No remote data; the open transaction holds the last stable offset back.
            assert (rows[1]["lx"], rows[1]["ly"], rows[1]["lz"]) == (0, 50, 55)
            assert (rows[1]["rx"], rows[1]["ry"], rows[1]["remote_segments"], rows[1]["remote_bytes"]) == (
                None, None, 0, 0)

            table = _status(properties)
            assert table.returncode == 0, table.stderr
            header, *lines = table.stdout.splitlines()
            assert header.split() == ["PARTITION", "LX", "LY", "LZ", "RX", "RY", "SEGMENTS", "BYTES", "INVARIANTS"]
            untiered = next(line.split() for line in lines if line.startswith(f"{name}-1 "))
            assert untiered == [f"{name}-1", "0", "50", "55", "-", "-", "0", "0", "ok"]

            # The broker trimmed past the remote end: offsets ry+1 .. ry+9 exist nowhere.
            await cluster.delete_records(topics, {(name, 2): ry[2] + 10})
            broken = _status(properties, "--json")
            assert broken.returncode == 1
            assert f"{name}-2: gap: offsets [{ry[2] + 1}, {ry[2] + 9}]" in broken.stderr
            assert f"{name}-0" not in broken.stderr
            rows = {p["partition"]: p for p in json.loads(broken.stdout)["partitions"]}
            assert not rows[2]["ok"] and rows[2]["lx"] == ry[2] + 10
            assert rows[0]["ok"] and rows[1]["ok"]

            table = _status(properties)
            assert table.returncode == 1
            assert next(line for line in table.stdout.splitlines() if line.startswith(f"{name}-2 ")).endswith("BROKEN")
    finally:
        transaction.abort_transaction(30)


async def test_topic_backend_status_leaves_the_owners_directory_alone(kafka_cluster, topic, tmp_path):
    """With the __remote_log_metadata backend, status reads a copy of the owner's
    materialized files and never writes into the owner's directory."""
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1)
    properties = _write_properties(tmp_path / "tierproxy.properties", bootstrap, tmp_path, [name],
                                   **{"remote.log.metadata.backend": "topic"})
    config = load(properties)
    await _produce(bootstrap, name, {0: 100})
    async with remote_storage_manager(config) as rsm, remote_log_metadata_manager(config) as rlmm:
        segments = await _tier_prefix(bootstrap, name, 0, 100, rsm, rlmm, tmp_path / "work")
        owned = tmp_path / "metadata"
        before = {p.name: p.read_bytes() for p in owned.iterdir()}
        result = await asyncio.to_thread(_status, properties, "--json")
        assert {p.name: p.read_bytes() for p in owned.iterdir()} == before
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["partitions"]
    assert (row["rx"], row["ry"], row["lx"], row["lz"]) == (0, segments[-1].end_offset, 0, 100)
    assert row["remote_segments"] == 2 and row["ok"]


def test_bad_configuration_exits_2(tmp_path):
    properties = tmp_path / "bad.properties"
    properties.write_text("bootstrap.servers=127.0.0.1:1\nremote.log.metadata.backend=rocksdb\n")
    result = _status(properties)
    assert result.returncode == 2
    assert "remote.log.metadata.backend" in result.stderr and "file, topic" in result.stderr


@pytest.mark.timeout(60)
def test_unreachable_cluster_exits_2(tmp_path):
    properties = _write_properties(tmp_path / "p.properties", "127.0.0.1:1", tmp_path, ["orders"])
    result = _status(properties)
    assert result.returncode == 2
    assert "cannot read the offsets" in result.stderr


def test_status_does_not_import_pyspark():
    code = "import sys, tierproxy.cli, tierproxy.status; sys.exit('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0


async def test_segments_per_encryption_key_and_those_whose_key_is_not_configured(kafka_cluster, topic, tmp_path):
    """Three segments: copied before encryption, under k1, and under k2 after rotating. With
    both keys listed status is clean and counts them; with k1 retired too early it names
    the segment that can no longer be read and exits 1."""
    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1)
    await _produce(bootstrap, name, {0: 300})
    files = {}
    for key_id in ("k1", "k2"):
        files[key_id] = tmp_path / f"{key_id}.key"
        files[key_id].write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    both = f"k1:{files['k1']},k2:{files['k2']}"
    phases = [{}, {"remote.log.storage.encryption.keys": both, "remote.log.storage.encryption.active.key": "k1"},
              {"remote.log.storage.encryption.keys": both, "remote.log.storage.encryption.active.key": "k2"}]
    async with await KafkaConnection.open(*parse_host_port(bootstrap.split(",")[0])) as conn:
        log = await fetch_raw_log(conn, name, 0, 0, 250)
        tip = TopicIdPartition(await topic_id_of(conn, name), name, 0)
    pieces = cut_segments(log, cut_offsets=[80, 160])
    assert len(pieces) == 3
    tiered = []
    for piece, extra in zip(pieces, phases):
        config = load(_write_properties(tmp_path / "phase.properties", bootstrap, tmp_path, [name], **extra))
        async with remote_storage_manager(config) as rsm, remote_log_metadata_manager(config) as rlmm:
            tiered += await tier_log(piece, tip, rsm=rsm, rlmm=rlmm, work_dir=tmp_path / "work")
    plain, under_k1, under_k2 = tiered

    properties = _write_properties(tmp_path / "tierproxy.properties", bootstrap, tmp_path, [name], **phases[2])
    result = _status(properties, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (row,) = report["partitions"]
    assert row["ok"] and row["remote_segments"] == 3 and row["encryption_keys"] == {"k1": 1, "k2": 1}
    assert report["encryption_keys"] == [
        {"key_id": "k1", "file": str(files["k1"]), "active": False, "segments": 1},
        {"key_id": "k2", "file": str(files["k2"]), "active": True, "segments": 1},
    ]
    table = _status(properties)
    assert table.returncode == 0, table.stderr
    keys = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines() if line.startswith("k")}
    assert keys == {"k1": [str(files["k1"]), "1"], "k2": [str(files["k2"]), "1", "(active)"]}
    for path in files.values():  # the material itself is never shown
        assert path.read_text().strip() not in table.stdout + result.stdout + table.stderr

    retired = _write_properties(tmp_path / "retired.properties", bootstrap, tmp_path, [name], **{
        "remote.log.storage.encryption.keys": f"k2:{files['k2']}", "remote.log.storage.encryption.active.key": "k2"})
    broken = _status(retired, "--json")
    assert broken.returncode == 1
    assert (f"{name}-0: segment {under_k1.segment_id.id} (offsets {under_k1.start_offset}-{under_k1.end_offset}) "
            "is encrypted with key 'k1', which remote.log.storage.encryption.keys does not list") in broken.stderr
    assert str(under_k2.segment_id.id) not in broken.stderr and str(plain.segment_id.id) not in broken.stderr
    assert json.loads(broken.stdout)["encryption_keys"][1] == {"key_id": "k1", "file": None, "active": False,
                                                               "segments": 1}
    table = _status(retired)
    assert table.returncode == 1
    assert any(line.split() == ["k1", "NOT", "CONFIGURED", "1"] for line in table.stdout.splitlines())

    # Encryption required: the segment copied before encryption is the one problem.
    required = _write_properties(tmp_path / "required.properties", bootstrap, tmp_path, [name], **{
        "remote.log.storage.encryption.keys": both, "remote.log.storage.encryption.active.key": "k2",
        "remote.log.storage.encryption.required": "true"})
    strict = _status(required)
    assert strict.returncode == 1
    assert (f"{name}-0: segment {plain.segment_id.id} (offsets {plain.start_offset}-{plain.end_offset}) is stored "
            "unencrypted and remote.log.storage.encryption.required=true: it is refused when read") in strict.stderr
    assert str(under_k1.segment_id.id) not in strict.stderr and str(under_k2.segment_id.id) not in strict.stderr


def test_an_unreadable_key_file_is_an_invalid_configuration(tmp_path):
    properties = _write_properties(tmp_path / "p.properties", "127.0.0.1:1", tmp_path, ["orders"], **{
        "remote.log.storage.encryption.keys": f"k1:{tmp_path}/absent.key"})
    result = _status(properties)
    assert result.returncode == 2
    assert f"invalid configuration: remote.log.storage.encryption.keys: key 'k1' (file {tmp_path}/absent.key)" \
        in result.stderr


async def test_with_the_remote_backend_status_reads_the_published_metadata_and_says_when(kafka_cluster, topic,
                                                                                        tmp_path):
    """A read replica's status: the remote range from what was published into the store, and
    how long ago that was; nothing published under the key prefix is a problem (exit 1)
    naming where it looked, not a store without remote data."""
    from tierproxy.storage.metadata.bucket import publish

    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1)
    properties = _write_properties(tmp_path / "tierproxy.properties", bootstrap, tmp_path, [name])
    config = load(properties)
    await _produce(bootstrap, name, {0: 300})
    async with remote_storage_manager(config) as rsm, remote_log_metadata_manager(config) as rlmm:
        tiered = await _tier_prefix(bootstrap, name, 0, 200, rsm, rlmm, tmp_path / "work")
        replica = _write_properties(tmp_path / "replica.properties", bootstrap, tmp_path, [name],
                                    **{"remote.log.metadata.backend": "remote"})
        result = _status(replica, "--json")
        assert result.returncode == 1
        unpublished = json.loads(result.stdout)
        assert unpublished["metadata_published_seconds_ago"] is None and not unpublished["ok"]
        folder, head = (rsm.object_location(f"__remote_log_metadata/{name}") for name in ("", "head"))
        (problem,) = unpublished["metadata_problems"]
        assert problem.startswith(f"no remote log metadata under {folder}: {head} does not exist")
        assert f"tierproxy status: {problem}" in result.stderr
        await publish(rsm, rlmm.partition_states())

    result = _status(replica, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    row = report["partitions"][0]
    assert (row["rx"], row["ry"], row["remote_segments"]) == (0, tiered[-1].end_offset, 2)
    assert report["metadata_published_seconds_ago"] >= 0
    text = _status(replica)
    assert "Remote log metadata published into the remote store" in text.stdout


def test_a_missing_read_replica_topic_says_how_to_create_it(kafka_cluster, tmp_path):
    properties = _write_properties(tmp_path / "replica.properties", kafka_cluster.bootstrap_servers, tmp_path, [],
                                   **{"topic.no-such-replica.remote.log.read.replica": "true"})
    result = _status(properties, "--json")
    assert json.loads(result.stdout)["missing_topics"] == ["no-such-replica"]
    assert ("read replica topic no-such-replica does not exist in the cluster: `tierproxy replica create` creates it"
            in result.stderr), result.stderr


async def test_a_read_replica_shows_its_brokers_own_log_and_checks_each_segments_key(kafka_cluster, topic,
                                                                                     tmp_path, s3_server):
    """A read replica's status over S3 (moto): the broker columns are the replica cluster's own
    log of the topic, not the remote range the proxy serves; a key file holding other material
    under the segments' key id is a problem naming partition, segment and key (exit 1); and
    the command closes its S3 clients (no "Unclosed client session" on exit)."""
    from tierproxy.storage.metadata.bucket import publish

    bootstrap = kafka_cluster.bootstrap_servers
    name = topic(partitions=1)
    keys = {key_id: tmp_path / f"{key_id}.key" for key_id in ("k1", "other")}
    for path in keys.values():
        path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    store = {**s3_server.storage_properties(f"status-{name}"), "remote.log.storage.encryption.keys": f"k1:{keys['k1']}",
             "remote.log.storage.encryption.active.key": "k1"}
    config = load(_write_properties(tmp_path / "origin.properties", bootstrap, tmp_path, [name], **store))
    await _produce(bootstrap, name, {0: 300})
    async with remote_storage_manager(config) as rsm, remote_log_metadata_manager(config) as rlmm:
        tiered = await _tier_prefix(bootstrap, name, 0, 200, rsm, rlmm, tmp_path / "work")
        await publish(rsm, rlmm.partition_states())
    # The replica's file: the same store, the published metadata; here the topic's own log on
    # this cluster (the origin's, in this one-cluster test) holds 300 records from offset 0.
    replica = {"bootstrap.servers": bootstrap, **store, "remote.log.storage.encryption.active.key": "",
               "remote.log.metadata.backend": "remote", f"topic.{name}.remote.log.read.replica": "true"}
    path = write_properties(tmp_path / "replica.properties", replica)
    result = _status(path, "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["partitions"]
    assert (row["lx"], row["ly"], row["lz"], row["rx"], row["ry"]) == (0, 300, 300, 0, tiered[-1].end_offset), row
    text = _status(path)
    assert text.returncode == 0, text.stderr
    assert f"Read replica topics ({name}): LX, LY, LZ are this cluster's own log of the topic" in text.stdout
    for done in (result, text):
        assert "Unclosed" not in done.stderr, done.stderr

    other = write_properties(tmp_path / "other.properties",
                             {**replica, "remote.log.storage.encryption.keys": f"k1:{keys['other']}"})
    broken = _status(other)
    assert broken.returncode == 1, broken.stderr
    for s in tiered:
        assert (f"{name}-0: segment {s.segment_id.id} (offsets {s.start_offset}-{s.end_offset}) cannot be read: "
                f"the data key of segment {s.segment_id.id} does not unwrap with key 'k1' (file {keys['other']})"
                ) in broken.stderr, broken.stderr
    assert "Unclosed" not in broken.stderr


def test_a_replicas_metadata_that_cannot_be_read_closes_the_store_client(kafka_cluster, topic, tmp_path, s3_server):
    """The published metadata's bucket does not exist: exit 2 naming it, and the metadata's own
    S3 client is closed (no "Unclosed client session" on exit)."""
    name = topic(partitions=1)
    path = write_properties(tmp_path / "replica.properties", {
        "bootstrap.servers": kafka_cluster.bootstrap_servers, **s3_server.storage_properties("status-no-bucket"),
        "remote.log.storage.s3.bucket": "no-such-bucket", "remote.log.metadata.backend": "remote",
        f"topic.{name}.remote.log.read.replica": "true"})
    result = _status(path)
    assert result.returncode == 2, result.stderr
    assert "NoSuchBucket" in result.stderr
    assert "Unclosed" not in result.stderr, result.stderr
