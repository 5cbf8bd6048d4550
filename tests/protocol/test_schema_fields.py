"""The schema fields codecs reads from kio's dataclasses (annotations and metadata, no
private kio module), checked against every schema kio has: the length walk built from
them must end exactly where kio's own writer stopped."""

import dataclasses
import io

from pkgutil import resolve_name

import pytest

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kio.schema.index import schema_name_map
from kio.serial import entity_writer
from kio.static.primitive import Records

from tierproxy.protocol import codecs
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import nested_entities
from tierproxy.protocol.codecs import response_schema
from tierproxy.protocol.codecs import schema_fields

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))

# Every top-level schema kio generates: requests, responses, headers and data records.
SCHEMAS = sorted(
    {resolve_name(path) for versions in schema_name_map.values() for kinds in versions.values()
     for path in kinds.values()},
    key=lambda schema: (schema.__module__, schema.__name__),
)
FEW = settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _id(schema: type) -> str:
    return f"{schema.__module__.removeprefix('kio.schema.')}:{schema.__name__}"


def test_every_kio_schema_is_listed():
    assert len(SCHEMAS) > 600
    assert response_schema(ApiKey.FETCH, 16) in SCHEMAS


@pytest.mark.parametrize("schema", SCHEMAS, ids=_id)
def test_length_walk_ends_where_kio_stops_writing(schema):
    walk = codecs._entity_walk(schema)  # built from schema_fields alone

    @FEW
    @given(st.from_type(schema))
    def check(value):
        buffer = io.BytesIO()
        entity_writer(schema)(buffer, value)
        payload = memoryview(buffer.getvalue())
        assert walk(payload, 0, len(payload)) == len(payload)

    check()


@pytest.mark.parametrize("schema", SCHEMAS, ids=_id)
def test_fields_follow_the_dataclass(schema):
    found = schema_fields(schema)
    assert [f.name for f in found] == [f.name for f in dataclasses.fields(schema)]
    for field in found:
        assert (field.entity is None) != (field.kafka_type is None)
        if field.entity is not None:
            assert nested_entities(schema)[field.entity.__name__] is field.entity
        if field.tag is not None:
            assert schema.__flexible__


def test_nested_entities_of_a_response_version():
    entities = nested_entities(response_schema(ApiKey.LIST_OFFSETS, 9))
    assert set(entities) == {"ListOffsetsTopicResponse", "ListOffsetsPartitionResponse"}
    assert all(entity.__version__ == 9 for entity in entities.values())
    fetch = nested_entities(response_schema(ApiKey.FETCH, 16))
    # Nested at any depth, and the tagged top-level node endpoints.
    assert {"AbortedTransaction", "PartitionData", "NodeEndpoint"} <= set(fetch)


def test_nullable_and_tagged_fields():
    fields = {f.name: f for f in schema_fields(response_schema(ApiKey.FETCH, 16))}
    assert fields["node_endpoints"].tag == 0 and fields["node_endpoints"].array
    partition = {f.name: f for f in schema_fields(nested_entities(response_schema(ApiKey.FETCH, 16))["PartitionData"])}
    assert partition["aborted_transactions"].array and partition["aborted_transactions"].nullable
    assert partition["records"].kafka_type == "records" and partition["records"].nullable
    assert not partition["partition_index"].nullable and partition["partition_index"].kafka_type == "int32"
