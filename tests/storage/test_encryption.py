"""Keys from their files, the chunked AES-256-GCM format, and ranged decryption."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.config import ConfigError, parse
from tierproxy.storage.encryption import KeyEncryptionKey, KeyRing, ObjectCipher
from tierproxy.storage.errors import DecryptionFailed, EncryptionKeyNotFound, WrongEncryptionKey
from tierproxy.storage.manifest import TAG_BYTES, SegmentEncryption

SEGMENT = uuid.UUID("12345678-1234-5678-1234-567812345678")
CHUNK = 1024  # small chunks keep the cases small; the format is the same at 256 KiB


def key_file(directory: Path, name: str, content: bytes | None = None) -> Path:
    path = directory / f"{name}.key"
    path.write_bytes(content if content is not None else base64.b64encode(os.urandom(32)) + b"\n")
    return path


def config(keys: str, active: str = "") -> dict:
    return parse({"bootstrap.servers": "b:9092", "remote.log.storage.encryption.keys": keys,
                  "remote.log.storage.encryption.active.key": active}).values


# ---------------------------------------------------------------- keys


def test_keys_load_from_their_files_and_show_no_material(tmp_path):
    one, two = key_file(tmp_path, "one"), key_file(tmp_path, "two")
    ring = KeyRing.from_config(config(f"k1:{one}, k2:{two}", active="k2"))
    assert list(ring.keys) == ["k1", "k2"] and ring.active is ring.keys["k2"]
    assert ring.keys["k1"].path == one
    shown = repr(ring) + repr(ring.keys["k1"]) + repr(ring.keys["k2"])
    for path in (one, two):
        assert path.read_text().strip() not in shown
    assert "k1" in shown and "k2" in shown
    assert KeyRing.from_config(config(f"k1:{one}")).active is None
    assert not KeyRing.from_config(config("")).keys


@pytest.mark.parametrize("content, message", [
    (b"not base64 at all!\n", "not one line of base64"),
    (base64.b64encode(os.urandom(16)) + b"\n", "holds 16 bytes, a key is 32"),
    (base64.b64encode(os.urandom(32)) + b"\n" + base64.b64encode(os.urandom(32)) + b"\n", "not one line"),
    (b"", "holds 0 bytes"),
])
def test_a_bad_key_file_names_the_key_and_the_file_but_not_its_content(tmp_path, content, message):
    path = key_file(tmp_path, "bad", content)
    with pytest.raises(ConfigError) as raised:
        KeyRing.from_config(config(f"k1:{key_file(tmp_path, 'good')},old:{path}"))
    text = str(raised.value)
    assert message in text and "key 'old'" in text and str(path) in text and "openssl rand -base64 32" in text
    for line in content.split(b"\n"):
        if line:
            assert line.decode(errors="replace") not in text


def test_a_missing_key_file_names_the_key_and_the_file(tmp_path):
    with pytest.raises(ConfigError, match=rf"key 'k1' \(file {tmp_path}/absent.key\): cannot read it"):
        KeyRing.from_config(config(f"k1:{tmp_path}/absent.key"))


@pytest.mark.parametrize("keys, active, message", [
    ("k1:/a.key,k1:/b.key", "", "key id 'k1' is listed twice"),
    ("k1", "", "entry 'k1' is not ID:FILE"),
    ("k 1:/a.key", "", "key id 'k 1'"),
    ("k1:/a.key", "k2", "active.key=k2: not a key of remote.log.storage.encryption.keys (it lists k1)"),
    ("", "k2", "active.key=k2: not a key of remote.log.storage.encryption.keys (it lists no key)"),
])
def test_the_keys_setting_is_checked_when_the_file_is_parsed(keys, active, message):
    with pytest.raises(ConfigError) as raised:
        parse({"bootstrap.servers": "b:9092", "remote.log.storage.encryption.keys": keys,
               "remote.log.storage.encryption.active.key": active})
    assert message in str(raised.value)


def test_encryption_required_needs_an_active_key(tmp_path):
    with pytest.raises(ConfigError, match="encryption.required=true needs remote.log.storage.encryption.active.key"):
        parse({"bootstrap.servers": "b:9092", "remote.log.storage.encryption.keys": f"k1:{tmp_path}/k1.key",
               "remote.log.storage.encryption.required": "true"})
    ring_ = KeyRing.from_config(parse({
        "bootstrap.servers": "b:9092", "remote.log.storage.encryption.keys": f"k1:{key_file(tmp_path, 'k1')}",
        "remote.log.storage.encryption.active.key": "k1", "remote.log.storage.encryption.required": "true"}).values)
    assert ring_.required and ring_.active is ring_.keys["k1"]
    assert not KeyRing.from_config(config(f"k1:{key_file(tmp_path, 'k1')}", active="k1")).required


def test_sse_kms_key_needs_aws_kms():
    with pytest.raises(ConfigError, match="needs remote.log.storage.s3.sse=aws:kms"):
        parse({"bootstrap.servers": "b:9092", "remote.log.storage.s3.sse": "AES256",
               "remote.log.storage.s3.sse.kms.key.id": "alias/tiered"})
    with pytest.raises(ConfigError, match="remote.log.storage.s3.sse"):
        parse({"bootstrap.servers": "b:9092", "remote.log.storage.s3.sse": "aes256"})
    values = parse({"bootstrap.servers": "b:9092", "remote.log.storage.s3.sse": "aws:kms",
                    "remote.log.storage.s3.sse.kms.key.id": "alias/tiered"}).values
    assert values["remote.log.storage.s3.sse"] == "aws:kms"


# ---------------------------------------------------------------- data keys


def ring(*ids: str, active: str = "") -> KeyRing:
    return KeyRing([KeyEncryptionKey(i, Path(f"/k/{i}"), os.urandom(32)) for i in ids], active)


def test_every_copy_gets_its_own_data_key_wrapped_for_its_segment():
    keys = ring("k1", active="k1")
    first, second = keys.seal_segment(SEGMENT), keys.seal_segment(SEGMENT)
    assert first.encryption.key_id == "k1" and first.encryption.chunk_bytes == 256 * 1024
    assert first.encryption.wrapped_data_key != second.encryption.wrapped_data_key
    a = first.object("log", 10).seal_all(b"0123456789")
    assert a != second.object("log", 10).seal_all(b"0123456789")
    opened = keys.open_segment(SEGMENT, first.encryption, "segment")
    assert opened.object("log", 10).open_all(a, "log") == b"0123456789"
    other_segment = uuid.uuid4()
    with pytest.raises(WrongEncryptionKey, match=r"key 'k1' \(file /k/k1\)"):
        keys.open_segment(other_segment, first.encryption, "segment")
    with pytest.raises(EncryptionKeyNotFound, match="encrypted with key 'k1'.*it lists k2"):
        ring("k2").open_segment(SEGMENT, first.encryption, "segment")
    assert ring("k1").seal_segment(SEGMENT) is None  # no active key: copies stay plaintext


# ---------------------------------------------------------------- the chunk format


def cipher(size: int, extension: str = "log", segment: uuid.UUID = SEGMENT, data_key: bytes = b"k" * 32
           ) -> ObjectCipher:
    from tierproxy.storage.encryption import SegmentCipher

    encryption = SegmentEncryption("k1", b"", CHUNK)
    return SegmentCipher(data_key, segment, encryption).object(extension, size)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 5])
def test_stored_form_is_each_chunk_followed_by_its_tag(size):
    content = os.urandom(size)
    sealed = cipher(size).seal_all(content)
    chunks = max(1, -(-size // CHUNK))
    assert len(sealed) == size + TAG_BYTES * chunks == cipher(size).stored_size
    assert cipher(size).open_all(sealed, "o") == content
    step = CHUNK + TAG_BYTES
    for i in range(chunks):  # each chunk alone opens with its index
        part = sealed[i * step:(i + 1) * step]
        assert cipher(size).open(i, part, "o") == content[i * CHUNK:(i + 1) * CHUNK]


def test_a_chunk_opens_only_at_its_own_place():
    content = os.urandom(2 * CHUNK)
    sealed = cipher(2 * CHUNK).seal_all(content)
    first = sealed[:CHUNK + TAG_BYTES]
    with pytest.raises(DecryptionFailed, match="o: chunk 1 fails its AES-GCM tag"):
        cipher(2 * CHUNK).open(1, first, "o")  # another position
    with pytest.raises(DecryptionFailed):
        cipher(2 * CHUNK, extension="index").open(0, first, "o")  # another object
    with pytest.raises(DecryptionFailed):
        cipher(2 * CHUNK, segment=uuid.uuid4()).open(0, first, "o")  # another segment, same data key
    with pytest.raises(DecryptionFailed):
        cipher(3 * CHUNK).open(0, first, "o")  # an object of another size
    with pytest.raises(DecryptionFailed):
        cipher(2 * CHUNK, data_key=b"x" * 32).open(0, first, "o")  # another data key


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5 * CHUNK), data=st.data())
def test_ranged_open_of_any_range_in_pieces_of_any_size(size, data):
    content = bytes(i % 251 for i in range(size))
    stored = cipher(size).seal_all(content)
    start = data.draw(st.integers(0, size - 1))
    last = data.draw(st.integers(start, size - 1))
    first, end = cipher(size).stored_range(start, last)
    piece = data.draw(st.integers(1, 3 * CHUNK))

    async def pieces():
        for i in range(first, end, piece):
            yield stored[i:min(i + piece, end)]

    async def read() -> list:
        return [bytes(p) async for p in cipher(size).open_range(pieces(), start, last, "o")]

    out = asyncio.run(read())
    assert b"".join(out) == content[start:last + 1]
    assert all(len(p) <= CHUNK for p in out)


def test_a_proxy_serving_only_read_replicas_requires_encryption_without_an_active_key(tmp_path):
    """It writes no segment; a configuration that also tiers a topic still needs the key."""
    replica = {"bootstrap.servers": "b:9092", "remote.log.storage.encryption.keys": f"k1:{key_file(tmp_path, 'k1')}",
               "remote.log.storage.encryption.required": "true", "topic.orders.remote.log.read.replica": "true"}
    ring_ = KeyRing.from_config(parse(replica).values)
    assert ring_.required and ring_.active is None and "k1" in ring_.keys
    with pytest.raises(ConfigError, match="encryption.required=true needs remote.log.storage.encryption.active.key"):
        parse({**replica, "topic.payments.remote.storage.enable": "true"})
