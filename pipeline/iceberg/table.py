"""A topic's table: created on first use in `iceberg.namespace` (created too), or loaded.

The partition spec comes from `topic.<name>.iceberg.partition.spec` when the table is
created: day(timestamp) by default, hour(timestamp), identity(partition), both, or none. A
table that exists keeps its own spec (change it with the engine of your choice; the next
files follow it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dead_letters import dead_letter_table
from .formats import apply_evolution, evolve
from .rows import iceberg_schema
from .settings import TableSettings

# Table properties that say which topic a table follows.
TOPIC_PROPERTY = "tierproxy.topic"


def partition_spec(spec: str, schema: Any) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform

    fields: list[PartitionField] = []
    for part in (p for p in spec.split(",") if p and p != "none"):
        transform: Any
        if part == "partition":
            source, transform, name = "partition", IdentityTransform(), "partition"
        else:
            source = "timestamp"
            transform = DayTransform() if part == "day" else HourTransform()
            name = f"timestamp_{part}"
        fields.append(PartitionField(source_id=schema.find_field(source).field_id, field_id=1000 + len(fields),
                                     transform=transform, name=name))
    return PartitionSpec(*fields)


def load_or_create(catalog: Any, settings: TableSettings, *, dead_letters: bool = False,
                   decoded: Sequence[Any] = ()) -> Any:
    """The topic's table (or its dead-letter table `<topic>__dlq`), created when missing, with
    the `decoded` columns (`dead_letters.decoded_fields`) added or evolved to by Iceberg's rules
    (formats.SchemaEvolutionError, saying which column, when they cannot be)."""
    from pyiceberg.types import StructType

    table = _load_or_create(catalog, settings, dead_letters)
    if decoded:
        change = evolve(table.schema(), StructType(*decoded))
        if change:
            apply_evolution(table, change)
    return table


def _load_or_create(catalog: Any, settings: TableSettings, dead_letters: bool) -> Any:
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    identifier = (settings.namespace, dead_letter_table(settings.topic) if dead_letters else settings.topic)
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    catalog.create_namespace_if_not_exists(settings.namespace)
    schema = iceberg_schema(dead_letters)
    try:
        return catalog.create_table(identifier, schema=schema,
                                    partition_spec=partition_spec(settings.partition_spec, schema),
                                    properties={TOPIC_PROPERTY: settings.topic})
    except TableAlreadyExistsError:  # made at the same time by another writer
        return catalog.load_table(identifier)
