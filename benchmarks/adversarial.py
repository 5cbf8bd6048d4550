"""Hostile and careless clients against a running proxy, with a well-behaved one beside.

One run starts a real broker whose client listener wants SASL/PLAIN (testbed), produces
`--mb` MB over 4 partitions, tiers all of it to local files and trims the broker's log,
then starts `tierproxy serve` (a subprocess, small caches) and, while a consumer on the
side replays the whole topic through the proxy, throws at it:

- bad frames: random bytes, bad sizes, truncated frames, valid headers with garbage
  bodies, before and after logging in, each on its own connection;
- pre-authentication floods: frames announcing 100 MiB before any login;
- slow clients: connections that send a frame one byte at a time, and idle ones;
- a connection flood from one address, over `max.connections.per.ip`;
- non-reading clients: logged-in connections that keep sending Fetch requests for
  remote offsets and never read a response.

It prints the cases tried, whether the proxy is alive and still answers, its peak RSS
against the documented bound (docs/operations.md, "Memory"), and whether the side
consumer read every record. Exit status 0 only if all hold.

    .venv/bin/python benchmarks/adversarial.py --mb 64

Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill import _free_port, proxy_process, tier_everything, trim_to_end  # noqa: E402  beside this script
from benchmark_data import produce  # noqa: E402

MIB = 1 << 20
PARTITIONS = 4
PASSWORD = "admin-secret"
# The proxy's settings for the run: caches far smaller than the data.
LIMITS = {
    "remote.log.chunk.size.bytes": MIB,
    "remote.log.chunk.cache.size.bytes": 16 * MIB,
    "remote.log.index.file.cache.total.size.bytes": 16 * MIB,
    "remote.log.reader.threads": 4,
    "remote.fetch.max.bytes": 4 * MIB,
    "max.pending.response.bytes.per.connection": MIB,
    "request.receive.timeout.ms": 3000,
    "connections.max.idle.ms": 6000,
    "max.connections.per.ip": 400,
}


NON_READER_FETCH_BYTES = PARTITIONS * MIB  # the broker's part of a non-reader's Fetch: 1 MiB per partition
SIDE_FETCH_MAX_BYTES = 4 * MIB  # the side consumer's fetch.max.bytes


def memory_bound(properties: dict[str, str], non_readers: int, fetching: int, connections: int, floods: int) -> int:
    """docs/operations.md, "Memory" (tierproxy.proxy.memory): the bound for the run's load;
    a pre-authentication flood's frame is received up to sasl.server.max.receive.size."""
    from tierproxy.config import SASL_SERVER_MAX_RECEIVE_SIZE, parse
    from tierproxy.proxy.memory import Load, memory_bound as bound

    config = parse(properties)
    return bound(config, Load(connections=connections, fetching=fetching,
                              fetch_bytes=non_readers * NON_READER_FETCH_BYTES
                              + (fetching - non_readers) * SIDE_FETCH_MAX_BYTES,
                              request_bytes=floods * config[SASL_SERVER_MAX_RECEIVE_SIZE]))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- the clients -------------------------------------------------------------------------


class Proxy:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def open(self, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, local_addr=(source, 0))

    async def login(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        from testbed.raw import plain_login

        reader, writer = await self.open()
        writer.write(plain_login("admin", PASSWORD))
        for _ in range(2):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
        return reader, writer


async def closed(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the proxy closed the connection within `timeout` (anything it sent first is
    read past: a broker's error answer is fine)."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(1 << 16):
                pass
        return True
    except TimeoutError:  # before OSError, of which it is a subclass
        return False
    except (ConnectionError, OSError):
        return True


def bad_frames(rng: random.Random, count: int) -> list[tuple[bool, bytes]]:
    """(log in first?, bytes) of every bad-frame case."""
    from tierproxy.protocol.apis import ApiKey
    from tierproxy.protocol.headers import encode_request_header
    from testbed.raw import frame

    cases = []
    keys = [int(k) for k in ApiKey]
    for i in range(count):
        kind = i % 5
        if kind == 0:
            data = rng.randbytes(rng.randint(1, 200))
        elif kind == 1:
            data = struct.pack(">i", rng.choice([-1, -(2**31), 2**31 - 1, 200 * MIB])) + rng.randbytes(16)
        elif kind == 2:
            data = frame(rng.randbytes(rng.randint(60, 400)))[: rng.randint(5, 50)]  # cut short, then closed
        else:
            header = encode_request_header(rng.choice(keys), rng.randint(0, 17), i, "adversarial", 2)
            data = frame(header + rng.randbytes(rng.randint(0, 120)))
        cases.append((kind >= 3 and i % 2 == 0, data))
    return cases


async def bad_frame_case(proxy: Proxy, login: bool, data: bytes) -> bool:
    reader, writer = await (proxy.login() if login else proxy.open())
    try:
        writer.write(data)
        writer.write_eof()
        return await closed(reader, 15)
    finally:
        writer.close()


async def pre_auth_flood(proxy: Proxy) -> bool:
    reader, writer = await proxy.open()
    try:
        writer.write(struct.pack(">i", 100 * MIB))
        for _ in range(16):  # 1 MiB more at most; the proxy closes after 512 KiB
            writer.write(b"\0" * 65536)
            try:
                await asyncio.wait_for(writer.drain(), 5)
            except (TimeoutError, ConnectionError, OSError):
                break
        return await closed(reader, 10)
    finally:
        writer.close()


async def slow_client(proxy: Proxy, timeout_s: float) -> bool:
    reader, writer = await proxy.open()
    try:
        writer.write(struct.pack(">i", 64))
        deadline = time.monotonic() + timeout_s + 5
        while time.monotonic() < deadline:
            try:
                writer.write(b"\0")
                await writer.drain()
            except (ConnectionError, OSError):
                return True
            if await closed(reader, 0.5):
                return True
        return False
    finally:
        writer.close()


async def idle_client(proxy: Proxy, idle_s: float) -> bool:
    reader, writer = await proxy.open()
    try:
        return await closed(reader, idle_s + 5)
    finally:
        writer.close()


async def connection_flood(proxy: Proxy, count: int) -> int:
    """Connections the proxy closed at once, of `count` opened from one address."""
    opened = [await proxy.open("127.0.0.9") for _ in range(count)]
    try:
        # Well within connections.max.idle.ms: only refused connections close this soon.
        results = await asyncio.gather(*(closed(reader, 1.0) for reader, _ in opened))
    finally:
        for _, writer in opened:
            writer.close()
    return sum(results)


async def non_reader(proxy: Proxy, topic: str, per_partition: int, seconds: float, rng: random.Random) -> int:
    """Logs in, then sends Fetch requests for remote data for `seconds` without reading any
    response; returns how many requests the proxy took before it stopped reading."""
    import dataclasses

    from tierproxy.protocol.codecs import encode_request
    from tierproxy.protocol.requests import fetch_request
    from testbed.raw import frame

    reader, writer = await proxy.login()
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            request = fetch_request(topic, rng.randrange(PARTITIONS), rng.randrange(per_partition), MIB,
                                    max_wait_ms=500)
            topics = request.topics[0]
            request = dataclasses.replace(request, max_bytes=type(request.max_bytes)(50 * MIB), topics=(
                dataclasses.replace(topics, partitions=tuple(
                    dataclasses.replace(topics.partitions[0], partition=type(topics.partitions[0].partition)(p))
                    for p in range(PARTITIONS))),))
            writer.write(frame(encode_request(request, sent + 10, "adversarial")))
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
                sent += 1
            except TimeoutError:
                await asyncio.sleep(0.2)  # the proxy stopped reading us: keep the pressure on
        return sent
    finally:
        writer.transport.abort()


def side_consumer(bootstrap: str, topic: str, expected: int, result: dict) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "adversarial-side",
                         "fetch.max.bytes": SIDE_FETCH_MAX_BYTES, "security.protocol":
                         "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "admin",
                         "sasl.password": PASSWORD, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: set[tuple[int, int]] = set()
    errors = []
    deadline = time.monotonic() + 600
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1):
                if message.error() is not None:
                    errors.append(str(message.error()))
                    continue
                seen.add((message.partition(), message.offset()))
    finally:
        consumer.close()
    result.update(records=len(seen), errors=errors[:5])


async def attack(proxy: Proxy, topic: str, records: int, args: argparse.Namespace, pid: int, counts: dict,
                 fetches_in: list[int]) -> int:
    """Every case at once; returns the peak RSS (KiB) sampled meanwhile."""
    rng = random.Random(args.seed)
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_kb(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())

    async def run_bad_frames() -> None:
        cases = bad_frames(rng, args.bad_frames)
        limit = asyncio.Semaphore(50)

        async def one(login: bool, data: bytes) -> bool:
            async with limit:
                return await bad_frame_case(proxy, login, data)

        results = await asyncio.gather(*(one(login, data) for login, data in cases))
        counts["bad frames"] = (sum(results), len(results))

    async def run_floods() -> None:
        results = await asyncio.gather(*(pre_auth_flood(proxy) for _ in range(args.floods)))
        counts["pre-auth 100 MiB frames"] = (sum(results), len(results))

    async def run_slow() -> None:
        slow = [slow_client(proxy, LIMITS["request.receive.timeout.ms"] / 1000) for _ in range(args.slow)]
        idle = [idle_client(proxy, LIMITS["connections.max.idle.ms"] / 1000) for _ in range(args.slow // 4)]
        results = await asyncio.gather(*slow, *idle)
        counts["slow and idle clients"] = (sum(results), len(results))

    async def run_flood() -> None:
        refused = await connection_flood(proxy, LIMITS["max.connections.per.ip"] + args.over_limit)
        counts["connections over max.connections.per.ip"] = (refused, args.over_limit)

    async def run_non_readers() -> None:
        sent = await asyncio.gather(*(non_reader(proxy, topic, records // PARTITIONS, args.seconds, rng)
                                      for _ in range(args.non_readers)))
        counts["non-reading clients"] = (len(sent), len(sent))
        fetches_in.append(sum(sent))

    try:
        await asyncio.gather(run_bad_frames(), run_floods(), run_slow(), run_non_readers())
        await run_flood()  # alone: its address must be the only one near the per-IP limit
    finally:
        done.set()
        await sampler
    return peak


def alive(bootstrap: str) -> bool:
    from tierproxy.client.cluster import check_login
    from tierproxy.config import parse

    config = parse({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": PASSWORD})
    try:
        asyncio.run(check_login(config))
        return True
    except Exception as e:  # any failure to answer is the finding
        print(f"proxy does not answer: {e}")
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of records tiered (default 64)")
    parser.add_argument("--bad-frames", type=int, default=1000)
    parser.add_argument("--floods", type=int, default=20, help="pre-authentication 100 MiB frames")
    parser.add_argument("--slow", type=int, default=200, help="slow (one byte at a time) clients")
    parser.add_argument("--over-limit", type=int, default=50, help="connections over max.connections.per.ip")
    parser.add_argument("--non-readers", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=15, help="how long non-readers keep sending")
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()

    from testbed.kafka import KafkaCluster

    counts: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="tierproxy-adversarial-") as tmp_dir, \
            KafkaCluster(1, sasl_plain_users={"admin": PASSWORD}) as kafka:
        tmp = Path(tmp_dir)
        internal = f"127.0.0.1:{kafka.listener_ports[0]['INTERNAL']}"
        topic = "adversarial"
        kafka.create_topic(topic, partitions=PARTITIONS)
        records = produce(internal, topic, PARTITIONS, args.mb)
        properties = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "admin", "sasl.password": PASSWORD,
            "proxy.listener.host": "127.0.0.1", "proxy.bootstrap.port": str(_free_port()), "proxy.workers": "1",
            "proxy.broker.port.base": str(_free_port()), "metrics.port": "0",
            "remote.log.storage.backend": "local", "remote.log.storage.local.dir": str(tmp / "remote"),
            "remote.log.metadata.backend": "file", "remote.log.metadata.dir": str(tmp / "metadata"),
            f"topic.{topic}.remote.storage.enable": "true",
            f"topic.{topic}.segment.bytes": str(8 * MIB), f"topic.{topic}.segment.ms": "1",
            **{key: str(value) for key, value in LIMITS.items()},
        }
        copied = asyncio.run(tier_everything(properties))
        asyncio.run(trim_to_end(internal, topic))
        print(f"{records} records, {copied / MIB:.0f} MiB remote; chunk cache "
              f"{LIMITS['remote.log.chunk.cache.size.bytes'] // MIB} MiB", flush=True)
        with proxy_process(properties, tmp / "proxy") as proxy_info:
            pid = proxy_info["pid"]
            host, port = proxy_info["bootstrap"].rsplit(":", 1)
            base_kb = rss_kb(pid)
            side: dict = {}
            consumer = threading.Thread(target=side_consumer, args=(proxy_info["bootstrap"], topic, records, side))
            consumer.start()
            started = time.monotonic()
            fetches_in: list[int] = []
            peak_kb = asyncio.run(attack(Proxy(host, int(port)), topic, records, args, pid, counts, fetches_in))
            attack_s = time.monotonic() - started
            up = alive(proxy_info["bootstrap"])
            consumer.join(600)
            # What the proxy said of failures, for a run whose side consumer saw an error.
            log_lines = (tmp / "proxy" / "serve.log").read_text(errors="replace").splitlines()
            proxy_errors = [line for line in log_lines if " ERROR " in line or "Traceback" in line
                            or "unexpected" in line.lower()][-20:]
            fetching = args.non_readers + 4  # with the side consumer's and the check's own
            connections = fetching + 50 + args.floods + args.slow + args.slow // 4
            bound = memory_bound(properties, args.non_readers, fetching, connections, args.floods)

    tried = sum(total for _, total in counts.values())
    print(f"\n# adversarial run {datetime.date.today()}: {args.mb} MB remote, {attack_s:.0f} s of attack\n")
    print("| case | handled as required | tried |")
    print("|---|---|---|")
    for name, (ok, total) in counts.items():
        print(f"| {name} | {ok} | {total} |")
    consumer_ok = side.get("records") == records and not side.get("errors")
    print(f"\ncases tried: {tried}; proxy alive and answering: {'yes' if up else 'NO'}")
    print(f"Fetch requests the non-reading clients wrote: {sum(fetches_in)} in {args.seconds:.0f} s "
          "(beyond the first few they wait in socket buffers: the proxy stopped reading them)")
    print(f"peak RSS {peak_kb / 1024:.0f} MiB (idle {base_kb / 1024:.0f} MiB), bound {bound / MIB:.0f} MiB "
          f"(docs/operations.md, \"Memory\", for {fetching} fetching of {connections} connections): "
          f"{'within' if peak_kb * 1024 <= bound else 'OVER'}")
    print(f"side consumer: {side.get('records')} of {records} records, errors {side.get('errors')}: "
          f"{'ok' if consumer_ok else 'FAILED'}")
    if not consumer_ok and proxy_errors:
        print("the proxy's log of errors (last 20):\n" + "\n".join(proxy_errors))
    handled = all(ok == total for ok, total in counts.values())
    return 0 if up and consumer_ok and peak_kb * 1024 <= bound and handled else 1


if __name__ == "__main__":
    sys.exit(main())
