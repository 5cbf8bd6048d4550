"""The Fetch walks the proxy makes on every Fetch, pure Python against compiled.

A consumer at the tail of `--partitions` partitions (500) without fetch sessions
(librdkafka) names every partition in every request, and the broker's response carries
them all, each with a few new records (as `benchmarks/tail.py` produces: 1 KiB values,
one batch of `--records` per partition). Per call, in microseconds, for each Fetch
version of `--versions` (CPU time of this process, so that other work on the machine
slows the figures less than it would wall time):

- request walk: `request_session`, the structure check of the client's request;
- response summary: `summarize_response`, what the Fetch filter needs of the broker's
  answer when no partition is out of range (throttle time, error, session, records size,
  partitions out of range, tagged fields), and `scan_fetch_response`, the same with the
  `ScannedResponse` around it;
- the response's partitions (`ScannedResponse.topics`): the per-partition objects, built
  only for a response that needs them (a partition out of range).

Each case runs `--rounds` rounds of as many calls as fill `--round-seconds`; best and
median of the rounds. CPU-bound and short: one core, nothing else of the proxy.

    .venv/bin/python benchmarks/fetch_wire.py --partitions 500 --versions 11,16 --rounds 7
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VALUE = os.urandom(1024)


def _record_batch(records: int, base_offset: int) -> bytes:
    """One uncompressed batch of `records` 1 KiB values, as a producer at the tail writes them."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=VALUE, headers=[])
    batch = bytearray(builder.build())
    batch[:8] = base_offset.to_bytes(8, "big")  # the broker's offset (the CRC does not cover it)
    return bytes(batch)


def fetch_messages(version: int, partitions: int, records: int) -> tuple[bytes, bytes]:
    """(request body, response payload) of a sessionless Fetch of one topic's `partitions`."""
    from kio.static.primitive import i32, i64

    from tierproxy.protocol.apis import ApiKey, ErrorCode
    from tierproxy.protocol.codecs import encode_request, encode_response, make_entity, request_schema, response_schema
    from tierproxy.protocol.headers import parse_response_header, peek_request_header, response_header_version

    topic_id = uuid.uuid4()
    request_type = request_schema(ApiKey.FETCH, version)
    request_module = sys.modules[request_type.__module__]
    request = make_entity(
        request_type, replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
        max_bytes=i32(52428800), isolation_level=0, session_id=i32(0), session_epoch=i32(-1),
        topics=(make_entity(request_module.FetchTopic, topic="tail", topic_id=topic_id, partitions=tuple(
            make_entity(request_module.FetchPartition, partition=i32(p), current_leader_epoch=i32(0),
                        fetch_offset=i64(100_000 + p), last_fetched_epoch=i32(0), log_start_offset=i64(-1),
                        partition_max_bytes=i32(1048576))
            for p in range(partitions))),),
        forgotten_topics_data=(), rack_id="")
    frame = memoryview(encode_request(request, 1, "rdkafka"))
    body = bytes(frame[peek_request_header(frame).header_size:])

    response_type = response_schema(ApiKey.FETCH, version)
    response_module = sys.modules[response_type.__module__]
    response = make_entity(
        response_type, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
        responses=(make_entity(response_module.FetchableTopicResponse, topic="tail", topic_id=topic_id,
                               partitions=tuple(
            make_entity(response_module.PartitionData, partition_index=i32(p), error_code=ErrorCode.none,
                        high_watermark=i64(100_000 + p + records), last_stable_offset=i64(100_000 + p + records),
                        log_start_offset=i64(0), aborted_transactions=None, preferred_read_replica=i32(-1),
                        records=_record_batch(records, 100_000 + p))
            for p in range(partitions))),))
    framed = memoryview(encode_response(response, 1))
    _, offset = parse_response_header(framed, response_header_version(ApiKey.FETCH, version))
    return body, bytes(framed[offset:])


def per_call_us(call: Callable[[], Any], rounds: int, round_seconds: float) -> list[float]:
    """CPU microseconds per call in each round; each round as many calls as fill `round_seconds`
    of CPU time."""
    calls = 1
    while True:  # calibrate: double until a fifth of a round is filled
        started = time.process_time()
        for _ in range(calls):
            call()
        elapsed = time.process_time() - started
        if elapsed >= round_seconds / 5:
            break
        calls *= 2
    calls = max(1, round(calls * round_seconds / elapsed))
    results = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            call()
        results.append((time.process_time() - started) / calls * 1e6)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=500)
    parser.add_argument("--records", type=int, default=3, help="records per partition (1 KiB values)")
    parser.add_argument("--versions", default="11,16", help="Fetch versions, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    args = parser.parse_args()

    from tierproxy.protocol import fetch_wire

    try:
        from tierproxy.protocol import _fetch_wire
    except ImportError:
        print("tierproxy.protocol._fetch_wire is not built (pip install -e . with a C compiler)", file=sys.stderr)
        return 1
    if not fetch_wire.COMPILED:
        print("note: TIERPROXY_NO_EXTENSIONS is set; the compiled functions are measured all the same")

    print(f"{platform.node()} {platform.machine()}, nproc {os.cpu_count()}, Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{args.partitions} partitions of one topic, {args.records} records of 1 KiB each; "
          f"CPU µs per call, best / median of {args.rounds} rounds")
    print()
    print("| version | request bytes | response bytes | walk | pure Python µs | compiled µs | pure / compiled |")
    print("|---|---|---|---|---|---|---|")
    for version in (int(v) for v in args.versions.split(",")):
        body, payload = fetch_messages(version, args.partitions, args.records)
        view = memoryview(payload)
        assert fetch_wire._request_session_py(body, version) == _fetch_wire.request_session(body, version)
        assert fetch_wire._summarize_response_py(view, version) == _fetch_wire.summarize_response(view, version)

        def scan(summarize: Callable[[Any, int], Any]) -> Callable[[], Any]:
            return lambda: fetch_wire.ScannedResponse(memoryview(payload), version, summarize(payload, version))

        def partitions(summarize: Callable[[Any, int], Any]) -> Callable[[], Any]:
            return lambda: scan(summarize)().topics

        cases = [
            ("request walk (`request_session`)",
             lambda: fetch_wire._request_session_py(body, version), lambda: _fetch_wire.request_session(body, version)),
            ("response summary (`summarize_response`)",
             lambda: fetch_wire._summarize_response_py(view, version),
             lambda: _fetch_wire.summarize_response(view, version)),
            ("`scan_fetch_response`",
             scan(fetch_wire._summarize_response_py), scan(_fetch_wire.summarize_response)),
            ("scan and its partitions (`.topics`)",
             partitions(fetch_wire._summarize_response_py), partitions(_fetch_wire.summarize_response)),
        ]
        for name, pure, compiled in cases:
            pure_us = per_call_us(pure, args.rounds, args.round_seconds)
            compiled_us = per_call_us(compiled, args.rounds, args.round_seconds)
            best_ratio = min(pure_us) / min(compiled_us)
            print(f"| {version} | {len(body):,} | {len(payload):,} | {name} | {_stats(pure_us)} "
                  f"| {_stats(compiled_us)} | {best_ratio:.1f}x |", flush=True)
    return 0


def _stats(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f}"


if __name__ == "__main__":
    sys.exit(main())
