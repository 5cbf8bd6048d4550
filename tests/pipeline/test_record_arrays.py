"""The compiled record decoder (`tierproxy.pipeline._record_arrays`) against the pure-Python
reference (aiokafka's decoder through `storage.records.batch_columns`): the same arrays for
every codec, null keys and values, headers, LOG_APPEND_TIME; the same RecordDecodeError, or the
same records, for any truncated or mutated batch; and which of the two a process uses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierproxy.pipeline import record_arrays
from tierproxy.protocol.records import HEADER_SIZE, Compression, iter_batches
from tierproxy.storage.records import RecordDecodeError
from tests.helpers.record_batches import BASE_TIMESTAMP, COMPRESSORS, build, sample, with_body

compiled = pytest.mark.skipif(record_arrays._compiled is None, reason="tierproxy.pipeline._record_arrays is not built")


def header_of(data: bytes):
    (header,) = iter_batches(data, verify_crc=False)
    return header


def as_lists(arrays: record_arrays.RecordArrays) -> tuple:
    return (arrays.offsets.to_pylist(), arrays.timestamps.to_pylist(), arrays.keys.to_pylist(),
            arrays.values.to_pylist(), list(arrays.headers))


def compiled_and_reference(data: bytes, header=None) -> tuple:
    """(compiled, reference): each the records as lists, or the RecordDecodeError's type."""
    results = []
    for decode in (record_arrays.batch_arrays, lambda d, h: record_arrays._from_columns(d)):
        try:
            results.append(as_lists(decode(data, header or header_of(data))))
        except RecordDecodeError as e:
            results.append(type(e))
    return tuple(results)


def compressed(name: str, records=None, **kwargs) -> bytes:
    data = build(records if records is not None else sample(300), base_offset=1_000, **kwargs)
    if name == "none":
        return data
    compression, compress = COMPRESSORS[name]
    return with_body(data, compress(data[HEADER_SIZE:]), compression)


@compiled
@pytest.mark.parametrize("name", ["none", *sorted(COMPRESSORS)])
def test_the_compiled_arrays_are_the_reference(name):
    data = compressed(name)
    mine, reference = compiled_and_reference(data)
    assert mine == reference
    offsets, timestamps, keys, values, headers = mine
    assert offsets == list(range(1_000, 1_300)) and timestamps[0] == BASE_TIMESTAMP
    assert None in keys and None in values and ("null", None) in headers[1] and headers[0] == ()


@compiled
def test_log_append_time_gives_every_record_the_batchs_max_timestamp():
    plain = build(sample(50))
    data = with_body(plain, plain[HEADER_SIZE:], Compression.NONE, extra_attributes=0x08)
    mine, reference = compiled_and_reference(data)
    assert mine == reference and set(mine[1]) == {header_of(data).max_timestamp}


@compiled
def test_records_without_headers_and_a_filter():
    data = build([(BASE_TIMESTAMP + i, b"k", b"v" * i, []) for i in range(40)])
    arrays = record_arrays.batch_arrays(data, header_of(data))
    assert arrays.headers == [()] * 40 and arrays.keys.null_count == 0
    import pyarrow as pa

    kept = arrays.filter(pa.array([i % 4 == 0 for i in range(40)]))
    assert as_lists(kept)[0] == list(range(0, 40, 4)) and kept.values.to_pylist()[1] == b"v" * 4


@compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_cut_or_mutated_batch_decodes_or_fails_as_the_reference_does(data):
    batch = bytearray(compressed("none", sample(12)))
    header = header_of(bytes(batch))  # the header the batch was read by
    if data.draw(st.booleans()):
        batch = batch[: data.draw(st.integers(HEADER_SIZE, len(batch) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            batch[data.draw(st.integers(HEADER_SIZE, len(batch) - 1))] = data.draw(st.integers(0, 255))
    mine, reference = compiled_and_reference(bytes(batch), header)
    assert mine == reference


def test_tierproxy_no_extensions_turns_the_compiled_decoder_off():
    code = "from tierproxy.pipeline import record_arrays; print(record_arrays._compiled is None)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TIERPROXY_NO_EXTENSIONS": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
    reference = compressed("zstd")
    # The pure path alone gives the records too.
    assert as_lists(record_arrays._from_columns(reference))[0] == list(range(1_000, 1_300))


def test_built_where_a_compiler_is():
    """`pip install` (the Makefile's editable one too) builds the module when it can."""
    import shutil
    import sysconfig
    from pathlib import Path

    compiler = (sysconfig.get_config_var("CC") or "").split()
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if compiler and shutil.which(compiler[0]) and headers.exists() and not os.environ.get("TIERPROXY_NO_EXTENSIONS"):
        assert record_arrays._compiled is not None, "a C compiler is here but _record_arrays was not built"
