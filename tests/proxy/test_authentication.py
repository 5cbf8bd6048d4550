"""The authentication gate on its own: which requests pass before authentication, which
responses it observes, and the frame bound it sets. (Against the real SASL broker:
test_channel.)"""

from __future__ import annotations

import struct

import pytest

from tierproxy.config import parse
from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.errors import DecodeError
from tierproxy.protocol.headers import encode_request_header, peek_request_header, request_header_version
from tierproxy.proxy.authentication import LearningGate, SaslGate, UnauthenticatedRequest, UpstreamListener

PRE_AUTH = 512 * 1024
AFTER = 100 * 1024 * 1024


def _request(api_key: int, version: int, payload: bytes = b"") -> tuple:
    header_version = request_header_version(api_key, version)
    body = memoryview(encode_request_header(api_key, version, 1, "c", header_version) + payload)
    return peek_request_header(body), body


def _handshake(mechanism: str) -> tuple:
    return _request(ApiKey.SASL_HANDSHAKE, 1, struct.pack(">h", len(mechanism)) + mechanism.encode())


def _authenticate_response(error_code: int) -> memoryview:
    # SaslAuthenticate v1 (response header v0): correlation id, error code, ...
    return memoryview(struct.pack(">ih", 1, error_code) + struct.pack(">h", -1) + struct.pack(">i", 0) + b"\0" * 8)


def _listener(**settings: str) -> UpstreamListener:
    return UpstreamListener(parse({"bootstrap.servers": "b:9092", **settings}))


def test_the_gate_follows_what_is_known_of_the_listener():
    sasl = _listener(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u",
                        "sasl.password": "p"})
    gate = sasl.gate()
    assert isinstance(gate, SaslGate) and not gate.authenticated and gate.max_frame_bytes == PRE_AUTH
    sasl.learned(needs_sasl=False, how="test")  # security.protocol decides, nothing learned overrides it
    assert isinstance(sasl.gate(), SaslGate)

    listener = _listener()  # PLAINTEXT: the proxy's own connections say nothing of the listener
    assert listener.needs_sasl is None
    unknown = listener.gate()
    assert isinstance(unknown, LearningGate) and unknown.max_frame_bytes == PRE_AUTH
    assert unknown.check_request(*_request(ApiKey.FETCH, 12)) is None  # the broker refuses it if it must
    listener.learned(needs_sasl=False, how="test")
    known = listener.gate()
    assert known.max_frame_bytes == AFTER and known.authenticated
    listener.learned(needs_sasl=True, how="test")
    assert listener.gate().max_frame_bytes == PRE_AUTH


def test_a_broker_answering_a_request_lifts_the_bound_and_teaches_the_listener():
    listener = _listener()
    gate = listener.gate()
    gate.check_request(*_request(ApiKey.API_VERSIONS, 3))
    assert not gate.answered(ApiKey.API_VERSIONS)  # answered on SASL listeners too
    assert gate.max_frame_bytes == PRE_AUTH and listener.needs_sasl is None
    gate.check_request(*_request(ApiKey.METADATA, 12))
    assert gate.answered(ApiKey.METADATA)
    assert gate.max_frame_bytes == AFTER and not gate.learning
    assert listener.needs_sasl is False and listener.gate().max_frame_bytes == AFTER


def test_a_sasl_handshake_hands_the_connection_to_the_brokers_rules():
    gate = _listener().gate()
    assert gate.check_request(*_handshake("PLAIN")) is None
    assert not gate.authenticated and gate.max_frame_bytes == PRE_AUTH
    # Filters see only ApiVersions until the login is done.
    assert gate.filtered(ApiKey.API_VERSIONS) and not gate.filtered(ApiKey.FETCH)
    assert not gate.filtered(ApiKey.SASL_AUTHENTICATE)
    with pytest.raises(UnauthenticatedRequest):
        gate.check_request(*_request(ApiKey.FETCH, 12))
    gate.check_request(*_request(ApiKey.SASL_AUTHENTICATE, 1))(_authenticate_response(0))
    assert gate.authenticated and gate.max_frame_bytes == AFTER
    assert gate.filtered(ApiKey.FETCH)


def test_a_broker_closing_an_unanswered_connection_makes_a_plaintext_belief_doubtful():
    listener = _listener()
    listener.learned(needs_sasl=False, how="test")
    quiet = listener.gate()
    quiet.broker_closed()  # nothing asked: an idle connection closed, nothing learned
    assert listener.needs_sasl is False
    refused = listener.gate()
    refused.check_request(*_request(ApiKey.API_VERSIONS, 3))
    refused.answered(ApiKey.API_VERSIONS)
    refused.check_request(*_request(ApiKey.PRODUCE, 9))
    refused.broker_closed()  # as a SASL listener does to a client that skips the login
    assert listener.needs_sasl is None
    assert listener.gate().max_frame_bytes == PRE_AUTH


def test_scram_authenticates_after_two_successful_rounds_and_lifts_the_frame_bound():
    gate = SaslGate(PRE_AUTH, AFTER)
    assert gate.check_request(*_request(ApiKey.API_VERSIONS, 3)) is None
    assert gate.check_request(*_handshake("SCRAM-SHA-512")) is None
    assert gate.max_frame_bytes == PRE_AUTH
    for round_ in (1, 2):
        observer = gate.check_request(*_request(ApiKey.SASL_AUTHENTICATE, 1))
        assert observer is not None
        assert gate.max_frame_bytes == PRE_AUTH
        observer(_authenticate_response(0))
        assert gate.authenticated is (round_ == 2)
    assert gate.max_frame_bytes == AFTER
    # Authenticated: everything passes, nothing more is observed.
    assert gate.check_request(*_request(ApiKey.FETCH, 12)) is None
    assert gate.check_request(*_request(ApiKey.SASL_AUTHENTICATE, 1)) is None


def test_a_failed_round_does_not_count_and_other_requests_are_refused():
    gate = SaslGate(PRE_AUTH, AFTER)
    gate.check_request(*_handshake("PLAIN"))
    observer = gate.check_request(*_request(ApiKey.SASL_AUTHENTICATE, 1))
    observer(_authenticate_response(58))  # SASL_AUTHENTICATION_FAILED
    assert not gate.authenticated and gate.max_frame_bytes == PRE_AUTH
    with pytest.raises(UnauthenticatedRequest, match="FETCH request before SASL authentication completed"):
        gate.check_request(*_request(ApiKey.FETCH, 12))
    with pytest.raises(DecodeError):
        gate.check_request(*_request(ApiKey.SASL_AUTHENTICATE, 1))(memoryview(struct.pack(">i", 1)))
