"""kio codecs of the intercepted APIs: round trips, and bad input -> DecodeError only."""

import io
import random
import struct
import subprocess
import sys

import pytest

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kio.schema.index import schema_name_map
from kio.serial import entity_writer
from kio.static.primitive import Records

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.errors import FrameError
from tierproxy.protocol.errors import ProtocolError
from tierproxy.protocol.codecs import INTERCEPTED
from tierproxy.protocol.codecs import decode_request
from tierproxy.protocol.codecs import decode_request_frame
from tierproxy.protocol.codecs import decode_response
from tierproxy.protocol.codecs import decode_response_frame
from tierproxy.protocol.codecs import encode_request
from tierproxy.protocol.codecs import encode_response
from tierproxy.protocol.codecs import request_schema
from tierproxy.protocol.codecs import response_schema
from tierproxy.protocol.framing import encode_frame
from tierproxy.protocol.headers import peek_request_header

# kio's phantom types register Hypothesis strategies themselves; Records needs one.
st.register_type_strategy(Records, st.binary(max_size=200).map(Records))

INT32 = st.integers(-(2**31), 2**31 - 1)
APIS = [(key, version) for key, versions in INTERCEPTED.items() for version in versions]
ROUND_TRIP = settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def frame(body: bytes) -> bytes:
    return b"".join(encode_frame(body))


def payload(obj) -> bytes:
    """The payload alone, as kio writes it."""
    buffer = io.BytesIO()
    entity_writer(type(obj))(buffer, obj)
    return buffer.getvalue()


def test_intercepted_versions_come_from_kio():
    for key, versions in INTERCEPTED.items():
        known = schema_name_map[key.name.lower()]
        assert versions.stop == max(known) + 1
    assert INTERCEPTED[ApiKey.FETCH].start == 4
    assert INTERCEPTED[ApiKey.LIST_OFFSETS].start == 1
    assert INTERCEPTED[ApiKey.API_VERSIONS].start == 0
    assert set(INTERCEPTED) == {
        ApiKey.API_VERSIONS,
        ApiKey.METADATA,
        ApiKey.FIND_COORDINATOR,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
    }


@pytest.mark.parametrize(("api_key", "version"), APIS)
def test_request_round_trip(api_key, version):
    @ROUND_TRIP
    @given(st.from_type(request_schema(api_key, version)), INT32, st.none() | st.text(max_size=10))
    def check(request, correlation_id, client_id):
        encoded = encode_request(request, correlation_id, client_id)
        header, decoded = decode_request_frame(frame(encoded))
        assert decoded == request
        assert (header.api_key, header.api_version) == (api_key, version)
        assert (header.correlation_id, header.client_id) == (correlation_id, client_id)

    check()


@pytest.mark.parametrize(("api_key", "version"), APIS)
def test_response_round_trip(api_key, version):
    @ROUND_TRIP
    @given(st.from_type(response_schema(api_key, version)), INT32)
    def check(response, correlation_id):
        encoded = frame(encode_response(response, correlation_id))
        correlation, decoded = decode_response_frame(api_key, version, encoded)
        assert (correlation, decoded) == (correlation_id, response)

    check()


def test_fetch_records_stay_opaque_bytes():
    import datetime
    import uuid

    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v16.response import FetchableTopicResponse
    from kio.schema.fetch.v16.response import FetchResponse
    from kio.schema.fetch.v16.response import PartitionData

    raw = b"\x00" * 8 + b"not a record batch at all"
    partition = PartitionData(
        partition_index=3,
        error_code=ErrorCode.none,
        high_watermark=100,
        last_stable_offset=100,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=Records(raw),
    )
    response = FetchResponse(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=(partition,)),),
    )
    encoded = encode_response(response, 1)
    assert raw in encoded
    _, decoded = decode_response_frame(ApiKey.FETCH, 16, frame(encoded))
    records = decoded.responses[0].partitions[0].records
    assert isinstance(records, bytes) and records == raw


def test_api_versions_response_uses_header_v0():
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.api_versions.v3.response import ApiVersionsResponse

    response = ApiVersionsResponse(
        error_code=ErrorCode.none, api_keys=(), throttle_time=datetime.timedelta(0)
    )
    body = encode_response(response, 77)
    assert body[:4] == struct.pack(">i", 77)
    assert decode_response(ApiKey.API_VERSIONS, 3, body[4:]) == response


def test_frames_from_the_decoder_decode_without_a_copy():
    """FrameDecoder yields views of a writable bytearray; kio's reader needs read-only."""
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.api_versions.v3.response import ApiVersionsResponse

    from tierproxy.protocol.framing import FrameDecoder

    response = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=(), throttle_time=datetime.timedelta(0))
    (body,) = FrameDecoder().feed(b"".join(bytes(p) for p in encode_frame(encode_response(response, 5))))
    assert not body.readonly
    assert decode_response(ApiKey.API_VERSIONS, 3, body[4:]) == response


def test_trailing_bytes_are_refused():
    from kio.schema.describe_cluster.v1.request import DescribeClusterRequest

    request = DescribeClusterRequest(include_cluster_authorized_operations=True, endpoint_type=1)
    body = encode_request(request, 1, None)
    header = peek_request_header(body)
    assert decode_request(ApiKey.DESCRIBE_CLUSTER, 1, body[header.header_size :]) == request
    with pytest.raises(DecodeError, match="DescribeClusterRequest v1: 1 bytes after the payload"):
        decode_request(ApiKey.DESCRIBE_CLUSTER, 1, body[header.header_size :] + b"\x00")


def test_unknown_api_version_is_a_decode_error():
    with pytest.raises(DecodeError, match="no schema for api key 1 version 99"):
        decode_request(ApiKey.FETCH, 99, b"")
    unknown = frame(struct.pack(">hhih", 1, 99, 5, -1) + b"payload")
    with pytest.raises(DecodeError):
        decode_request_frame(unknown)
    with pytest.raises(DecodeError):
        decode_response_frame(ApiKey.FETCH, 99, frame(b"\x00" * 8))


def test_frame_size_must_match():
    with pytest.raises(FrameError):
        decode_request_frame(struct.pack(">i", 10) + b"\x00" * 9)
    with pytest.raises(FrameError):
        decode_response_frame(ApiKey.METADATA, 12, b"\x00\x00")


def test_unknown_error_code_names_the_api():
    from kio.schema.api_versions.v1.response import ApiVersionsResponse

    payload = struct.pack(">hii", 32000, 0, 0)  # error code, empty api_keys, throttle time
    with pytest.raises(DecodeError, match="ApiVersionsResponse v1: ValueError"):
        decode_response(ApiKey.API_VERSIONS, 1, payload)
    assert ApiVersionsResponse.__version__ == 1


def test_hostile_array_length_does_not_reach_kio():
    # kio's native reader pre-allocates an array from its length field and aborts the
    # process when that fails; run in a child so a regression cannot kill the suite.
    code = (
        "import struct\n"
        "from protocol.codecs import decode_response\n"
        "from protocol.errors import DecodeError\n"
        "legacy = struct.pack('>hi', 0, 0x7FFFFFFF) + bytes(16)\n"
        "compact = struct.pack('>h', 0) + b'\\xff\\xff\\xff\\xff\\x0f' + bytes(16)\n"
        "for version, payload in ((1, legacy), (3, compact)):\n"
        "    try:\n"
        "        decode_response(18, version, payload)\n"
        "    except DecodeError as e:\n"
        "        print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "ApiVersionsResponse v1: array of 2147483647 elements at offset 6, 16 bytes left",
        "ApiVersionsResponse v3: array of 4294967294 elements at offset 7, 16 bytes left",
    ]


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(APIS), st.booleans(), st.binary(max_size=200))
def test_garbage_raises_only_decode_error(api, is_request, data):
    decode = decode_request if is_request else decode_response
    try:
        decode(*api, data)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_garbage_frames_raise_only_protocol_errors(data):
    try:
        decode_request_frame(frame(data))
    except ProtocolError:
        pass


MUTATED = [
    (ApiKey.FETCH, 4),
    (ApiKey.FETCH, 18),
    (ApiKey.METADATA, 1),
    (ApiKey.METADATA, 13),
    (ApiKey.LIST_OFFSETS, 11),
    (ApiKey.API_VERSIONS, 4),
]


@pytest.mark.parametrize(("api_key", "version"), MUTATED)
def test_mutated_payloads_decode_or_raise_decode_error(api_key, version):
    """Flipped, cut and inserted bytes in real encodings reach the deep arrays."""
    rng = random.Random(f"{api_key}/{version}")

    @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_type(response_schema(api_key, version)))
    def check(response):
        for _ in range(40):
            mutated = bytearray(payload(response))
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(mutated) + 1)
                op = rng.random()
                if op < 0.5 and at < len(mutated):
                    mutated[at] = rng.getrandbits(8)
                elif op < 0.75:
                    del mutated[at:]
                else:
                    mutated[at:at] = rng.randbytes(rng.randint(1, 6))
            try:
                decode_response(api_key, version, bytes(mutated))
            except DecodeError:
                pass

    check()
