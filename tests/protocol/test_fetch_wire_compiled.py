"""The compiled walks (`tierproxy.protocol._fetch_wire`) against the pure-Python reference
(`fetch_wire`) and kio: the same answers on kio's messages at every Fetch version, the same
DecodeError on every truncation and on mutated bytes; and which of the two a process uses."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kio.static.primitive import i32, i64

from tierproxy.protocol import fetch_wire
from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import (
    INTERCEPTED,
    encode_request,
    encode_response,
    make_entity,
    request_schema,
    response_schema,
)
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import parse_response_header, peek_request_header, response_header_version

try:
    from tierproxy.protocol import _fetch_wire
except ImportError:  # no compiler where it was installed: test_built_where_a_compiler_is says so
    _fetch_wire = None

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = list(INTERCEPTED[ApiKey.FETCH])  # 4 to the newest kio has
compiled = pytest.mark.skipif(_fetch_wire is None, reason="tierproxy.protocol._fetch_wire is not built")

# -------------------------------------------------------------------------------- kio's messages

int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
# Kafka's names are ASCII; the walks also take any UTF-8 kio writes.
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ERRORS = [ErrorCode.none, ErrorCode.offset_out_of_range, ErrorCode.not_leader_or_follower,
          ErrorCode.unknown_server_error, ErrorCode.fenced_leader_epoch]


def _classes(schema: type) -> Any:
    """The module of a Fetch schema version: its nested entity classes."""
    return sys.modules[schema.__module__]


@st.composite
def fetch_responses(draw: st.DrawFn, versions: list[int] = VERSIONS) -> tuple[int, Any]:
    """(version, a kio FetchResponse): random topics, partitions, error codes, aborted
    transactions, records, partition tagged fields and node endpoints."""
    version = draw(st.sampled_from(versions))
    schema = response_schema(ApiKey.FETCH, version)
    module = _classes(schema)
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        partitions = []
        for _ in range(draw(st.integers(0, 4))):
            aborted = draw(st.one_of(st.none(), st.lists(st.tuples(int64s, int64s), max_size=3)))
            values: dict[str, Any] = dict(
                partition_index=i32(draw(int32s)), error_code=draw(st.sampled_from(ERRORS)),
                high_watermark=i64(draw(int64s)), last_stable_offset=i64(draw(int64s)),
                log_start_offset=i64(draw(int64s)), preferred_read_replica=i32(draw(int32s)),
                aborted_transactions=None if aborted is None else tuple(
                    make_entity(module.AbortedTransaction, producer_id=i64(p), first_offset=i64(f))
                    for p, f in aborted),
                records=draw(st.one_of(st.none(), st.binary(max_size=200))))
            if hasattr(module, "LeaderIdAndEpoch") and draw(st.booleans()):  # tagged fields, v12+
                values["current_leader"] = module.LeaderIdAndEpoch(leader_id=i32(draw(int32s)),
                                                                   leader_epoch=i32(draw(int32s)))
                values["diverging_epoch"] = module.EpochEndOffset(epoch=i32(draw(int32s)),
                                                                  end_offset=i64(draw(int64s)))
            partitions.append(make_entity(module.PartitionData, **values))
        topics.append(make_entity(module.FetchableTopicResponse, topic=draw(names),
                                  topic_id=uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
                                  partitions=tuple(partitions)))
    values = dict(throttle_time=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
                  error_code=draw(st.sampled_from(ERRORS)), session_id=i32(draw(int32s)), responses=tuple(topics))
    if hasattr(module, "NodeEndpoint"):  # v16+
        values["node_endpoints"] = tuple(
            make_entity(module.NodeEndpoint, node_id=i32(draw(int32s)), host=draw(names), port=i32(draw(int32s)),
                        rack=draw(st.one_of(st.none(), names)))
            for _ in range(draw(st.integers(0, 2))))
    return version, make_entity(schema, **values)


def response_payload(response: Any) -> bytes:
    body = memoryview(encode_response(response, 7))
    _, offset = parse_response_header(body, response_header_version(ApiKey.FETCH, response.__version__))
    return bytes(body[offset:])


@st.composite
def fetch_requests(draw: st.DrawFn, versions: list[int] = VERSIONS) -> tuple[int, Any]:
    """(version, a kio FetchRequest): random topics, partitions, forgotten topics, rack id,
    session and the request's tagged fields."""
    version = draw(st.sampled_from(versions))
    schema = request_schema(ApiKey.FETCH, version)
    module = _classes(schema)
    topics = tuple(
        make_entity(module.FetchTopic, topic=draw(names), topic_id=uuid.UUID(int=draw(st.integers(0, 2**128 - 1))),
                    partitions=tuple(
                        make_entity(module.FetchPartition, partition=i32(draw(int32s)),
                                    current_leader_epoch=i32(draw(int32s)), fetch_offset=i64(draw(int64s)),
                                    last_fetched_epoch=i32(draw(int32s)), log_start_offset=i64(draw(int64s)),
                                    partition_max_bytes=i32(draw(int32s)),
                                    replica_directory_id=draw(st.one_of(st.none(), st.uuids())),
                                    high_watermark=i64(draw(int64s)))
                        for _ in range(draw(st.integers(0, 4)))))
        for _ in range(draw(st.integers(0, 3))))
    forgotten = ()
    if hasattr(module, "ForgottenTopic"):
        forgotten = tuple(
            make_entity(module.ForgottenTopic, topic=draw(names), topic_id=uuid.UUID(int=draw(st.integers(0, 99))),
                        partitions=tuple(i32(p) for p in draw(st.lists(int32s, max_size=4))))
            for _ in range(draw(st.integers(0, 2))))
    values: dict[str, Any] = dict(
        replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        min_bytes=i32(draw(int32s)), max_bytes=i32(draw(int32s)), isolation_level=draw(st.integers(0, 1)),
        session_id=i32(draw(int32s)), session_epoch=i32(draw(int32s)), topics=topics,
        forgotten_topics_data=forgotten, rack_id=draw(names),
        cluster_id=draw(st.one_of(st.none(), names)))
    return version, make_entity(schema, **values)


def request_body(request: Any) -> bytes:
    frame = memoryview(encode_request(request, 7, "client"))
    return bytes(frame[peek_request_header(frame).header_size:])


# -------------------------------------------------------------------------------- outcomes

PURE_REQUEST, PURE_SUMMARY = fetch_wire._request_session_py, fetch_wire._summarize_response_py


def outcome(walk: Callable[[Any, int], Any], buffer: Any, version: int) -> Any:
    """What a walk answers, or the DecodeError it raises (any other exception fails the test)."""
    try:
        return walk(buffer, version)
    except DecodeError as e:
        return DecodeError, str(e)


def assert_alike(buffer: bytes, version: int) -> None:
    """Both request walks and both response summaries agree on `buffer`; a summary the
    walks accept also lets the lazy partition walk through, and its sums agree."""
    assert _fetch_wire is not None
    request = outcome(PURE_REQUEST, buffer, version)
    assert outcome(_fetch_wire.request_session, buffer, version) == request
    summary = outcome(PURE_SUMMARY, buffer, version)
    assert outcome(_fetch_wire.summarize_response, buffer, version) == summary
    if summary[0] is not DecodeError:
        scan = fetch_wire.ScannedResponse(memoryview(buffer), version, summary)
        partitions = [p for _, ps in scan.topics for p in ps]
        assert sum(p.records_size for p in partitions) == scan.records_size
        assert sum(p.error_code == fetch_wire.OUT_OF_RANGE for p in partitions) == scan.out_of_range


# -------------------------------------------------------------------------------- kio's messages

@compiled
@settings(max_examples=300, deadline=None)
@given(fetch_responses())
def test_the_summaries_agree_with_each_other_and_with_kio(message):
    version, response = message
    payload = response_payload(response)
    summary = _fetch_wire.summarize_response(payload, version)
    assert summary == PURE_SUMMARY(payload, version)
    # Over any buffer: a memoryview of a bytearray, at an offset.
    framed = memoryview(bytearray(b"\xff" * 3 + payload))[3:]
    assert _fetch_wire.summarize_response(framed, version) == summary

    partitions = [p for t in response.responses for p in t.partitions]
    throttle, error, session, records_size, out_of_range, tagged = summary
    assert throttle == response.throttle_time // datetime.timedelta(milliseconds=1)
    assert (error, session) == ((response.error_code, response.session_id) if version >= 7 else (0, 0))
    assert records_size == sum(len(p.records or b"") for p in partitions)
    assert out_of_range == sum(p.error_code == ErrorCode.offset_out_of_range for p in partitions)
    assert (tagged is None) == (version < 12)

    scan = fetch_wire.ScannedResponse(memoryview(payload), version, summary)
    assert scan.has_tagged_fields == bool(getattr(response, "node_endpoints", ()))
    assert [(key, [(p.partition_index, p.error_code, p.records_size) for p in ps]) for key, ps in scan.topics] == [
        (t.topic_id if version >= 13 else t.topic,
         [(p.partition_index, p.error_code, len(p.records or b"")) for p in t.partitions])
        for t in response.responses]


@compiled
@settings(max_examples=300, deadline=None)
@given(fetch_requests())
def test_the_request_walks_agree_with_each_other_and_with_kio(message):
    version, request = message
    body = request_body(request)
    session = (request.session_id, request.session_epoch) if version >= 7 else fetch_wire.SESSIONLESS
    assert _fetch_wire.request_session(body, version) == session
    assert PURE_REQUEST(body, version) == session
    assert _fetch_wire.request_session(memoryview(bytearray(body)), version) == session


# -------------------------------------------------------------------------------- bad bytes

@compiled
@settings(max_examples=40, deadline=None)
@given(st.one_of(fetch_responses(), fetch_requests()))
def test_every_truncation_is_the_same_decode_error(message):
    version, entity = message
    whole = response_payload(entity) if "Response" in type(entity).__name__ else request_body(entity)
    for cut in range(len(whole)):
        assert_alike(whole[:cut], version)
    assert_alike(whole + b"\x00", version)


# Lengths and counts made huge or negative: int32, int16 and varint forms.
EXTREMES = [
    (0x7FFFFFFF).to_bytes(4, "big"), (0x80000000).to_bytes(4, "big"), b"\xff\xff\xff\xff", b"\x00\x00\x01\x00",
    b"\x7f\xff", b"\x80\x00", b"\xff\xff",
    b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x7f", b"\xff\xff\xff\xff\xff", b"\x80\x80\x80\x80\x01", b"\xff\x01",
    b"\x00", b"\x01", b"\x7f",
]

mutations = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
        st.tuples(st.just("extreme"), st.integers(0, 10_000), st.sampled_from(EXTREMES)),
        st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=6)),
        st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 8)),
    ),
    min_size=1, max_size=4)


def mutated(buffer: bytes, changes: list[tuple[str, int, Any]]) -> bytes:
    out = bytearray(buffer)
    for kind, at, value in changes:
        at %= len(out) + 1
        if kind == "flip" and at < len(out):
            out[at] ^= value
        elif kind == "extreme":
            out[at:at + len(value)] = value
        elif kind == "insert":
            out[at:at] = value
        elif kind == "delete":
            del out[at:at + value]
    return bytes(out)


@compiled
@settings(max_examples=600, deadline=None)
@given(st.one_of(fetch_responses(), fetch_requests()), mutations)
def test_mutated_bytes_get_the_same_answer_or_the_same_decode_error(message, changes):
    version, entity = message
    whole = response_payload(entity) if "Response" in type(entity).__name__ else request_body(entity)
    assert_alike(mutated(whole, changes), version)


@compiled
@pytest.mark.parametrize("version", VERSIONS)
def test_every_length_and_count_made_extreme_is_the_same_decode_error(version):
    """Each extreme written at every offset of a response and a request of this version."""
    response = response_payload(_small_response(version))
    request = request_body(_small_request(version))
    for whole in (response, request):
        for at in range(len(whole)):
            for value in EXTREMES:
                assert_alike(whole[:at] + value + whole[at + len(value):], version)


def _small_response(version: int) -> Any:
    schema = response_schema(ApiKey.FETCH, version)
    module = _classes(schema)
    partitions = tuple(
        make_entity(module.PartitionData, partition_index=i32(i), error_code=ErrorCode.offset_out_of_range,
                    high_watermark=i64(10), last_stable_offset=i64(10), log_start_offset=i64(0),
                    aborted_transactions=(make_entity(module.AbortedTransaction, producer_id=i64(7),
                                                      first_offset=i64(3)),) if i else None,
                    preferred_read_replica=i32(-1), records=b"batch" if i else None)
        for i in range(2))
    topic = make_entity(module.FetchableTopicResponse, topic="t", topic_id=uuid.UUID(int=1), partitions=partitions)
    values: dict[str, Any] = dict(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(5),
                                  responses=(topic,))
    if hasattr(module, "NodeEndpoint"):
        values["node_endpoints"] = (make_entity(module.NodeEndpoint, node_id=i32(1), host="b", port=i32(9092)),)
    return make_entity(schema, **values)


def _small_request(version: int) -> Any:
    schema = request_schema(ApiKey.FETCH, version)
    module = _classes(schema)
    partitions = tuple(make_entity(module.FetchPartition, partition=i32(p), fetch_offset=i64(1),
                                   partition_max_bytes=i32(100)) for p in range(2))
    forgotten = ()
    if hasattr(module, "ForgottenTopic"):
        forgotten = (make_entity(module.ForgottenTopic, topic="f", topic_id=uuid.UUID(int=2), partitions=(i32(0),)),)
    return make_entity(schema, replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1),
                       session_id=i32(3), session_epoch=i32(1), forgotten_topics_data=forgotten, rack_id="r",
                       topics=(make_entity(module.FetchTopic, topic="t", topic_id=uuid.UUID(int=1),
                                           partitions=partitions),))


@compiled
def test_a_topic_name_that_is_not_utf8_is_a_decode_error():
    payload = bytearray(response_payload(_small_response(11)))
    at = payload.index(b"\x00\x01t") + 2  # the name "t" (int16 length 1)
    payload[at] = 0xFF
    for walk in (PURE_SUMMARY, _fetch_wire.summarize_response):
        with pytest.raises(DecodeError, match=f"topic name at offset {at} is not UTF-8"):
            walk(bytes(payload), 11)


@compiled
def test_the_partitions_are_walked_only_when_asked(monkeypatch):
    walks = []
    walk = fetch_wire._walk_response
    monkeypatch.setattr(fetch_wire, "_walk_response", lambda *args: walks.append(args) or walk(*args))
    payload = memoryview(response_payload(_small_response(16)))
    scan = fetch_wire.ScannedResponse(payload, 16, _fetch_wire.summarize_response(payload, 16))
    assert (scan.out_of_range, scan.records_size, scan.has_tagged_fields) == (2, 5, True)
    assert walks == []
    assert [p.partition_index for _, ps in scan.topics for p in ps] == [0, 1]
    assert scan.topics is scan.topics and len(walks) == 1


# -------------------------------------------------------------------------------- which one runs

def test_built_where_a_compiler_is():
    """`pip install` (the Makefile's editable one too) builds the module when it can."""
    compiler = (sysconfig.get_config_var("CC") or "").split()
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if compiler and shutil.which(compiler[0]) and headers.exists():
        assert _fetch_wire is not None, "a C compiler is here but tierproxy.protocol._fetch_wire was not built"


@compiled
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_the_compiled_module_imports_from_the_checkout_and_from_elsewhere(where, tmp_path):
    """The editable install builds it into protocol/, beside its source (imported through
    the link tierproxy/protocol, which the path finder tries before the editable finder)."""
    result = subprocess.run([sys.executable, "-c", "import tierproxy.protocol._fetch_wire as m; print(m.__file__)"],
                            cwd=ROOT if where == "checkout" else tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()).resolve().parent == ROOT / "protocol"


_WHICH = """
from tierproxy.protocol import fetch_wire
print(fetch_wire.COMPILED, fetch_wire.request_session.__module__, fetch_wire.summarize_response.__module__)
"""


@pytest.mark.parametrize("turned_off", [False, True])
def test_tierproxy_no_extensions_turns_the_compiled_walks_off(turned_off):
    env = {k: v for k, v in os.environ.items() if k != "TIERPROXY_NO_EXTENSIONS"}
    if turned_off:
        env["TIERPROXY_NO_EXTENSIONS"] = "1"
    result = subprocess.run([sys.executable, "-c", _WHICH], env=env, capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    in_use = "tierproxy.protocol.fetch_wire" if turned_off or _fetch_wire is None else "tierproxy.protocol._fetch_wire"
    assert result.stdout.split() == [str(not turned_off and _fetch_wire is not None), in_use, in_use]


def test_this_process_uses_what_the_environment_asks_for():
    """The suite runs once with the compiled walks and once with TIERPROXY_NO_EXTENSIONS=1."""
    expected = _fetch_wire is not None and not os.environ.get("TIERPROXY_NO_EXTENSIONS")
    assert fetch_wire.COMPILED == expected
    assert (fetch_wire.request_session is PURE_REQUEST) == (not expected)
    assert (fetch_wire.summarize_response is PURE_SUMMARY) == (not expected)
