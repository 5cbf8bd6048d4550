"""Records that do not decode go to the dead-letter table `<topic>__dlq`, whole and raw.

`route()` splits a batch of a topic's records (an Arrow table with Kafka's columns: partition,
offset, timestamp, ..., key, value, headers) by what the topic's decoders (pipeline.iceberg.formats)
make of them:

- rows: the records that decoded, or had nothing to decode (raw format, a null key or value),
  with their decoded columns added: the value's columns at the top level under their own names,
  the key's as one struct column `decoded_key`;
- dead letters: the records whose key or value did not decode, with every Kafka column as it
  was (bytes untouched) and `reason` saying which side failed and why.

Every record is in exactly one of the two, so nothing is dropped and a bad record never stops the
table. A decoded column whose name is one of Kafka's is refused when the table is set up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import NestedField, StructType

from tierproxy.pipeline.iceberg.formats import Decoder, FormatError

DEAD_LETTER_SUFFIX = "__dlq"
REASON = "reason"
KEY_COLUMN = "decoded_key"


def dead_letter_table(topic: str) -> str:
    """The name of a topic's dead-letter table, beside the topic's own table."""
    return f"{topic}{DEAD_LETTER_SUFFIX}"


def dead_letter_schema(records: pa.Schema) -> pa.Schema:
    """The dead-letter table's columns: the records' own, then `reason`."""
    return records.append(pa.field(REASON, pa.string(), nullable=False))


def decoded_fields(kafka_columns: Sequence[str], key: Decoder | None, value: Decoder | None) -> list[NestedField]:
    """The columns the decoders add to a topic's table, after Kafka's `kafka_columns` (field ids
    are the decoders' own: a table assigns fresh ones). FormatError if a name is taken."""
    fields: list[NestedField] = list(value.struct.fields) if value is not None else []
    if key is not None:
        fields.append(NestedField(max((f.field_id for f in fields), default=0) + 1, KEY_COLUMN,
                                  StructType(*key.struct.fields), required=False))
    taken = set(kafka_columns)
    for column in fields:
        if column.name in taken:
            raise FormatError(f"the decoded column {column.name!r} has the name of a Kafka column of the table "
                              f"({', '.join(kafka_columns)}); rename the field in the schema")
        taken.add(column.name)
    return fields


@dataclass(frozen=True)
class Routed:
    rows: pa.Table
    dead_letters: pa.Table


def _reasons(records: pa.Table, column: str, decoder: Decoder | None) -> tuple[pa.StructArray | None, pa.Array]:
    if decoder is None:
        return None, pa.nulls(records.num_rows, pa.string())
    decoded, reasons = decoder.decode(records.column(column).combine_chunks())
    if len(decoded) != records.num_rows or len(reasons) != records.num_rows:
        # A row matched to another record's columns or reason would be worse than no table.
        raise ValueError(f"the {column} decoder returned {len(decoded)} rows and {len(reasons)} reasons for "
                         f"{records.num_rows} records")
    return decoded, reasons


def route(records: pa.Table, key: Decoder | None, value: Decoder | None) -> Routed:
    """Split `records` into rows with decoded columns and dead letters with a reason."""
    decoded_fields([*records.column_names], key, value)
    keys, key_reasons = _reasons(records, "key", key)
    values, value_reasons = _reasons(records, "value", value)
    # Both sides' reasons when both fail; one side's otherwise.
    reasons = pa.array([("; ".join(r for r in pair if r) if any(pair) else None)
                        for pair in zip(key_reasons.to_pylist(), value_reasons.to_pylist())], pa.string())
    failed = pc.is_valid(reasons)
    decoded = pc.invert(failed)

    dead = records.filter(failed).append_column(pa.field(REASON, pa.string(), nullable=False),
                                                reasons.filter(failed))
    rows = records.filter(decoded)
    if values is not None:
        # flatten() applies the struct's nulls (a tombstone's) to each column.
        for field, column in zip(values.type, values.flatten()):
            rows = rows.append_column(field, column.filter(decoded))
    if keys is not None:
        rows = rows.append_column(pa.field(KEY_COLUMN, keys.type), keys.filter(decoded))
    return Routed(rows, dead)
