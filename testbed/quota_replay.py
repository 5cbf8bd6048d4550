"""A backfill held to the remote fetch quota (KIP-956), measured: one librdkafka consumer a
partition replays it from offset 0 through a running proxy, while the bytes the proxy reads
from the store (`tierproxy_remote_bytes_in`, all workers together, from its metrics
endpoint) are sampled every `SAMPLE_S`.

From the samples: the rate over every quota window (`window.num` x `window.size.seconds`)
after the first, its highest as a multiple of the quota; the whole run's rate over the quota
(first store read to last record); and the longest a consumer got nothing while another got
records (each gap between two of its deliveries, or from the start to its first, during
which another consumer got records).
"""

from __future__ import annotations

import bisect
import re
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from testbed.ports import LOOPBACK

SAMPLE_S = 0.1
STORE_BYTES = "tierproxy_remote_bytes_in"


@dataclass(frozen=True)
class QuotaReplay:
    store_bytes: int
    seconds: float
    #: store bytes / seconds / quota, first store read to last record
    whole_run: float
    #: the highest store rate over one quota window after the first, / quota
    max_window: float
    #: seconds of the run / (store bytes / quota): at least 0.9 keeps to the quota
    duration: float
    longest_wait_s: float
    windows: int

    def line(self) -> str:
        return (f"{self.store_bytes / 1e6:.1f} MB read from the store in {self.seconds:.1f} s ({self.windows} quota "
                f"windows): whole run {self.whole_run:.2f}x the quota, highest window {self.max_window:.2f}x, "
                f"duration {self.duration:.2f}x bytes/quota, longest wait of a consumer {self.longest_wait_s:.1f} s")


def store_bytes(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{STORE_BYTES}_total(?:{{[^}}]*}})? (\S+)$", text, re.M))


def replay(bootstrap: str, topic: str, records: Mapping[int, int], metrics_port: int, *, quota: int,
           window_s: float, consumer_config: Mapping[str, Any] | None = None, timeout_s: float = 600) -> QuotaReplay:
    """Replay partitions `records` (partition -> its record count) one consumer each, every
    record in order, measured as above. Raises AssertionError when a consumer does not get
    exactly its records in time."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            # Stamped at the scrape's midpoint: a scrape the busy proxy answers late read
            # its counter after it was asked, and a stamp taken before would put those
            # bytes into too short a window.
            asked = time.monotonic()
            read = store_bytes(metrics_port)
            samples.append(((asked + time.monotonic()) / 2, read))
            stop.wait(SAMPLE_S)

    deliveries: dict[int, list[float]] = {p: [] for p in records}
    failures: list[str] = []
    started = time.monotonic()

    def consume(partition: int) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"quota-{topic}-{partition}",
                             "enable.auto.commit": False, **(consumer_config or {})})
        consumer.assign([TopicPartition(topic, partition, 0)])
        expected = 0
        try:
            while expected < records[partition] and time.monotonic() - started < timeout_s:
                got = [m for m in consumer.consume(1000, timeout=0.2) if m.error() is None]
                if got:
                    deliveries[partition].append(time.monotonic())
                for message in got:
                    if message.offset() != expected:
                        failures.append(f"partition {partition}: offset {message.offset()}, {expected} expected")
                        return
                    expected += 1
            if expected != records[partition]:
                failures.append(f"partition {partition}: {expected} of {records[partition]} records")
        finally:
            consumer.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    consumers = [threading.Thread(target=consume, args=(p,)) for p in records]
    for thread in consumers:
        thread.start()
    for thread in consumers:
        thread.join()
    ended = max(max(times, default=started) for times in deliveries.values())
    stop.set()
    sampler.join()
    assert not failures, failures
    return measure(samples, deliveries, started, ended, quota=quota, window_s=window_s)


def measure(samples: list[tuple[float, float]], deliveries: Mapping[int, list[float]], started: float, ended: float,
            *, quota: int, window_s: float) -> QuotaReplay:
    """The figures of a replay from its samples (time, store bytes so far) and each
    consumer's delivery times."""
    first = next(i for i, (_, read) in enumerate(samples) if read > 0)
    begun = samples[max(first - 1, 0)][0]  # the last sample before the first store read
    total = samples[-1][1]
    seconds = ended - begun
    highest = 0.0
    j = first
    for i in range(first, len(samples)):
        if samples[i][0] < begun + window_s:
            continue  # the first window may hold one sample's worth more (Kafka's SimpleRate)
        while j < len(samples) and samples[j][0] < samples[i][0] + window_s:
            j += 1
        if j == len(samples) or samples[j][0] > ended:
            break
        highest = max(highest, (samples[j][1] - samples[i][1]) / (samples[j][0] - samples[i][0]) / quota)
    return QuotaReplay(store_bytes=int(total), seconds=seconds, whole_run=total / seconds / quota, max_window=highest,
                       duration=seconds / (total / quota), longest_wait_s=longest_wait(deliveries, started),
                       windows=int(seconds // window_s))


def longest_wait(deliveries: Mapping[int, list[float]], started: float) -> float:
    """The longest gap between two deliveries to one consumer (or from `started` to its
    first) while another consumer got records."""
    longest = 0.0
    for partition, times in deliveries.items():
        others = sorted(t for p, ts in deliveries.items() if p != partition for t in ts)
        for before, after in zip([started, *times], times):
            if bisect.bisect_right(others, before) < bisect.bisect_left(others, after):
                longest = max(longest, after - before)
    return longest
