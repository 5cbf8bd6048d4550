"""The resident memory of a whole `tierproxy serve` (the supervisor and every worker, read from
/proc) stays under the bound docs/operations.md documents ("Memory", `proxy.memory`), idle and
while never-reading clients pipeline remote Fetches beside consumers replaying the topic, with
one worker and with two. Run with `-s` to print the figures benchmarks/RESULTS.md records."""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
import time
from pathlib import Path

import pytest

from tierproxy.config import load
from tierproxy.protocol.codecs import encode_request
from tierproxy.protocol.requests import fetch_request
from tierproxy.proxy.memory import MIB, Load, formula_text, memory_bound
from testbed.ports import LOOPBACK, free_ports
from testbed.raw import frame
from tests.helpers.consume import consume_confluent_assigned, expected_by_partition, in_partition_order
from tests.helpers.fixtures import tiered_fixture
from tests.helpers.proxy import free_port_block
from tests.helpers.serve import Served, start_serving
from tests.helpers.tiered import FOUR_KB_PARTITIONS, TieredTopic

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
SPEC = FOUR_KB_PARTITIONS
PARTITIONS = SPEC.partitions
# The case: 16 MiB caches, 50 clients that never read, 8 consumers.
LIMITS = {
    "remote.log.chunk.size.bytes": 256 * 1024,
    "remote.fetch.max.bytes": 4 * MIB,
    "remote.log.chunk.cache.size.bytes": 16 * MIB,
    "remote.log.index.file.cache.total.size.bytes": 16 * MIB,
    "remote.log.reader.threads": 4,
    "max.pending.response.bytes.per.connection": MIB,
}
STALLED = 50
CONSUMERS = 8
FETCH_MAX_BYTES = 4 * MIB  # what every client here asks per Fetch

tiered = tiered_fixture(SPEC)


@pytest.fixture(scope="module")
def tiered_s3(tiered_topics, kafka_cluster, s3_server) -> TieredTopic:
    """The same topic with its remote segments in S3."""
    return tiered_topics(dataclasses.replace(SPEC, store="s3"), kafka_cluster, s3=s3_server)


def test_the_docs_show_the_formula_the_bound_computes():
    operations = (REPO / "docs" / "operations.md").read_text()
    assert formula_text() in operations, (
        "docs/operations.md, \"Memory\": paste the output of "
        "`python -c 'from tierproxy.proxy.memory import formula_text; print(formula_text())'`")


def rss(pid: int) -> int:
    """Resident bytes of `pid` (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def processes(served: Served) -> list[int]:
    return [served.process.pid, *sorted(served.workers())]


def stall(bootstrap_port: int, tiered: TieredTopic, count: int) -> list[socket.socket]:
    """`count` connections that pipeline Fetches of the remote part of every partition and
    never read: each sends until the proxy stops reading it (a few seconds without progress)."""
    stalled = []
    for i in range(count):
        sock = socket.create_connection((LOOPBACK, bootstrap_port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        stalled.append(sock)
    pending = {}
    rng = random.Random(7)
    for sock in stalled:
        # Each Fetch asks every partition from a random remote offset, up to remote.fetch.max.bytes.
        requests = []
        for n in range(200):
            request = fetch_request(tiered.topic, 0, 0, FETCH_MAX_BYTES // PARTITIONS, max_wait_ms=500)
            topic = request.topics[0]
            request = dataclasses.replace(request, max_bytes=type(request.max_bytes)(FETCH_MAX_BYTES), topics=(
                dataclasses.replace(topic, partitions=tuple(
                    dataclasses.replace(topic.partitions[0], partition=type(topic.partitions[0].partition)(p),
                                        fetch_offset=type(topic.partitions[0].fetch_offset)(
                                            rng.randrange(tiered.boundary[p])))
                    for p in range(PARTITIONS))),))
            requests.append(frame(encode_request(request, n + 1, "stalled")))
        pending[sock] = b"".join(requests)
    quiet_since = time.monotonic()
    while pending and time.monotonic() - quiet_since < 3:
        for sock, data in list(pending.items()):
            try:
                sent = sock.send(data)
            except BlockingIOError:
                continue
            quiet_since = time.monotonic()
            pending[sock] = data[sent:]
            if not pending[sock]:
                del pending[sock]
        time.sleep(0.05)
    return stalled


@pytest.mark.parametrize("store, workers", [("local", 1), ("local", 2), ("s3", 2)])
def test_resident_memory_stays_under_the_documented_bound(request, tmp_path, store, workers):
    tiered = request.getfixturevalue("tiered" if store == "local" else "tiered_s3")
    assert tiered.cluster is not None
    bootstrap_port, = free_ports(1)
    settings = {
        "bootstrap.servers": tiered.cluster.bootstrap_servers,
        "proxy.bootstrap.port": bootstrap_port,
        "proxy.broker.port.base": free_port_block(1),
        "metrics.port": free_ports(1)[0] if workers > 1 else 0,
        "proxy.workers": workers,
        "remote.log.index.cache.dir": tmp_path / "index-cache",
        **LIMITS,
        **tiered.store,
    }
    config = load(None, [f"{k}={v}" for k, v in settings.items()])
    served = start_serving(settings, tmp_path)
    stalled: list[socket.socket] = []
    try:
        served.wait_for(r"tierproxy serving on", workers, timeout_s=120)
        time.sleep(1)  # the chunk cache is faulted in on a thread after start
        idle = {pid: rss(pid) for pid in processes(served)}
        assert len(idle) == (workers + 1 if workers > 1 else 1), served.output

        peak = [0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], sum(rss(pid) for pid in processes(served)))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        expected = expected_by_partition(tiered.records)
        total = sum(len(v) for v in expected.values())
        results: list[list[tuple]] = []
        try:
            stalled = stall(bootstrap_port, tiered, STALLED)

            def replay() -> None:
                results.append(consume_confluent_assigned(
                    {"bootstrap.servers": f"{LOOPBACK}:{bootstrap_port}", "fetch.max.bytes": FETCH_MAX_BYTES,
                     "max.partition.fetch.bytes": FETCH_MAX_BYTES // PARTITIONS},
                    tiered.topic, range(PARTITIONS), total, timeout_s=120))

            consumers = [threading.Thread(target=replay) for _ in range(CONSUMERS)]
            for consumer in consumers:
                consumer.start()
            for consumer in consumers:
                consumer.join(150)
        finally:
            sampling.set()
            sampler.join()
        # Every consumer read every record while the stalled clients held their responses.
        assert len(results) == CONSUMERS and all(in_partition_order(r) == expected for r in results)
        idle_bound = memory_bound(config, Load())
        # A consumer fetches on its node connection; its bootstrap connection stays open.
        loaded = Load(connections=STALLED + 2 * CONSUMERS, fetching=STALLED + CONSUMERS,
                      fetch_bytes=(STALLED + CONSUMERS) * FETCH_MAX_BYTES)
        bound = memory_bound(config, loaded)
        print(f"\n{store}, proxy.workers={workers}: idle RSS {_mib(sum(idle.values()))} "
              f"({', '.join(_mib(v) for v in idle.values())}; bound {_mib(idle_bound)}), with {STALLED} stalled "
              f"clients and {CONSUMERS} consumers peak {_mib(peak[0])} (bound {_mib(bound)})")
        assert sum(idle.values()) <= idle_bound, idle
        assert sum(idle.values()) < peak[0] <= bound
    finally:
        for sock in stalled:
            sock.close()
        status = served.stop()
    assert status == 0, served.output


def _mib(value: int) -> str:
    return f"{value / MIB:.0f} MiB"
