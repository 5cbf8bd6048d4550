"""expects_response: only a Produce with acks=0 goes unanswered, at every Produce version."""

import datetime
import struct

import pytest

from kio.static.primitive import i16

from tierproxy.protocol.acks import expects_response, produce_acks
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import encode_request, kio_versions, request_schema
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import encode_request_header, peek_request_header

ACKS = (0, 1, -1)
TRANSACTIONAL_IDS = (None, "", "transactional-producer-7")


def _kio_produce(version: int, acks: int, transactional_id: str | None) -> bytes:
    schema = request_schema(ApiKey.PRODUCE, version)
    request = schema(transactional_id=transactional_id, acks=i16(acks),
                     timeout=datetime.timedelta(seconds=30), topic_data=())
    return encode_request(request, 11, "acks-test")


@pytest.mark.parametrize("version", kio_versions(ApiKey.PRODUCE))
def test_every_produce_version_kio_knows(version):
    for acks in ACKS:
        for transactional_id in TRANSACTIONAL_IDS:
            body = _kio_produce(version, acks, transactional_id)
            header = peek_request_header(body)
            assert produce_acks(header, body) == acks
            assert expects_response(header, body) is (acks != 0), (version, acks, transactional_id)


@pytest.mark.parametrize("version", range(0, 3))
def test_produce_before_transactional_ids_starts_with_acks(version):
    # v0-v2: acks, timeout, topic data (no transactional id); kio has no schema for them.
    assert version < kio_versions(ApiKey.PRODUCE).start
    for acks in ACKS:
        body = encode_request_header(ApiKey.PRODUCE, version, 3, "old", 1) + struct.pack(">hii", acks, 1000, 0)
        assert expects_response(peek_request_header(body), body) is (acks != 0)


def test_produce_newer_than_kio_is_read_as_flexible():
    version = kio_versions(ApiKey.PRODUCE).stop + 2
    for acks in ACKS:
        # Request header v2 with one tagged field, then a compact transactional id "tx".
        header = encode_request_header(ApiKey.PRODUCE, version, 3, "new", 1) + b"\x01\x00\x02ab"
        body = header + b"\x03tx" + struct.pack(">hi", acks, 1000) + b"\x01\x00"
        peeked = peek_request_header(body)
        assert peeked.header_version is None
        assert expects_response(peeked, body) is (acks != 0)


def test_other_requests_always_expect_a_response():
    for api_key in (ApiKey.FETCH, ApiKey.METADATA, ApiKey.SASL_HANDSHAKE):
        body = encode_request_header(api_key, 1, 5, None, 1) + struct.pack(">h", 0)
        assert expects_response(peek_request_header(body), body)


@pytest.mark.parametrize("cut", [2, 1])
def test_a_produce_cut_before_acks_is_a_decode_error(cut):
    body = _kio_produce(3, 0, "tx")
    header = peek_request_header(body)
    short = body[:header.header_size + len("tx") + 2 + 2 - cut]
    with pytest.raises(DecodeError, match="Produce v3 request ends before acks"):
        expects_response(header, short)
    with pytest.raises(DecodeError, match="ends inside its transactional id"):
        expects_response(header, body[:header.header_size + 1])
