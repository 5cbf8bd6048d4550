"""Iceberg tables of the tier in tests: a topic with everything a table must keep (every
codec, an aborted and a committed transaction, tombstones, duplicate header keys, a record
over 1 MiB, an empty partition), and the table read back as rows to compare."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from aiokafka import AIOKafkaProducer

from tierproxy.config import Config
from tierproxy.pipeline.copy import metadata_manager
from tierproxy.storage.model import RemoteLogSegmentState
from tierproxy.pipeline.iceberg.settings import load_catalog, table_settings
from tests.helpers.datasource import Row, expected
from tests.helpers.produce import ProducedRecord, produce_mixed

BIG_VALUE_BYTES = (1 << 20) + 4096
# The topic's own limit, over the broker's 1 MiB default, for the big record.
TOPIC_CONFIG = {"max.message.bytes": 4 << 20}


async def produce_everything(bootstrap: str, topic: str, partitions: int, *, per_codec: int = 150,
                             per_transaction: int = 30) -> list[ProducedRecord]:
    """Into partitions [0, partitions) of `topic` (a topic with more stays empty there)."""
    records = await produce_mixed(bootstrap, topic, partitions, per_codec=per_codec, per_transaction=per_transaction)
    return records + await produce_specials(bootstrap, topic)


async def produce_specials(bootstrap: str, topic: str) -> list[ProducedRecord]:
    """On partition 0: a tombstone, a null key, headers with duplicate keys and an empty
    value, and a record over 1 MiB (zstd, so that the batch is compressed too)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20, compression_type="zstd")
    await producer.start()
    produced = []
    try:
        cases = [
            (b"deleted", None, ()),
            (None, b"no key", ()),
            (b"dup", b"headers", (("h", b"1"), ("h", b"2"), ("other", b""), ("h", b"3"))),
            (b"big", bytes(range(256)) * (BIG_VALUE_BYTES // 256), (("size", b"big"),)),
        ]
        for key, value, headers in cases:
            meta = await producer.send_and_wait(topic, key=key, value=value, partition=0, headers=list(headers))
            produced.append(ProducedRecord(0, meta.offset, key, value, headers, meta.timestamp, True, "specials"))
    finally:
        await producer.stop()
    return produced


def table_of(config: Config, topic: str):
    return load_catalog(config).load_table(table_settings(config, topic).identifier)


def arrow_rows(table: pa.Table) -> list[Row]:
    """(partition, offset, key, value, headers, timestamp ms) of every row, sorted."""
    columns = {name: table.column(name).to_pylist() for name in ("partition", "offset", "key", "value", "headers")}
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    rows = []
    for i, offset in enumerate(columns["offset"]):
        headers = tuple((h["key"], h["value"]) for h in columns["headers"][i])
        rows.append((columns["partition"][i], offset, columns["key"][i], columns["value"][i], headers,
                     micros[i] // 1000))
    return sorted(rows)


def table_rows(config: Config, topic: str) -> list[Row]:
    return arrow_rows(table_of(config, topic).scan().to_arrow())


def committed(records: Iterable[ProducedRecord], ends: dict[int, int] | None = None) -> list[Row]:
    """What a read_committed consumer sees of `records` (below `ends[partition]`, if given)."""
    return expected(r for r in records if r.committed and (ends is None or r.offset < ends.get(r.partition, 0)))


async def remote_ends(config: Config, topic: str) -> dict[int, int]:
    """Partition -> the end (exclusive) of its COPY_SEGMENT_FINISHED segments, for the
    partitions of `topic` with any."""
    ends: dict[int, int] = {}
    async with metadata_manager(config) as rlmm:
        for tp in rlmm.partitions():
            finished = [m for m in rlmm.list_segments(tp) if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
            if tp.topic == topic and finished:
                ends[tp.partition] = max(m.end_offset for m in finished) + 1
    return ends


def spark_rows(spark, config: Config, topic: str) -> list[Row]:
    """The table read by Spark: the data files pyiceberg's scan plans, read as Parquet.
    (Iceberg's Spark runtime, built for Spark 4.0 and 4.1, does not load in Spark 4.3.)"""
    tasks = list(table_of(config, topic).scan().plan_files())
    assert tasks and not any(task.delete_files for task in tasks)
    frame = spark.read.parquet(*[task.file.file_path for task in tasks])
    return arrow_rows(frame.toArrow())


def properties_file(config: Config, path) -> str:
    """`config` as a .properties file at `path`, for the CLI."""
    import javaproperties

    path.write_text(javaproperties.dumps(config.raw()))
    return str(path)


# The CLI's backfill in a process of its own, killed (SIGKILL) at the Nth commit of the pass
# (1: the first), after every data file of the pass was written.
_KILLED_AT_COMMIT = """
import os, signal, sys
import tierproxy.pipeline.iceberg.append as append
commit, calls = append.commit_write, []
def killing(*args, **kwargs):
    calls.append(1)
    if len(calls) == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return commit(*args, **kwargs)
append.commit_write = killing
from tierproxy.cli import main
sys.exit(main(sys.argv[2:]))
"""


def killed_backfill(config: Config, topic: str, path, *, at_commit: int = 1):
    """Runs `tierproxy iceberg backfill --topic <topic>` killed at its `at_commit`th commit; the
    finished process (its stderr says what the tasks did)."""
    import os
    import subprocess
    import sys

    properties = properties_file(config, path)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([sys.executable, "-c", _KILLED_AT_COMMIT, str(at_commit), "iceberg", "backfill",
                           "--config", properties, "--topic", topic], capture_output=True, text=True, timeout=240,
                          env=env)
