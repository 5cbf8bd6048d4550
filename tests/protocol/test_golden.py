"""Frames captured from the real broker (tests/protocol/capture_golden.py), decoded
without a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import decode_request_frame, decode_response_frame
from tierproxy.protocol.records import ControlType, control_type, iter_batches

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
INDEX = json.loads((GOLDEN / "index.json").read_text())


def _pair(name: str):
    entry = next(e for e in INDEX if e["name"] == name)
    request = (GOLDEN / f"{name}.request.bin").read_bytes()
    response = (GOLDEN / f"{name}.response.bin").read_bytes()
    header, request_payload = decode_request_frame(request)
    correlation_id, response_payload = decode_response_frame(header.api_key, header.api_version, response)
    assert (header.api_key, header.api_version) == (entry["api_key"], entry["api_version"])
    assert correlation_id == header.correlation_id == entry["correlation_id"]
    return header, request_payload, response_payload


@pytest.mark.parametrize("name", [e["name"] for e in INDEX])
def test_every_golden_pair_decodes(name):
    _pair(name)


def test_librdkafka_api_versions():
    name = next(e["name"] for e in INDEX if e["source"] == "librdkafka" and e["api_key"] == ApiKey.API_VERSIONS)
    header, request, response = _pair(name)
    assert header.client_id == "golden-librdkafka"
    assert request.client_software_name == "confluent-kafka-python"
    assert response.error_code == ErrorCode.none
    keys = {k.api_key for k in response.api_keys}
    assert {ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.PRODUCE} <= keys


def test_librdkafka_metadata():
    name = next(e["name"] for e in INDEX if e["source"] == "librdkafka" and e["api_key"] == ApiKey.METADATA)
    _, request, response = _pair(name)
    assert [t.name for t in request.topics] == ["golden"]
    assert [t.name for t in response.topics] == ["golden"]
    assert response.brokers and response.brokers[0].host == "127.0.0.1"


def test_list_offsets_earliest_is_zero():
    _, request, response = _pair("list-offsets-v7-earliest")
    assert request.topics[0].partitions[0].timestamp == -2
    partition = response.topics[0].partitions[0]
    assert (partition.error_code, partition.offset) == (ErrorCode.none, 0)


def test_fetch_response_batches_walk_with_valid_crcs():
    _, _, response = _pair("fetch-v12")
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    records = partition.records
    batches = list(iter_batches(records, verify_crc=True))
    assert batches[0].base_offset == 0
    for previous, current in zip(batches, batches[1:]):
        assert current.base_offset == previous.next_offset
    assert batches[-1].next_offset == partition.high_watermark
    markers = [control_type(records, b) for b in batches if b.is_control]
    assert markers == [ControlType.COMMIT, ControlType.ABORT]
    # The aborted transaction is listed for READ_COMMITTED readers only; this was READ_UNCOMMITTED.
    assert not partition.aborted_transactions
