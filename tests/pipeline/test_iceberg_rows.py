"""The rows of an Iceberg table of the tier, without a broker: the data source's batches as
the table's columns, and the seam for decoders (rows that fail go to the dead letters, whole)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tierproxy.pipeline.datasource import ARROW_SCHEMA_WITH_LEADER_EPOCH
from tierproxy.pipeline.iceberg.rows import ARROW_SCHEMA, DECODED, REASON, split_decoded, table_rows
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


def _digits(raw: pa.BinaryArray) -> tuple[pa.StructArray | None, pa.StringArray]:
    """Decodes values that are ASCII digits; anything else fails."""
    values = raw.to_pylist()
    ok = [v is not None and v.isdigit() for v in values]
    numbers = pa.StructArray.from_arrays([pa.array([int(v) if good else None for v, good in zip(values, ok)])],
                                         names=["n"])
    reasons = pa.array([None if good else f"not a number: {v!r}" for v, good in zip(values, ok)], pa.string())
    return numbers, reasons


def test_rows_that_do_not_decode_go_whole_to_the_dead_letters_with_the_reason():
    rows = table_rows(_batch())
    kept, dead = split_decoded(rows, {"value": _digits})
    assert kept.column("offset").to_pylist() == [5]
    assert kept.column(DECODED["value"]).to_pylist() == [{"n": 1}]
    assert dead.column("offset").to_pylist() == [6, 7]
    assert dead.column(REASON).to_pylist() == ["value: not a number: b'x'", "value: not a number: None"]
    # Nothing lost and nothing changed: the raw columns of every row are there.
    assert sorted(kept.drop_columns([DECODED["value"]]).to_pylist() + dead.drop_columns([REASON]).to_pylist(),
                  key=lambda r: r["offset"]) == rows.to_pylist()


def test_a_decoder_that_miscounts_is_refused():
    with pytest.raises(ValueError, match="3 rows"):
        split_decoded(table_rows(_batch()), {"key": lambda raw: (None, pa.array([None], pa.string()))})


@pytest.mark.parametrize("spec, fields", [
    ("day", ["timestamp_day"]), ("hour", ["timestamp_hour"]), ("partition", ["partition"]),
    ("partition,day", ["partition", "timestamp_day"]), ("none", []),
])
def test_partition_specs(spec, fields):
    assert [f.name for f in partition_spec(spec, iceberg_schema()).fields] == fields
