"""The data set both benchmarks use: incompressible 1 KiB records, large uncompressed
batches, spread over the partitions (librdkafka)."""

from __future__ import annotations

import os

MB = 1_000_000
RECORD_BYTES = 1024


def produce(bootstrap: str, topic: str, partitions: int, total_mb: int) -> int:
    """`total_mb` MB of records; returns how many. Incompressible, the worst case for bytes copied."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "batch.num.messages": 100_000, "compression.type": "none", "acks": "1",
                         "queue.buffering.max.kbytes": 512 * 1024})
    payload = os.urandom(RECORD_BYTES)
    count = total_mb * MB // RECORD_BYTES
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload, key=b"%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records still undelivered after 120 s")
    return count
