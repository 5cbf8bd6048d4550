"""The rows of an Iceberg table of the tier, without a broker: the data source's batches as
the table's columns."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tierproxy.pipeline.datasource import ARROW_SCHEMA_WITH_LEADER_EPOCH
from tierproxy.pipeline.iceberg.rows import ARROW_SCHEMA, table_rows
from tierproxy.pipeline.iceberg.table import partition_spec
from tierproxy.pipeline.iceberg.rows import iceberg_schema


def _batch() -> pa.RecordBatch:
    rows = {
        "key": [b"a", None, b"c"],
        "value": [b"1", b"x", None],
        "topic": ["t"] * 3,
        "partition": [0, 0, 0],
        "offset": [5, 6, 7],
        "timestamp": [1_700_000_000_000_000, 1_700_000_000_001_000, 1_700_000_000_002_000],
        "timestampType": [0, 0, 1],
        "headers": [[("h", b"1"), ("h", None)], [], [("k", b"")]],
        "leaderEpoch": [3, 3, 4],
    }
    return pa.RecordBatch.from_arrays([pa.array(rows[f.name], f.type) for f in ARROW_SCHEMA_WITH_LEADER_EPOCH],
                                      schema=ARROW_SCHEMA_WITH_LEADER_EPOCH)


def test_a_batch_of_the_data_source_becomes_the_tables_rows():
    rows = table_rows(_batch())
    assert rows.schema == ARROW_SCHEMA
    assert rows.column("offset").to_pylist() == [5, 6, 7]
    assert rows.column("leader_epoch").to_pylist() == [3, 3, 4]
    assert rows.column("timestamp_type").to_pylist() == [0, 0, 1]
    assert rows.column("key").to_pylist() == [b"a", None, b"c"]
    assert rows.column("value").to_pylist() == [b"1", b"x", None]
    assert rows.column("headers").to_pylist()[0] == [{"key": "h", "value": b"1"}, {"key": "h", "value": None}]


@pytest.mark.parametrize("spec, fields", [
    ("day", ["timestamp_day"]), ("hour", ["timestamp_hour"]), ("partition", ["partition"]),
    ("partition,day", ["partition", "timestamp_day"]), ("none", []),
])
def test_partition_specs(spec, fields):
    assert [f.name for f in partition_spec(spec, iceberg_schema()).fields] == fields
