"""The Fetch handler's wire scan and encoder agree with kio, byte for byte, on every
version the proxy intercepts."""

from __future__ import annotations

import datetime
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kio.static.primitive import i32, i64

from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import (
    INTERCEPTED,
    decode_response,
    encode_request,
    encode_response,
    make_entity,
    request_schema,
    response_schema,
)
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import parse_response_header, peek_request_header, response_header_version
from tierproxy.protocol.fetch_wire import (
    SESSIONLESS,
    RemotePartition,
    encode_fetch_response,
    request_session,
    scan_fetch_response,
)

VERSIONS = list(INTERCEPTED[ApiKey.FETCH])
ERRORS = [ErrorCode.none, ErrorCode.offset_out_of_range, ErrorCode.not_leader_or_follower,
          ErrorCode.unknown_server_error]


def _module(version: int):
    return __import__(response_schema(ApiKey.FETCH, version).__module__, fromlist=["PartitionData"])


def _payload(response) -> memoryview:
    body = memoryview(encode_response(response, 7))
    _, offset = parse_response_header(body, response_header_version(ApiKey.FETCH, response.__version__))
    return body[offset:]


def _partition(module, index: int, error: ErrorCode, records: bytes | None, aborted, tags: bool):
    values = dict(partition_index=i32(index), error_code=error, high_watermark=i64(1000 + index),
                  last_stable_offset=i64(900 + index), log_start_offset=i64(index), preferred_read_replica=i32(-1),
                  aborted_transactions=None if aborted is None else tuple(
                      make_entity(module.AbortedTransaction, producer_id=i64(p), first_offset=i64(f))
                      for p, f in aborted),
                  records=records)
    if tags and hasattr(module, "LeaderIdAndEpoch"):
        values["current_leader"] = module.LeaderIdAndEpoch(leader_id=i32(2), leader_epoch=i32(5))
    return make_entity(module.PartitionData, **values)


def _topic(module, version: int, name: str, topic_id: uuid.UUID, partitions):
    return make_entity(module.FetchableTopicResponse, topic=name, topic_id=topic_id, partitions=tuple(partitions))


def _response(module, version: int, topics, endpoints: bool = False):
    values = dict(throttle_time=datetime.timedelta(milliseconds=12), error_code=ErrorCode.none,
                  session_id=i32(0), responses=tuple(topics))
    if endpoints and version >= 16:
        values["node_endpoints"] = (make_entity(module.NodeEndpoint, node_id=i32(1), host="broker-1", port=i32(9092),
                                                rack=None),)
    return make_entity(response_schema(ApiKey.FETCH, version), **values)


partition_specs = st.lists(
    st.tuples(st.sampled_from(ERRORS), st.one_of(st.none(), st.binary(max_size=300)),
              st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=3)),
              st.booleans()),
    min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), specs=st.lists(partition_specs, min_size=0, max_size=3),
       endpoints=st.booleans())
def test_scan_finds_every_partition_and_the_spans_rebuild_the_payload(version, specs, endpoints):
    module = _module(version)
    topics = [
        _topic(module, version, f"topic-{t}", uuid.UUID(int=t + 1),
               [_partition(module, i, error, records, aborted, tags)
                for i, (error, records, aborted, tags) in enumerate(spec)])
        for t, spec in enumerate(specs)
    ]
    payload = _payload(_response(module, version, topics, endpoints))
    scan = scan_fetch_response(payload, version)

    assert scan.throttle_time_ms == 12
    assert scan.has_tagged_fields == (endpoints and version >= 16)
    assert scan.any_out_of_range == any(e == ErrorCode.offset_out_of_range for spec in specs for e, *_ in spec)
    assert scan.records_size == sum(len(r or b"") for spec in specs for _, r, _, _ in spec)
    for (key, partitions), topic in zip(scan.topics, topics, strict=True):
        assert key == (topic.topic_id if version >= 13 else topic.topic)
        assert [(p.partition_index, p.error_code) for p in partitions] == [
            (p.partition_index, p.error_code) for p in topic.partitions]
    # The broker's partitions as slices, the header and tagged fields as scanned: the same bytes.
    rebuilt = encode_fetch_response(
        version, [(key, [payload[p.start:p.end] for p in partitions]) for key, partitions in scan.topics],
        throttle_time_ms=scan.throttle_time_ms, error_code=scan.error_code, session_id=scan.session_id,
        tagged_fields=bytes(scan.tagged_fields) if scan.tagged_fields is not None else b"")
    assert b"".join(rebuilt) == bytes(payload)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), error=st.sampled_from(ERRORS),
       batches=st.lists(st.binary(min_size=1, max_size=200), max_size=4),
       aborted=st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=3)))
def test_a_remote_partition_encodes_as_kio_does(version, error, batches, aborted):
    module = _module(version)
    records = b"".join(batches)
    kio_payload = _payload(_response(module, version, [
        _topic(module, version, "remote", uuid.UUID(int=9), [_partition(module, 3, error, records, aborted, False)])]))
    remote = RemotePartition(partition_index=3, error_code=int(error), high_watermark=1003, last_stable_offset=903,
                             log_start_offset=3, aborted_transactions=aborted,
                             records=[memoryview(b) for b in batches], records_size=len(records))
    key = uuid.UUID(int=9) if version >= 13 else "remote"
    parts = encode_fetch_response(version, [(key, [remote])], throttle_time_ms=12)
    assert b"".join(parts) == bytes(kio_payload)
    decoded = decode_response(ApiKey.FETCH, version, b"".join(parts))
    assert decoded.responses[0].partitions[0].records == records


def test_record_batches_are_not_copied():
    batch = memoryview(bytearray(b"x" * 1000))
    remote = RemotePartition(0, 0, 10, 10, 0, None, [batch[:600], batch[600:]], 1000)
    parts = encode_fetch_response(12, [("t", [remote])])
    assert any(part.obj is batch.obj for part in parts if isinstance(part, memoryview))


@pytest.mark.parametrize("version", [4, 12, 16])
def test_a_truncated_response_is_a_decode_error(version):
    module = _module(version)
    payload = _payload(_response(module, version, [
        _topic(module, version, "t", uuid.UUID(int=1), [_partition(module, 0, ErrorCode.none, b"abc" * 10, None, False)])]))
    for cut in (3, len(payload) // 2, len(payload) - 1):
        with pytest.raises(DecodeError):
            scan_fetch_response(payload[:cut], version)
    with pytest.raises(DecodeError):
        scan_fetch_response(bytes(payload) + b"\x00", version)


def _request_body(version: int, session_id: int, epoch: int) -> memoryview:
    """A Fetch request of `version` with two topics, tagged fields where the version has
    them, forgotten topics and a rack id: its body after the request header."""
    schema = request_schema(ApiKey.FETCH, version)
    module = __import__(schema.__module__, fromlist=["FetchPartition"])
    topics = tuple(
        make_entity(module.FetchTopic, topic=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partitions=tuple(
            make_entity(module.FetchPartition, partition=i32(p), current_leader_epoch=i32(3), fetch_offset=i64(p * 10),
                        last_fetched_epoch=i32(2), log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20),
                        replica_directory_id=uuid.UUID(int=9) if p == 1 else None)
            for p in range(3)))
        for t in range(2))
    forgotten = ()
    if hasattr(module, "ForgottenTopic"):
        forgotten = (make_entity(module.ForgottenTopic, topic="gone", topic_id=uuid.UUID(int=7),
                                 partitions=(i32(0), i32(4))),)
    request = make_entity(schema, max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
                          max_bytes=i32(50 << 20), isolation_level=0, session_id=i32(session_id),
                          session_epoch=i32(epoch), topics=topics, forgotten_topics_data=forgotten, rack_id="rack-a")
    frame = memoryview(encode_request(request, 7, "client"))
    return frame[peek_request_header(frame).header_size:]


@pytest.mark.parametrize("version", VERSIONS)
def test_request_session_reads_every_version_and_refuses_every_truncation(version):
    body = _request_body(version, 1234, 5)
    assert request_session(body, version) == ((1234, 5) if version >= 7 else SESSIONLESS)
    assert request_session(_request_body(version, 0, -1), version) == SESSIONLESS
    for length in range(len(body)):
        with pytest.raises(DecodeError):
            request_session(body[:length], version)


_CHECKED_DECODE = """
import random, sys
from tierproxy.protocol.codecs import INTERCEPTED, decode_request
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.fetch_wire import request_session
from tests.protocol.test_fetch_wire import _request_body

def outcome(body, version, checked):
    try:
        return decode_request(1, version, body, checked=checked)
    except DecodeError:
        return DecodeError

rng = random.Random(405)
accepted = agreed = 0
for version in INTERCEPTED[1]:
    original = bytes(_request_body(version, 1234, 5))
    for _ in range(300):
        body = bytearray(original)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(body) + 1)
            op = rng.random()
            if op < 0.5 and at < len(body):
                body[at] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.getrandbits(8)))
            elif op < 0.7:
                del body[at:]
            else:
                body[at:at] = rng.randbytes(rng.randint(1, 6))
        try:
            request_session(bytes(body), version)
        except DecodeError:
            continue
        accepted += 1
        agreed += outcome(bytes(body), version, True) == outcome(bytes(body), version, False)
print(accepted, agreed)
"""


def test_requests_the_session_check_accepts_decode_alike_without_the_length_walk():
    """kio decodes a Fetch request without codecs' length walk once `request_session`
    has walked it. If the session check let a hostile length through, kio would
    allocate from it and abort the process: the mutated requests run in a child."""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", _CHECKED_DECODE], capture_output=True, text=True, timeout=300,
                            cwd=repo)
    assert result.returncode == 0, result.stderr[-2000:]
    accepted, agreed = map(int, result.stdout.split())
    assert accepted > 100 and agreed == accepted
