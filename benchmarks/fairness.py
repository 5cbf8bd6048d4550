"""Honest consumers beside hostile clients: the share of their throughput they keep.

One run starts a real broker (SASL/PLAIN, as `adversarial.py`), produces `--mb` MB over 4
partitions, tiers all of it to local files and trims the broker's log. Then, for each
`--workers` setting, it starts `tierproxy serve` and lets `--honest` consumers
(confluent-kafka, each replaying the whole topic again and again, checking that every
partition's offsets come in order, none lost, none twice) read through it in phases of
`--phase` seconds, alternately alone and beside hostile clients:

- `--pipeliners` connections that keep sending Fetch requests for remote offsets and
  never read a response (a burst of 8 every 0.5 s: far more than the proxy reads from
  them; each phase checks that every one still had Fetches unread by the proxy at its end);
- `--slow` connections that read their Fetch responses at `--slow-kbps` KB/s;
- `--resetters` connections that send a Fetch, read a little of the response and reset
  the connection, in a loop.

The phases interleave (alone, hostile, alone, ..., alone), so the machine's noise falls
on both; each hostile phase is also set against the two alone phases around it.

The hostile clients run in a process of their own, at `--hostile-nice` (default 0: the
same priority as everything else), and send Fetch frames encoded once (as a flooding tool
would: encoding each costs 0.4 ms of Python, which here was taken from the honest
consumers' cores, not by the proxy). The process is started, past its imports and with
its frames encoded before the phase's clock starts (a Python start costs it about 0.6 CPU
seconds, which is no attack on the proxy). Before the first phase they run unmeasured, in
slices of `--hostile-warmup` seconds, until the broker's JIT compilers use less than 2% of a
core (at most `--hostile-warmup-max` seconds): the broker compiles its login, connection and
error paths in its first hostile seconds, which otherwise fell on the first hostile phase
(a broker in production has long compiled them). Every phase prints the CPU its JIT
compilers used. Here they
share the machine's cores with the proxy, the broker and the honest consumers, which in
production they would not: their own CPU (Python, a login per resetter connection) is taken
from the honest consumers, and that is not the proxy's unfairness. `--hostile-nice 19` gives the cores to everyone else first, so that
the ratio measures the proxy's fairness; quote which one a figure is. On a machine with every
core busy, nice 19 leaves the hostile clients almost no CPU at all (they barely attack);
`--hostile-cpu CORES` instead caps their process at that many cores (a cgroup v1 `cpu`
quota, as root), so that they attack at a bounded cost. Every phase prints the CPU
seconds of the hostile clients' process, the proxy (all its processes), the broker and
this process (the honest consumers); the proxy's metrics are scraped every 3 s in every
phase alike. Every phase also prints the honest records of each of its seconds: whether
the hostile clients cost them all along or in a burst (their logins and first Fetches come
together at a phase's start).

It prints, per worker setting, the honest records/s alone and beside the hostile
clients, their ratio, the remote reads that ran out of `remote.fetch.max.wait.ms`, the
longest time an honest consumer went without a record during the hostile phases, the
chunk bytes held by and copied for stalled connections, and the share of chunk cache lookups
that hit, per phase (the proxy's metrics: each worker holds its share of the cache and sees
only the connections the kernel gave it). Partition
errors the honest consumers saw (they retry them) are counted apart. Exit status 0 only if no
record was wrong, lost or duplicated. `--profile` samples the proxy with py-spy during the
first alone and the first hostile phase and prints the top functions of each.

    .venv/bin/python benchmarks/fairness.py --workers 1 2
    .venv/bin/python benchmarks/fairness.py --workers 1 2 --hostile-nice 19
    .venv/bin/python benchmarks/fairness.py --workers 1 2 --hostile-cpu 0.2
    .venv/bin/python benchmarks/fairness.py --workers 1 2 --connection-rate 20

`--connection-rate` sets the proxy's `max.connection.creation.rate` (KIP-612): the
resetters' loop of a login, a Fetch and a reset is what costs the honest consumers most
(2 workers kept 0.92 of their throughput without resetters, 0.71-0.74 with them; RESULTS.md),
and that cost is per connection, not per byte (their Fetches cut to 1 MiB changed nothing).

`--send-buffer` sets the proxy's `socket.send.buffer.bytes` (default -1, the kernel's autotuning;
Kafka's broker default is 102400): a bounded buffer takes at most that much of a response to a
client that resets or never reads, and leaves the rest leased in the chunk cache (RESULTS.md,
2026-11-29).

Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import multiprocessing
import os
import random
import resource
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adversarial import PARTITIONS, PASSWORD, Proxy  # noqa: E402  beside this script
from backfill import (  # noqa: E402
    _free_port, proxy_counters, proxy_process, stat_cpu_seconds, tier_everything, tree_cpu_seconds,
    trim_to_end)
from benchmark_data import produce  # noqa: E402
import profiling  # noqa: E402
from testbed.ports import ESTABLISHED, tcp_sockets  # noqa: E402

MIB = 1 << 20
# A pipeliner's Fetches: a burst this often (16/s per connection, 800/s for fifty).
PIPELINED_BURST = 8
PIPELINED_EVERY_S = 0.5
# The broker's JIT has settled once its compilers use less than this share of a core.
JIT_SETTLED = 0.02
# The stalled chunk bytes are sampled this often (Prometheus' own scrapes are 15-60 s apart).
HELD_EVERY_S = 3.0
LIMITS = {
    "remote.log.chunk.size.bytes": MIB,
    "remote.log.chunk.cache.size.bytes": 32 * MIB,
    "remote.log.reader.threads": 4,
    "remote.fetch.max.bytes": 4 * MIB,
    "max.pending.response.bytes.per.connection": MIB,
}
COUNTERS = {
    "tierproxy_remote_fetch_expired_total": "expired",
    "tierproxy_remote_read_seconds_count": "reads",
    "tierproxy_stalled_chunk_bytes_copied_total": "copied",
    "tierproxy_stalled_chunk_bytes": "held",
}
# The chunk cache's lookups, per phase: each worker holds its share of the cache.
CHUNK_LOOKUPS = {
    'tierproxy_cache_hits_total{cache="chunk"}': "hits",
    'tierproxy_cache_misses_total{cache="chunk"}': "misses",
}


# --- the hostile clients -----------------------------------------------------------------


def fetch_frame(topic: str, offsets: list[int], correlation_id: int) -> bytes:
    """A Fetch of every partition at `offsets` (remote ones), 4 MiB per partition."""
    from tierproxy.protocol.codecs import encode_request
    from tierproxy.protocol.requests import fetch_request
    from testbed.raw import frame

    request = fetch_request(topic, 0, 0, 4 * MIB, max_wait_ms=500)
    topics = request.topics[0]
    first = topics.partitions[0]
    partitions = tuple(dataclasses.replace(first, partition=type(first.partition)(p),
                                           fetch_offset=type(first.fetch_offset)(offset))
                       for p, offset in enumerate(offsets))
    request = dataclasses.replace(request, max_bytes=type(request.max_bytes)(50 * MIB),
                                  topics=(dataclasses.replace(topics, partitions=partitions),))
    return frame(encode_request(request, correlation_id, "hostile"))


def random_offsets(rng: random.Random, per_partition: int) -> list[int]:
    return [rng.randrange(per_partition) for _ in range(PARTITIONS)]


class FetchFrames:
    """`count` Fetch frames at random remote offsets, encoded once: a client flooding the
    proxy would not encode each request again (that costs 0.4 ms of Python here, which on
    two shared cores is taken from the honest consumers, not by the proxy)."""

    CORRELATION_ID = struct.Struct(">i")
    CORRELATION_ID_AT = 4 + 2 + 2  # after the frame's size, the API key and the version

    def __init__(self, topic: str, per_partition: int, rng: random.Random, count: int = 256) -> None:
        self.frames = [fetch_frame(topic, random_offsets(rng, per_partition), 0) for _ in range(count)]
        self.rng = rng

    def next(self, correlation_id: int) -> bytes:
        frame = bytearray(self.rng.choice(self.frames))
        self.CORRELATION_ID.pack_into(frame, self.CORRELATION_ID_AT, correlation_id)
        return bytes(frame)


async def pipeliner(proxy: Proxy, frames: FetchFrames, stop: asyncio.Event, done: collections.Counter[str],
                    ports: list[int]) -> None:
    """Sends Fetch requests for remote offsets and never reads a response: a burst of
    `PIPELINED_BURST` every `PIPELINED_EVERY_S` seconds, far more than the proxy answers
    a connection (one at a time, none while its answers are unread); what it does not read
    yet waits in the socket (`unread_requests` counts that at the end of a phase)."""
    _, writer = await proxy.login()
    ports.append(writer.get_extra_info("sockname")[1])
    correlation_id = 10
    try:
        while not stop.is_set():
            writer.write(b"".join(frames.next(correlation_id + i) for i in range(PIPELINED_BURST)))
            correlation_id += PIPELINED_BURST
            done["Fetches pipelined"] += PIPELINED_BURST
            await asyncio.sleep(PIPELINED_EVERY_S)  # the kernel buffers what the proxy does not read
    finally:
        writer.transport.abort()


def unread_requests(proxy_port: int, client_ports: list[int]) -> int:
    """How many of these clients' connections have bytes the proxy has not read yet (the
    receive queue of the proxy's side)."""
    ports = set(client_ports)
    return sum(1 for tcp in tcp_sockets() if tcp.state == ESTABLISHED and tcp.local_port == proxy_port
               and tcp.remote_port in ports and tcp.rx_queue > 0)


async def read_response(reader: asyncio.StreamReader, rate: float | None, most: int | None = None,
                        done: collections.Counter[str] | None = None) -> None:
    """One response frame, at `rate` bytes/s (None: at once); only `most` bytes of it if given."""
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    left = size if most is None else min(size, most)
    piece = 4096
    while left > 0:
        n = min(piece, left)
        await reader.readexactly(n)
        left -= n
        if done is not None:
            done["bytes read slowly"] += n
        if rate is not None:
            await asyncio.sleep(n / rate)


async def slow_reader(proxy: Proxy, frames: FetchFrames, stop: asyncio.Event, rate: float,
                      done: collections.Counter[str]) -> None:
    """Reads its Fetch responses at `rate` bytes/s, one Fetch at a time."""
    reader, writer = await proxy.login()
    correlation_id = 10
    try:
        while not stop.is_set():
            writer.write(frames.next(correlation_id))
            correlation_id += 1
            await read_response(reader, rate, done=done)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.transport.abort()


async def resetter(proxy: Proxy, frames: FetchFrames, stop: asyncio.Event, done: collections.Counter[str]) -> None:
    """Sends a Fetch, reads 64 KiB of the response, resets the connection; in a loop."""
    while not stop.is_set():
        reader, writer = await proxy.login()
        try:
            writer.write(frames.next(10))
            await read_response(reader, None, 64 * 1024)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()  # a reset: RST, not FIN
            done["resets"] += 1


async def hostile(proxy: Proxy, frames: FetchFrames, seconds: float,
                  args: argparse.Namespace) -> collections.Counter[str]:
    """The hostile clients for `seconds`; what they did (the load they made)."""
    done: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    ports: list[int] = []
    clients = [pipeliner(proxy, frames, stop, done, ports) for _ in range(args.pipeliners)]
    clients += [slow_reader(proxy, frames, stop, args.slow_kbps * 1000, done) for _ in range(args.slow)]
    clients += [resetter(proxy, frames, stop, done) for _ in range(args.resetters)]
    tasks = [asyncio.create_task(client) for client in clients]
    await stop.wait()
    done["pipeliners with Fetches unread by the proxy at the end"] = unread_requests(proxy.port, ports)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return done


def hostile_process(host: str, port: int, topic: str, per_partition: int, seconds: float,
                    args: argparse.Namespace, seed: int,
                    report: "multiprocessing.Queue[tuple[float, dict[str, int]] | None]", go: Any) -> None:
    """The hostile clients for `seconds`, in a process of their own at `args.hostile_nice`
    (and in the cgroup of `args.hostile_cgroup`, if any), once `go` is set; puts None on
    `report` when ready (imports done, frames encoded), then the CPU seconds its clients
    used and what they did."""
    os.nice(args.hostile_nice)
    if args.hostile_cgroup:
        (Path(args.hostile_cgroup) / "cgroup.procs").write_text(str(os.getpid()))
    frames = FetchFrames(topic, per_partition, random.Random(seed))
    report.put(None)
    go.wait()
    started = own_cpu_seconds()
    done = asyncio.run(hostile(Proxy(host, port), frames, seconds, args))
    report.put((own_cpu_seconds() - started, dict(done)))


@contextlib.contextmanager
def hostile_ready(proxy: Proxy, topic: str, per_partition: int, seconds: float, args: argparse.Namespace,
                  seed: int) -> Iterator[Callable[[], tuple[float, dict[str, int]]]]:
    """A child process for one hostile phase, started, past its imports and with its Fetch
    frames encoded (a Python start costs it about 0.6 CPU seconds, which is not an attack on
    the proxy); yields the call
    that runs the phase and returns the CPU seconds its clients used and what they did."""
    context = multiprocessing.get_context("spawn")  # not fork: this process runs the consumers' threads
    report: multiprocessing.Queue[tuple[float, dict[str, int]] | None] = context.Queue()
    go = context.Event()
    child = context.Process(target=hostile_process,
                            args=(proxy.host, proxy.port, topic, per_partition, seconds, args, seed, report, go))
    child.start()

    def run() -> tuple[float, dict[str, int]]:
        go.set()
        result = report.get(timeout=seconds + 120)
        assert result is not None
        return result

    try:
        if report.get(timeout=120) is not None:
            raise RuntimeError("the hostile process reported before it was ready")
        yield run
    finally:
        go.set()
        child.join(seconds + 30)
        if child.is_alive():
            child.kill()


def run_hostile(proxy: Proxy, topic: str, per_partition: int, seconds: float, args: argparse.Namespace,
                seed: int) -> tuple[float, dict[str, int]]:
    """One hostile phase in a child process; the CPU seconds its clients used, and what they did."""
    with hostile_ready(proxy, topic, per_partition, seconds, args, seed) as run:
        return run()


def hostile_warmup(proxy: Proxy, topic: str, per_partition: int, args: argparse.Namespace,
                   rng: random.Random) -> None:
    """Hostile clients, unmeasured, in slices of `args.hostile_warmup` seconds until the broker's
    JIT compilers used less than JIT_SETTLED of a core in the last slice (at most
    `args.hostile_warmup_max` seconds): a broker that has just started compiles its login,
    connection and error paths in the first hostile seconds (1.7 CPU s of the first 12 s
    hostile phase after 6 s of warm-up, 0.1 s of the third, on 2026-11-29), which in production,
    where it has been running for days, it does not."""
    spent = 0.0
    while True:
        jit = jit_cpu_seconds(args.broker_pid)
        run_hostile(proxy, topic, per_partition, args.hostile_warmup, args, rng.randrange(1 << 30))
        spent += args.hostile_warmup
        jit = jit_cpu_seconds(args.broker_pid) - jit
        settled = jit < JIT_SETTLED * args.hostile_warmup
        print(f"  hostile warm-up: {spent:g} s; the broker's JIT compilers used {jit:.2f} CPU s in the last "
              f"{args.hostile_warmup:g} s{'' if settled else ' (not settled)'}", flush=True)
        if settled or spent + args.hostile_warmup > args.hostile_warmup_max:
            return


@contextlib.contextmanager
def cpu_cap(cores: float | None):
    """A cgroup (v1 `cpu` controller) whose processes get at most `cores` cores together; its
    path, or None without a cap."""
    if cores is None:
        yield None
        return
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").exists():
        raise SystemExit(f"--hostile-cpu needs the cgroup v1 cpu controller at {root}")
    group = root / f"tierproxy-fairness-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(cores * 100_000))))
        yield str(group)
    finally:
        for _ in range(50):  # the hostile process of the last phase may still be leaving
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def read_errors_by_reason(metrics_port: int) -> collections.Counter[str]:
    """The proxy's failed remote reads so far (all clients'), by reason."""
    import urllib.request

    errors: collections.Counter[str] = collections.Counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("tierproxy_remote_read_errors_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                errors[reason] += int(float(line.rsplit(" ", 1)[1]))
    return errors


def jit_cpu_seconds(pid: int) -> float:
    """CPU time so far of a JVM's JIT compiler threads (HotSpot names them "C1 CompilerThread<n>"
    and "C2 CompilerThread<n>"; /proc shows the first 15 characters)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith(("C1 Compiler", "C2 Compiler")):
                total += stat_cpu_seconds(task / "stat")  # the thread's own, not the process's
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the honest consumers ----------------------------------------------------------------


@dataclasses.dataclass
class Honest:
    """What the honest consumers read, as they read it."""

    records: int = 0
    wrong: list[str] = dataclasses.field(default_factory=list)  # out of order, lost or twice
    errors: list[str] = dataclasses.field(default_factory=list)  # partition errors (the client retries)
    replays: int = 0
    last_record: list[float] = dataclasses.field(default_factory=list)  # per consumer
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def honest_consumer(index: int, bootstrap: str, topic: str, per_partition: dict[int, int], state: Honest,
                    stop: threading.Event) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fairness-{index}",
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                         "sasl.username": "admin", "sasl.password": PASSWORD, "enable.auto.commit": False})
    try:
        while not stop.is_set():
            consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            following = dict.fromkeys(per_partition, 0)  # the offset each partition must give next
            while not stop.is_set() and any(following[p] < per_partition[p] for p in following):
                messages = consumer.consume(1000, timeout=0.5)
                for message in messages:
                    if message.error() is not None:
                        with state.lock:
                            state.errors.append(str(message.error()))
                        continue
                    p, offset = message.partition(), message.offset()
                    if offset != following[p]:
                        with state.lock:
                            state.wrong.append(f"consumer {index} partition {p}: offset {offset}, "
                                               f"expected {following[p]}")
                    following[p] = offset + 1
                if messages:
                    with state.lock:
                        state.records += len(messages)
                        state.last_record[index] = time.monotonic()
            if not stop.is_set():
                with state.lock:
                    state.replays += 1
    finally:
        consumer.close()


# --- the run -----------------------------------------------------------------------------


def gap_watch(state: Honest, stop: threading.Event, hostile_on: threading.Event, worst: list[float]) -> None:
    """The longest an honest consumer went without a record while the hostile clients ran."""
    while not stop.wait(0.2):
        if hostile_on.is_set():
            now = time.monotonic()
            with state.lock:
                worst[0] = max(worst[0], max(now - t for t in state.last_record))


def run_setting(properties: dict[str, str], tmp: Path, workers: int, topic: str, per_partition: dict[int, int],
                args: argparse.Namespace) -> dict:
    metrics_port = _free_port()
    serving = {**properties, "proxy.workers": str(workers), "proxy.bootstrap.port": str(_free_port()),
               "proxy.broker.port.base": str(_free_port()), "metrics.port": str(metrics_port)}
    alone: list[float] = []
    beside: list[float] = []
    with proxy_process(serving, tmp / f"proxy-{workers}") as proxy_info:
        host, port = proxy_info["bootstrap"].rsplit(":", 1)
        proxy = Proxy(host, int(port))
        state = Honest(last_record=[time.monotonic()] * args.honest)
        stop = threading.Event()
        hostile_on = threading.Event()
        worst = [0.0]
        hostile_cpu_seconds: list[tuple[float, ...]] = []
        alone_cpu_seconds: list[tuple[float, ...]] = []
        proxy_per_record: list[tuple[bool, float]] = []
        chunk_hits: list[float] = []  # per hostile phase, the share of chunk lookups that hit
        alone_chunk_hits: list[float] = []
        threads = [threading.Thread(target=honest_consumer, args=(i, proxy_info["bootstrap"], topic, per_partition,
                                                                  state, stop)) for i in range(args.honest)]
        threads.append(threading.Thread(target=gap_watch, args=(state, stop, hostile_on, worst)))
        for thread in threads:
            thread.start()
        rng = random.Random(args.seed)
        time.sleep(args.warmup)
        if args.hostile_warmup:  # the broker's and the proxy's first logins and remote reads
            hostile_warmup(proxy, topic, max(per_partition.values()), args, rng)
            time.sleep(args.warmup)
        before = proxy_counters(metrics_port, COUNTERS)
        errors_before = read_errors_by_reason(metrics_port)
        held_peak = 0.0
        try:
            for phase in range(2 * args.rounds + 1):  # alone first and last: every hostile phase between two
                with_hostile = phase % 2 == 1
                hostile_child = contextlib.ExitStack()
                if with_hostile:  # started and ready before the phase's clock starts
                    run = hostile_child.enter_context(hostile_ready(proxy, topic, max(per_partition.values()), args.phase,
                                                            args, rng.randrange(1 << 30)))
                with state.lock:
                    records, started = state.records, time.monotonic()
                    state.last_record = [started] * args.honest
                proxy_cpu, own_cpu = tree_cpu_seconds(proxy_info["pid"]), own_cpu_seconds()
                broker_cpu, jit_cpu = tree_cpu_seconds(args.broker_pid), jit_cpu_seconds(args.broker_pid)
                lookups = proxy_counters(metrics_port, CHUNK_LOOKUPS)
                # The metrics are scraped in every phase alike: a scrape costs the proxy CPU.
                phase_over = threading.Event()
                peak: list[float] = [0.0]
                watcher = threading.Thread(target=_held_watch, args=(metrics_port, phase_over, peak))
                watcher.start()
                timeline: list[int] = []
                ticker = threading.Thread(target=_timeline, args=(state, phase_over, timeline))
                ticker.start()
                # The first alone and the first hostile phase, with --profile.
                raw = tmp / f"proxy-{workers}-{phase}.raw" if args.profile and phase < 2 else None
                with profiling.record(proxy_info["pid"], raw) if raw else contextlib.nullcontext():
                    if with_hostile:
                        hostile_on.set()
                        hostile_cpu, done = run()
                    else:
                        hostile_cpu, done = 0.0, {}
                        time.sleep(args.phase)
                phase_over.set()
                watcher.join()
                ticker.join()
                cpu = (hostile_cpu, tree_cpu_seconds(proxy_info["pid"]) - proxy_cpu, own_cpu_seconds() - own_cpu,
                       tree_cpu_seconds(args.broker_pid) - broker_cpu, jit_cpu_seconds(args.broker_pid) - jit_cpu)
                with state.lock:
                    phase_records = state.records - records
                    rate = phase_records / (time.monotonic() - started)
                lookups_after = proxy_counters(metrics_port, CHUNK_LOOKUPS)
                hits, misses = (lookups_after[key] - lookups[key] for key in ("hits", "misses"))
                hit_share = hits / max(hits + misses, 1)
                (chunk_hits if with_hostile else alone_chunk_hits).append(hit_share)
                hostile_child.close()
                (hostile_cpu_seconds if with_hostile else alone_cpu_seconds).append(cpu)
                (beside if with_hostile else alone).append(rate)
                # The proxy's CPU per honest record: what hostile clients add to it is the
                # proxy's work for them.
                proxy_per_record.append((with_hostile, cpu[1] / max(phase_records, 1)))
                if raw:
                    print(f"proxy profile, {'hostile' if with_hostile else 'alone'} phase:\n"
                          + profiling.format_summary(*profiling.summarize(raw), top=25), flush=True)
                if with_hostile:
                    hostile_on.clear()
                    held_peak = max(held_peak, peak[0])
                cpu_note = (f" ({', '.join(f'{n:,} {what}' for what, n in sorted(done.items()))}; CPU s: "
                            f"hostile clients {cpu[0]:.1f}, proxy {cpu[1]:.1f}, honest consumers {cpu[2]:.1f}, "
                            f"broker {cpu[3]:.1f}, of it its JIT compilers {cpu[4]:.1f})") if with_hostile else (
                    f" (CPU s: proxy {cpu[1]:.1f}, honest consumers {cpu[2]:.1f}, broker {cpu[3]:.1f}, "
                    f"of it its JIT compilers {cpu[4]:.1f})")
                print(f"  {workers} worker(s), phase {phase + 1}: {'hostile' if with_hostile else 'alone  '} "
                      f"{rate:,.0f} records/s{cpu_note}; chunk cache {hit_share:.0%} hits, "
                      f"{misses / args.phase:,.0f} misses/s; thousands of records per second: "
                      f"{' '.join(str(round(n / 1000)) for n in timeline)}", flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
        after = proxy_counters(metrics_port, COUNTERS)
        read_errors = read_errors_by_reason(metrics_port) - errors_before
    return {"alone": alone, "beside": beside, "wrong": state.wrong, "errors": state.errors,
            "replays": state.replays,
            "expired": after["expired"] - before["expired"], "reads": after["reads"] - before["reads"],
            "copied": after["copied"] - before["copied"], "held_peak": held_peak, "gap": worst[0],
            "cpu": hostile_cpu_seconds, "alone_cpu": alone_cpu_seconds, "read_errors": read_errors,
            "proxy_per_record": proxy_per_record, "chunk_hits": chunk_hits, "alone_chunk_hits": alone_chunk_hits}


def _timeline(state: Honest, phase_over: threading.Event, per_second: list[int]) -> None:
    """The honest records of each second of the phase, in `per_second`: whether a
    hostile phase costs them all along or in a burst."""
    with state.lock:
        last = state.records
    while not phase_over.wait(1.0):
        with state.lock:
            now = state.records
        per_second.append(now - last)
        last = now


def _held_watch(metrics_port: int, phase_over: threading.Event, peak: list[float]) -> None:
    """The peak of the chunk bytes stalled connections hold, sampled every `HELD_EVERY_S` until
    `phase_over` is set (as often in every phase: a scrape costs the proxy CPU, 10-130 ms with
    two workers, and it falls on each phase alike)."""
    while not phase_over.is_set():
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], proxy_counters(metrics_port, {"tierproxy_stalled_chunk_bytes": "held"})["held"])
        phase_over.wait(HELD_EVERY_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of records tiered (default 64)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="proxy.workers settings to run")
    parser.add_argument("--honest", type=int, default=8, help="honest consumers")
    parser.add_argument("--pipeliners", type=int, default=50, help="connections that pipeline and never read")
    parser.add_argument("--slow", type=int, default=8, help="connections reading at --slow-kbps")
    parser.add_argument("--slow-kbps", type=float, default=10)
    parser.add_argument("--resetters", type=int, default=4, help="connections resetting mid-response")
    parser.add_argument("--phase", type=float, default=15, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3, help="(alone, hostile) pairs per setting")
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--hostile-warmup", type=float, default=6,
                        help="seconds of hostile clients before the first phase, not measured, repeated until the "
                             "broker's JIT compilers settle (it compiles its login and connection paths in the first "
                             "hostile seconds); 0: none")
    parser.add_argument("--hostile-warmup-max", type=float, default=60,
                        help="at most this many seconds of hostile warm-up (default 60)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--hostile-nice", type=int, default=0,
                        help="niceness of the hostile clients' process (19: the proxy's fairness alone)")
    parser.add_argument("--hostile-cpu", type=float, metavar="CORES",
                        help="cap the hostile clients' process at this many cores (cgroup v1, as root)")
    parser.add_argument("--connection-rate", type=int, metavar="PER_SECOND",
                        help="max.connection.creation.rate of the proxy (default: Kafka's, no bound)")
    parser.add_argument("--send-buffer", type=int, metavar="BYTES",
                        help="socket.send.buffer.bytes of the proxy (default: the proxy's, -1, the kernel's "
                             "autotuning; Kafka's is 102400)")
    parser.add_argument("--profile", action="store_true", help="py-spy the proxy in the first hostile phase")
    args = parser.parse_args()

    from testbed.kafka import KafkaCluster

    results: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tierproxy-fairness-") as tmp_dir, \
            KafkaCluster(1, sasl_plain_users={"admin": PASSWORD}) as kafka:
        tmp = Path(tmp_dir)
        args.broker_pid = next(iter(kafka.pids.values()))
        internal = f"127.0.0.1:{kafka.listener_ports[0]['INTERNAL']}"
        topic = "fairness"
        kafka.create_topic(topic, partitions=PARTITIONS)
        produce(internal, topic, PARTITIONS, args.mb)
        properties = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "admin", "sasl.password": PASSWORD,
            "proxy.listener.host": "127.0.0.1",
            "remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote"),
            "remote.log.metadata.backend": "file", "remote.log.metadata.dir": str(tmp / "metadata"),
            f"topic.{topic}.remote.storage.enable": "true",
            f"topic.{topic}.segment.bytes": str(8 * MIB), f"topic.{topic}.segment.ms": "1",
            **{key: str(value) for key, value in LIMITS.items()},
            **({"max.connection.creation.rate": str(args.connection_rate)} if args.connection_rate else {}),
            **({"socket.send.buffer.bytes": str(args.send_buffer)} if args.send_buffer is not None else {}),
        }
        copied = asyncio.run(tier_everything(properties | {"proxy.bootstrap.port": "0",
                                                            "proxy.broker.port.base": "0", "metrics.port": "0"}))
        ends = asyncio.run(trim_to_end(internal, topic))
        per_partition = {p: ends[p] for p in range(PARTITIONS)}
        print(f"{sum(ends.values())} records, {copied / MIB:.0f} MiB remote; chunk cache "
              f"{LIMITS['remote.log.chunk.cache.size.bytes'] // MIB} MiB", flush=True)
        with cpu_cap(args.hostile_cpu) as args.hostile_cgroup:
            for workers in args.workers:
                results[workers] = run_setting(properties, tmp, workers, topic, per_partition, args)

    print(f"\n# fairness run {datetime.date.today()}: {args.mb} MB remote, {args.honest} honest consumers; "
          f"hostile: {args.pipeliners} pipelining non-readers, {args.slow} at {args.slow_kbps:g} KB/s, "
          f"{args.resetters} resetting (nice {args.hostile_nice}"
          f"{f', max.connection.creation.rate {args.connection_rate}' if args.connection_rate else ''}"
          f"{f', socket.send.buffer.bytes {args.send_buffer}' if args.send_buffer is not None else ''}"
          f"{f', at most {args.hostile_cpu:g} cores' if args.hostile_cpu else ''}); {args.rounds} x ({args.phase:g} s alone, "
          f"{args.phase:g} s hostile)\n")
    print("| workers | honest records/s alone | beside hostile | ratio | per round | longest honest gap (hostile) "
          "| remote reads (expired) | honest partition errors | stalled chunk bytes held, peak "
          "| copied for stalled |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for workers, r in results.items():
        alone = sum(r["alone"]) / len(r["alone"])
        beside = sum(r["beside"]) / len(r["beside"])
        # Each hostile phase against the two alone phases around it: the machine's own noise
        # (it is shared) moves them together; the median of these is the figure to quote.
        rounds = [b / ((r["alone"][i] + r["alone"][i + 1]) / 2) for i, b in enumerate(r["beside"])]
        per_round = ", ".join(f"{x:.2f}" for x in rounds)
        print(f"| {workers} | {alone:,.0f} | {beside:,.0f} | {beside / alone:.2f} (median {statistics.median(rounds):.2f}) "
              f"| {per_round} | {r['gap']:.1f} s "
              f"| {r['reads']:,.0f} ({r['expired']:,.0f}) | {len(r['errors'])} | {r['held_peak'] / MIB:.1f} MiB "
              f"| {r['copied'] / MIB:.1f} MiB |")
        cpu = [sum(c[i] for c in r["cpu"]) / (len(r["cpu"]) * args.phase) for i in range(5)]
        alone_cpu = [sum(c[i] for c in r["alone_cpu"]) / (len(r["alone_cpu"]) * args.phase) for i in range(5)]
        per_record = {h: statistics.median(x for w, x in r["proxy_per_record"] if w == h) * 1e6 for h in (False, True)}
        print(f"  {workers} worker(s), CPU cores used in the hostile phases: hostile clients {cpu[0]:.2f}, "
              f"proxy {cpu[1]:.2f}, honest consumers {cpu[2]:.2f}, broker {cpu[3]:.2f} (of it its JIT compilers "
              f"{cpu[4]:.2f}); alone: proxy "
              f"{alone_cpu[1]:.2f}, honest consumers {alone_cpu[2]:.2f}, broker {alone_cpu[3]:.2f}; proxy CPU µs per honest record (median) alone {per_record[False]:.1f}, "
              f"beside hostile {per_record[True]:.1f}; chunk cache hits (median of phases) alone "
              f"{statistics.median(r['alone_chunk_hits']):.0%}, beside hostile {statistics.median(r['chunk_hits']):.0%}")
        if r["read_errors"]:
            print(f"  {workers} worker(s), failed remote reads (all clients') by reason: "
                  + ", ".join(f"{reason} {n:,}" for reason, n in sorted(r["read_errors"].items())))
        if r["wrong"]:
            ok = False
            print(f"  {workers} worker(s): WRONG records: {r['wrong'][:5]}")
        if r["errors"]:
            print(f"  {workers} worker(s), honest consumers' errors (retried): {sorted(set(r['errors']))[:3]}")
    replays = ", ".join(f"{w} worker(s) {r['replays']}" for w, r in results.items())
    print(f"\nreplays completed: {replays}; records wrong, lost or duplicated: {'none' if ok else 'SOME'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
