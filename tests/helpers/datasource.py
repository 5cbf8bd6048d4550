"""Reads of `spark.read.format("tierproxy")` in tests, as rows to compare with what was produced."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from tierproxy.pipeline.datasource import NAME, SCHEMA
from tests.helpers.produce import ProducedRecord

Row = tuple  # (partition, offset, key, value, headers, timestamp ms)


def read(spark, options: dict[str, str]):
    reader = spark.read.format(NAME)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def rows_of(df, topic: str | None = None) -> list[Row]:
    table = df.toArrow()
    assert table.schema.names == SCHEMA.fieldNames()
    if topic is not None:
        assert set(table.column("topic").to_pylist()) == {topic}
        assert set(table.column("timestampType").to_pylist()) == {0}  # CreateTime, as produced
    columns = {name: table.column(name).to_pylist() for name in ("partition", "offset", "key", "value", "headers")}
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    rows = []
    for i, offset in enumerate(columns["offset"]):
        headers = tuple((h["key"], h["value"]) for h in columns["headers"][i])
        assert micros[i] % 1000 == 0
        rows.append((columns["partition"][i], offset, columns["key"][i], columns["value"][i], headers, micros[i] // 1000))
    return sorted(rows)


def expected(records: Iterable[ProducedRecord]) -> list[Row]:
    return sorted((r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms) for r in records)
