"""Request and response headers, checked against kio's own header codecs."""

import contextlib
import io

import pytest

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.schema.index import api_key_map
from kio.schema.index import schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_writer

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import encode_request_header
from tierproxy.protocol.headers import encode_response_header
from tierproxy.protocol.headers import parse_response_header
from tierproxy.protocol.headers import peek_request_header
from tierproxy.protocol.headers import request_header_version
from tierproxy.protocol.headers import response_header_version

KNOWN = [(key, v) for key, name in api_key_map.items() for v in schema_name_map[name]]
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
client_ids = st.none() | st.text(max_size=40)
# A tagged field section as a client may send it: count, then tag, size, bytes.
tagged_sections = st.lists(st.binary(max_size=20), max_size=3).map(
    lambda values: bytes([len(values)])
    + b"".join(bytes([tag, len(value)]) + value for tag, value in enumerate(values))
)


def kio_header(version: int, key: int, api_version: int, correlation_id: int, client_id) -> bytes:
    schema = KioHeaderV2 if version == 2 else KioHeaderV1
    buffer = io.BytesIO()
    entity_writer(schema)(
        buffer,
        schema(
            request_api_key=key,
            request_api_version=api_version,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    return buffer.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(KNOWN), int32, client_ids, tagged_sections, st.binary(max_size=20))
def test_request_header_round_trip(api, correlation_id, client_id, tags, payload):
    key, version = api
    header_version = request_header_version(key, version)
    encoded = encode_request_header(key, version, correlation_id, client_id, header_version)
    assert encoded == kio_header(header_version, key, version, correlation_id, client_id)
    if header_version == 2:
        encoded = encoded[:-1] + tags  # replace the empty tagged section
    header = peek_request_header(encoded + payload)
    assert (header.api_key, header.api_version) == (key, version)
    assert header.correlation_id == correlation_id
    assert header.client_id == client_id
    assert header.header_version == header_version
    assert header.flexible == (header_version == 2)
    assert header.header_size == len(encoded)


def test_header_version_follows_kio_schemas():
    for key, version in KNOWN:
        flexible = load_request_schema(key, version).__flexible__
        assert request_header_version(key, version) == (2 if flexible else 1)
    assert request_header_version(ApiKey.FETCH, 12) == 2
    assert request_header_version(ApiKey.FETCH, 11) == 1
    assert response_header_version(ApiKey.FETCH, 12) == 1
    assert response_header_version(ApiKey.METADATA, 8) == 0


def test_api_versions_response_header_is_always_v0():
    for version in (*schema_name_map["api_versions"], 99):
        assert response_header_version(ApiKey.API_VERSIONS, version) == 0
    assert request_header_version(ApiKey.API_VERSIONS, 3) == 2


def test_unknown_api_parses_as_v1_with_unknown_flexibility():
    body = encode_request_header(9999, 3, 42, "c", 1) + b"\x00\x01rest"
    header = peek_request_header(body)
    assert (header.api_key, header.api_version) == (9999, 3)
    assert (header.correlation_id, header.client_id) == (42, "c")
    assert header.header_version is None and header.flexible is None
    assert header.header_size == 11
    assert request_header_version(ApiKey.FETCH, 999) is None
    assert response_header_version(ApiKey.FETCH, 999) is None


@settings(max_examples=100, deadline=None)
@given(int32, st.sampled_from([0, 1]), tagged_sections, st.binary(max_size=20))
def test_response_header_round_trip(correlation_id, version, tags, payload):
    header = encode_response_header(correlation_id, version)
    assert len(header) == 4 + version
    if version == 1:
        header = header[:-1] + tags
    assert parse_response_header(header + payload, version) == (correlation_id, len(header))


def test_truncated_client_id():
    body = encode_request_header(1, 4, 1, "client", 1)[:-2]
    with pytest.raises(DecodeError, match="client id needs 6 bytes"):
        peek_request_header(body)


def test_client_id_must_be_utf8():
    with pytest.raises(DecodeError, match="not UTF-8"):
        peek_request_header(encode_request_header(1, 4, 1, None, 1)[:-2] + b"\x00\x02\xff\xfe")


def test_overlong_varint_in_tagged_fields():
    body = encode_request_header(1, 13, 1, None, 2)[:-1] + b"\xff" * 6
    with pytest.raises(DecodeError, match="varint longer than 5 bytes"):
        peek_request_header(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_garbage_raises_only_decode_error(data):
    with contextlib.suppress(DecodeError):
        peek_request_header(data)
    for version in (0, 1):
        with contextlib.suppress(DecodeError):
            parse_response_header(data, version)
