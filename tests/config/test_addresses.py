"""host:port as Kafka writes broker addresses."""

from __future__ import annotations

import pytest

from tierproxy.config.addresses import parse_host_port


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9092", ("127.0.0.1", 9092)),
    ("  broker-1.example.com:19092 ", ("broker-1.example.com", 19092)),
    ("[::1]:9092", ("::1", 9092)),
    ("[fe80::1%eth0]:0", ("fe80::1%eth0", 0)),
    ("::1:9092", ("::1", 9092)),  # unbracketed IPv6: split at the last colon, as Kafka does
    ("kafka:65535", ("kafka", 65535)),
])
def test_host_and_port(text, expected):
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text, reason", [
    ("kafka", "no port"),
    ("", "no port"),
    (":9092", "no host"),
    ("[]:9092", "no host"),
    ("kafka:", "the port must be a number"),
    ("kafka:port", "the port must be a number"),
    ("kafka:-1", "the port must be a number"),
    ("kafka:65536", "the port must be a number"),
    ("kafka:９０９２", "the port must be a number"),  # digits, but not ASCII ones
    ("[::1:9092", r"no '\]'"),
    ("[::1]9092", "no ':port'"),
])
def test_bad_addresses_name_the_text_and_the_reason(text, reason):
    with pytest.raises(ValueError, match=f"^{text!r} is not host:port: {reason}".replace("[", r"\[")):
        parse_host_port(text)
