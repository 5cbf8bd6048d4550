"""`tierproxy serve` with several worker processes (proxy.workers): the workers share the
listeners, a worker killed in the middle of a remote replay is restarted and the
consumer finishes with every record exactly once, the metrics endpoint sums all
workers, and the workers never outlive their supervisor."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import javaproperties
import pytest
from confluent_kafka import Consumer, TopicPartition

from tierproxy.config import load
from tierproxy.proxy.workers import shares
from tierproxy.storage.metadata.file_store import SNAPSHOT_FILE_NAME
from testbed.ports import ESTABLISHED, LOOPBACK, free_ports, tcp_sockets
from tests.helpers.consume import consume_confluent_assigned, expected_by_partition, in_partition_order
from tests.helpers.fixtures import tiered_fixture
from tests.helpers.proxy import free_port_block
from tests.helpers.serve import Served, sample, scrape, start_serving
from tests.helpers.tiered import FOUR_KB_PARTITIONS, TieredTopic

# 1 KB records, the first 90% of each partition remote only.
SPEC = FOUR_KB_PARTITIONS
PARTITIONS = SPEC.partitions
pytestmark = pytest.mark.timeout(300)


def test_shares_divide_every_bound_and_keep_the_totals():
    config = load(None, ["bootstrap.servers=b:9092", "remote.log.chunk.cache.size.bytes=1000",
                         "remote.log.index.file.cache.total.size.bytes=999", "remote.log.reader.threads=10",
                         "remote.log.reader.max.pending.tasks=3", "max.connections=0", "max.connections.per.ip=7",
                         "max.connection.creation.rate=10"])
    share = shares(config, 4)
    assert share == {
        "remote.log.index.file.cache.total.size.bytes": "249",
        "remote.log.chunk.cache.size.bytes": "250",
        "remote.log.reader.threads": "2",
        "remote.log.reader.max.pending.tasks": "1",  # a bound above 0 keeps at least 1 per worker
        "max.connections": "0",  # refusing every connection stays refusing
        "max.connections.per.ip": "1",
        "max.connection.creation.rate": "2",
    }
    for name in ("remote.log.index.file.cache.total.size.bytes", "remote.log.chunk.cache.size.bytes",
                 "remote.log.reader.threads"):
        assert 4 * int(share[name]) <= config[name]
    # The fetch quota is not divided: the workers share one rate (storage/shared_quota.py).
    quota = load(None, ["bootstrap.servers=b:9092", "remote.log.manager.fetch.max.bytes.per.second=1000000"])
    assert "remote.log.manager.fetch.max.bytes.per.second" not in shares(quota, 4)


tiered = tiered_fixture(SPEC)


def serve(tiered: TieredTopic, tmp_path: Path, workers: int, **extra: object) -> tuple[Served, int, int]:
    """`tierproxy serve` with `workers` in front of the tiered topic's cluster and store."""
    assert tiered.cluster is not None
    bootstrap_port, metrics_port = free_ports(2)
    base = free_port_block(1)
    settings = {
        "bootstrap.servers": tiered.cluster.bootstrap_servers,
        "proxy.bootstrap.port": bootstrap_port,
        "proxy.broker.port.base": base,
        "metrics.port": metrics_port,
        "proxy.workers": workers,
        "remote.log.chunk.size.bytes": 64 * 1024,
        "remote.log.index.cache.dir": tmp_path / "index-cache",
        **tiered.store,
        **extra,
    }
    return start_serving(settings, tmp_path), bootstrap_port, metrics_port


def established_on(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` whose local port is `port`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return sum(1 for tcp in tcp_sockets() if tcp.local_port == port and tcp.state == ESTABLISHED and tcp.inode in inodes)


SERVING = r"worker-\d tierproxy: tierproxy serving on"


def node_port_of(served: Served) -> int:
    """Once both workers serve: the port of the broker node's listener."""
    served.wait_for(SERVING, 2)
    return int(re.search(r"listening for broker node \d+ on [^:]+:(\d+)", served.output).group(1))


def kill_the_fetching_worker(served: Served, metrics_port: int, node_port: int, *, after_bytes: float,
                             reading: Callable[[], bool], timeout_s: float) -> tuple[int, float]:
    """SIGKILL the worker holding the consumer's node connection once more than
    `after_bytes` remote bytes were served (while `reading()`), and wait until its
    replacement serves; returns its pid and the remote bytes served just before it died."""
    deadline = time.monotonic() + timeout_s
    victim = None
    while victim is None and time.monotonic() < deadline and reading():
        if sample(scrape(metrics_port), "tierproxy_remote_fetch_bytes_total") > after_bytes:
            victim = next((pid for pid in served.workers() if established_on(pid, node_port)), None)
        time.sleep(0.05)
    assert victim is not None, "the consumer never fetched remote data through a worker"
    fetched = sample(scrape(metrics_port), "tierproxy_remote_fetch_bytes_total")
    started = len(re.findall(SERVING, served.output))
    os.kill(victim, signal.SIGKILL)
    served.wait_for(rf"worker \d \(pid {victim}\) was killed by SIGKILL; restarting it")
    served.wait_for(SERVING, started + 1)  # a worker stopped while still starting logs nothing
    return victim, fetched


def test_a_worker_killed_mid_replay_loses_nothing(tiered, tmp_path):
    data = tiered
    served, bootstrap_port, metrics_port = serve(data, tmp_path, 2)
    try:
        node_port = node_port_of(served)
        first = served.workers()
        assert len(first) == 2, served.output
        expected = expected_by_partition(data.records)
        total = sum(len(v) for v in expected.values())
        consumed: list[tuple] = []
        done = threading.Event()

        def replay() -> None:
            try:
                consumed.extend(consume_confluent_assigned(
                    {"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}",
                     "max.partition.fetch.bytes": 64 * 1024, "queued.max.messages.kbytes": 1024},
                    data.topic, range(PARTITIONS), total, timeout_s=180))
            finally:
                done.set()

        consumer = threading.Thread(target=replay)
        consumer.start()
        # Kill the worker holding the consumer's fetch connection once remote reads are under way.
        victim, _ = kill_the_fetching_worker(served, metrics_port, node_port, after_bytes=1_000_000,
                                          reading=lambda: not done.is_set(), timeout_s=60)
        consumer.join(200)
        assert done.is_set()
        assert in_partition_order(consumed) == expected  # every record, once, in order
        assert len(consumed) == total
        survivors = served.workers()
        assert len(survivors) == 2 and victim not in survivors and survivors & first
        exposition = scrape(metrics_port)
        # The killed worker's counters stay in the sums; every remote byte was served once at least.
        remote_bytes = sum(len(r.value) + len(r.key) for p in range(PARTITIONS) for r in data.remote(p))
        assert sample(exposition, "tierproxy_remote_fetch_bytes_total") >= remote_bytes
        assert "pid=" not in exposition  # live gauges are summed, not one series per worker
    finally:
        status = served.stop()
    assert status == 0, served.output
    assert "worker-0 tierproxy: stopped" in served.output and "worker-1 tierproxy: stopped" in served.output


def test_a_java_consumer_keeps_its_fetch_session_across_a_killed_worker(kafka_cluster, tiered, tmp_path):
    """kafka-clients fetches with sessions (KIP-227) that the proxy passes to the broker;
    the worker holding one dies: the client's next fetch, on a new connection, starts a
    new session and the replay goes on, every record once. The partition is assigned, not
    subscribed: a Kafka 4 client whose only broker disconnects rebootstraps, and a group
    member then rejoins and re-reads from its committed offset, as it would against a
    one-broker cluster (at least once, by Kafka's design)."""
    data = tiered
    served, bootstrap_port, metrics_port = serve(data, tmp_path, 2)
    consumer = None
    try:
        node_port = node_port_of(served)
        expected = {0: expected_by_partition(data.records)[0]}
        total = len(expected[0])
        # Its output is not read until the worker is dead: once the pipe is full the consumer
        # stops polling with most of the replay to go and its session open at the broker.
        consumer = subprocess.Popen(kafka_cluster.java_tool_command(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server", f"{LOOPBACK}:{bootstrap_port}", "--topic", data.topic,
            "--partition", "0", "--offset", "earliest", "--max-messages", str(total), "--timeout-ms", "60000",
            "--consumer-property", "max.partition.fetch.bytes=65536",
            "--property", "print.key=true", "--property", "print.value=false",
            "--property", "print.partition=true", "--property", "print.offset=true"),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running = consumer  # narrowed for the closure
        _, fetched = kill_the_fetching_worker(served, metrics_port, node_port, after_bytes=0,
                                              reading=lambda: running.poll() is None, timeout_s=90)
        out, err = consumer.communicate(timeout=180)
        assert consumer.returncode == 0, err[-2000:]
        got: dict[int, list[tuple[int, str]]] = {}
        for line in out.splitlines():
            if line.startswith("Partition:"):
                partition, offset, key = line.split("\t")[:3]
                got.setdefault(int(partition.split(":")[1]), []).append((int(offset.split(":")[1]), key))
        wanted = {p: [(offset, key.decode()) for _, offset, key, _ in records] for p, records in expected.items()}
        assert got == wanted, _first_differences(got, wanted)  # every record, once, in order
        remote_bytes = sum(len(r.value) + len(r.key) for r in data.remote(0))
        assert fetched < remote_bytes, "the worker died after the remote part was served"
    finally:
        if consumer is not None and consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        status = served.stop()
    assert status == 0, served.output


def _first_differences(got: dict[int, list], wanted: dict[int, list]) -> str:
    out = []
    for p in sorted(wanted):
        have = got.get(p, [])
        at = next((i for i, (a, b) in enumerate(zip(have, wanted[p])) if a != b), min(len(have), len(wanted[p])))
        if have != wanted[p]:
            out.append(f"partition {p}: {len(have)} of {len(wanted[p])} records, first difference at {at}: "
                       f"{have[at:at + 3]} instead of {wanted[p][at:at + 3]}")
    return "; ".join(out)


def test_every_worker_listens_on_the_port_a_node_id_range_gives(tiered, tmp_path):
    """proxy.broker.node.id.range and proxy.broker.port.start: both workers open node 0's
    listener on the same port, and a replay through it reads every record once."""
    data = tiered
    start = free_port_block(1)
    served, bootstrap_port, metrics_port = serve(data, tmp_path, 2, **{
        "proxy.broker.node.id.range": "0-9", "proxy.broker.port.start": start})
    try:
        served.wait_for(SERVING, 2)
        served.wait_for(rf"listening for broker node 0 on {LOOPBACK}:{start}\b", 2)
        expected = expected_by_partition(data.records)
        consumed = consume_confluent_assigned({"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}"}, data.topic,
                                              range(PARTITIONS), sum(len(v) for v in expected.values()))
        assert in_partition_order(consumed) == expected
        exposition = scrape(metrics_port)
        assert re.search(r'^tierproxy_connections_total\{listener="node-0"\} [1-9]', exposition, re.M), exposition
    finally:
        status = served.stop()
    assert status == 0, served.output


def test_workers_exit_with_their_supervisor(tiered, tmp_path):
    data = tiered
    served, _, _ = serve(data, tmp_path, 2)
    with _supervisor_killed(served) as workers:
        served.wait_for(SERVING, 2)
        workers |= served.workers()
        assert len(workers) == 2


def test_workers_exit_with_a_supervisor_killed_while_they_stop(tiered, tmp_path):
    """A worker whose shutdown waits for a read stuck in the store (a FIFO for a manifest,
    as a hung network filesystem would) has had its SIGTERM: the signal its supervisor's
    death sends changes nothing. It exits anyway once the supervisor is gone."""
    settings = _store_copy(tiered, tmp_path)
    manifest = sorted(Path(settings["remote.log.storage.local.dir"]).glob("*/0/*.manifest"))[0]
    with _stuck_on(manifest) as stuck:
        served, bootstrap_port, _ = serve(tiered, tmp_path, 2, **settings)
        with _supervisor_killed(served) as workers:
            served.wait_for(SERVING, 2)
            workers |= served.workers()
            consumer = Consumer({"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}", "group.id": "stuck",
                                 "enable.auto.commit": False})
            try:
                consumer.assign([TopicPartition(tiered.topic, 0, 0)])
                deadline = time.monotonic() + 60
                while not stuck():  # a worker reads the manifest, and blocks there
                    assert time.monotonic() < deadline, "no remote read of partition 0 began"
                    consumer.poll(0.2)
            finally:
                consumer.close()
            served.process.send_signal(signal.SIGTERM)
            served.wait_for(r"worker-\d tierproxy: shutting down", 2)
    assert re.search(r"worker-\d tierproxy: supervisor pid \d+ is gone and this worker did not stop within",
                     served.output), served.output


def test_workers_exit_with_a_supervisor_killed_while_they_start(tiered, tmp_path):
    """A worker that has its signal handlers but waits at start for the remote log metadata
    (a FIFO for its snapshot) exits once its supervisor is gone."""
    settings = _store_copy(tiered, tmp_path)
    snapshot = Path(settings["remote.log.metadata.dir"]) / SNAPSHOT_FILE_NAME
    snapshot.unlink(missing_ok=True)
    with _stuck_on(snapshot) as stuck:
        served, _, _ = serve(tiered, tmp_path, 2, **settings)
        with _supervisor_killed(served) as workers:
            deadline = time.monotonic() + 60
            while not stuck() or len(workers) < 2:
                assert time.monotonic() < deadline and served.process.poll() is None, served.output
                workers |= served.workers()
                time.sleep(0.1)
    assert "serving on" not in served.output


def _store_copy(tiered: TieredTopic, tmp_path: Path) -> dict[str, str]:
    """The tiered topic's store and metadata copied, to be damaged by one test alone."""
    settings = {}
    for key in ("remote.log.storage.local.dir", "remote.log.metadata.dir"):
        settings[key] = str(shutil.copytree(tiered.store[key], tmp_path / "store" / Path(tiered.store[key]).name))
    return settings


@contextlib.contextmanager
def _stuck_on(path: Path) -> Iterator[Callable[[], bool]]:
    """`path` replaced by a FIFO; yields whether a reader has opened it. From then on a
    writer holds it open and writes nothing: the reader waits in read() until the end."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    writer: list[int] = []

    def stuck() -> bool:
        if not writer:
            try:
                writer.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as e:  # ENXIO: no reader yet
                if e.errno != errno.ENXIO:
                    raise
        return bool(writer)

    try:
        yield stuck
    finally:
        for fd in writer:
            os.close(fd)  # end of file for whoever still reads


@contextlib.contextmanager
def _supervisor_killed(served: Served) -> Iterator[set[int]]:
    """Yields a set for the body to put `served`'s workers in; then SIGKILLs the supervisor and
    asserts every worker exits (a zombie of an orphan counts as gone) within a generous bound.
    Whatever is left is killed, whatever happened."""
    workers: set[int] = set()
    try:
        yield workers
        assert workers
        served.process.kill()
        served.process.wait()
        deadline = time.monotonic() + 30
        while alive := [pid for pid in workers if _state(pid) != "Z"]:
            assert time.monotonic() < deadline, f"workers {alive} outlived their supervisor"
            time.sleep(0.1)
    finally:
        _kill_left(served, workers)
        served.stop()


def _kill_left(served: Served, workers: set[int]) -> None:
    """SIGKILL what is left of `served`'s workers (checked by command line: a pid gone may be reused)."""
    mark = f"--worker-of\0{served.process.pid}\0".encode()
    for pid in workers:
        with contextlib.suppress(OSError):
            if _state(pid) != "Z" and mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_a_port_taken_stops_every_worker_with_the_address(tiered, tmp_path):
    data = tiered
    taken = socket.socket()
    taken.bind((LOOPBACK, 0))
    taken.listen()
    try:
        served, _, _ = serve(data, tmp_path, 2, **{"proxy.bootstrap.port": taken.getsockname()[1]})
        served.process.wait(60)
        served.stop()
    finally:
        taken.close()
    assert served.process.returncode == 1, served.output
    assert "cannot open the bootstrap listener" in served.output
    assert "cannot start" in served.output


def test_a_second_serve_on_the_same_address_refuses_to_start(tiered, tmp_path):
    """Like a broker, a second `serve` on the same address and port does not join the
    first's SO_REUSEPORT listeners, whatever host text names the address: it exits naming
    the port, the address and the holder, and the first serves on. The first has no metrics
    endpoint, whose port the kernel alone would refuse; the second has one of its own."""
    data = tiered
    first, bootstrap_port, _ = serve(data, tmp_path, 2, **{"metrics.port": 0})
    try:
        first.wait_for(SERVING, 2)
        # the holder's pid and command line, cut short at 200 characters
        holder = rf"another tierproxy serve \(pid {first.process.pid}: [^\n]*tierproxy serve --config [^\n]*\)"
        for host in ("localhost", "127.1", "127.0.0.1"):
            second = start_serving({**_settings(first), "proxy.listener.host": host, "metrics.port": free_ports(1)[0]},
                                   tmp_path / host)
            try:
                second.process.wait(30)
            finally:
                assert second.stop() == 1, second.output
            assert re.search(rf"cannot open the bootstrap listener on {host}:{bootstrap_port}: Address already in use: "
                             rf"{holder} holds {LOOPBACK}:{bootstrap_port}\n", second.output), second.output
            assert "serving on" not in second.output
        expected = expected_by_partition(data.records)
        consumed = consume_confluent_assigned({"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}"}, data.topic,
                                              range(PARTITIONS), sum(len(v) for v in expected.values()))
        assert in_partition_order(consumed) == expected
    finally:
        status = first.stop()
    assert status == 0, first.output


def _settings(served: Served) -> dict[str, str]:
    """The properties a `serve` was started with."""
    with open(served.process.args[served.process.args.index("--config") + 1], encoding="utf-8") as f:
        return javaproperties.load(f)
