"""The table's columns, as Kafka defines a record, and records as its Arrow rows.

Top-level columns, so that every engine's query reads the same: `partition`, `offset`,
`timestamp` (timestamptz), `timestamp_type` (0 CreateTime, 1 LogAppendTime), `leader_epoch`
(the batch's partition leader epoch), `key` and `value` (binary; null kept: a null value is
a tombstone), `headers` (list of struct `key` string / `value` binary, in record order,
duplicate keys kept).

Typed columns and the dead-letter table's rows are `dead_letters.route`'s.
"""

from __future__ import annotations

import pyarrow as pa

from tierproxy.pipeline.datasource import LEADER_EPOCH

from .dead_letters import REASON

# Field ids: stable, so that files written by any pass (and any engine) line up.
COLUMNS = ("partition", "offset", "timestamp", "timestamp_type", "leader_epoch", "key", "value", "headers")
HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
ARROW_SCHEMA = pa.schema([  # type: ignore[arg-type]  # the stubs miss pa.field's type
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("timestamp_type", pa.int32(), nullable=False),
    pa.field("leader_epoch", pa.int32()),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE, nullable=False)), nullable=False),
])


def iceberg_schema(dead_letters: bool = False):
    """The table's Iceberg schema (a dead-letter table has `reason` too)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    fields = [
        NestedField(1, "partition", IntegerType(), required=True, doc="Kafka partition"),
        NestedField(2, "offset", LongType(), required=True, doc="Kafka offset"),
        NestedField(3, "timestamp", TimestamptzType(), required=True, doc="record timestamp"),
        NestedField(4, "timestamp_type", IntegerType(), required=True, doc="0 CreateTime, 1 LogAppendTime"),
        NestedField(5, "leader_epoch", IntegerType(), required=False, doc="partition leader epoch of the batch"),
        NestedField(6, "key", BinaryType(), required=False),
        NestedField(7, "value", BinaryType(), required=False, doc="null: a tombstone"),
        NestedField(8, "headers", ListType(9, StructType(NestedField(10, "key", StringType(), required=True),
                                                         NestedField(11, "value", BinaryType(), required=False)),
                                           element_required=True), required=True, doc="in record order"),
    ]
    if dead_letters:
        fields.append(NestedField(12, REASON, StringType(), required=True, doc="why the record did not decode"))
    return Schema(*fields)


def table_rows(batch: pa.RecordBatch) -> pa.Table:
    """A batch of the data source (`read_slice(..., leader_epoch=True)`) as the table's rows."""
    columns = {
        "partition": batch.column("partition"),
        "offset": batch.column("offset"),
        "timestamp": batch.column("timestamp"),
        "timestamp_type": batch.column("timestampType"),
        "leader_epoch": batch.column(LEADER_EPOCH),
        "key": batch.column("key"),
        "value": batch.column("value"),
        "headers": batch.column("headers"),
    }
    arrays = [columns[f.name].cast(f.type) for f in ARROW_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)
