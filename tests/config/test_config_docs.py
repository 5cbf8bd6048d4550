"""docs/configuration.md is what the declarations generate now, and `tierproxy config
check` reports the effective configuration or names what is wrong."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierproxy.cli import main
from tierproxy.config import KEYS, TOPIC_KEYS
from tierproxy.config_check import REGENERATE, generate_docs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "configuration.md"


def test_committed_reference_is_up_to_date():
    committed = DOCS.read_text() if DOCS.exists() else ""
    assert committed == generate_docs(), f"docs/configuration.md is out of date; regenerate it with: {REGENERATE}"


def test_reference_has_every_key_with_type_default_and_valid_values():
    docs = generate_docs()
    rows = {line.split("|")[1].strip().strip("`"): line for line in docs.splitlines() if line.startswith("| `")}
    assert set(KEYS) | set(TOPIC_KEYS) <= set(rows)
    backend = rows["remote.log.storage.backend"].split("|")
    assert [cell.strip() for cell in backend[2:5]] == ["string", "`local`", "local, s3"]
    assert "*(required)*" in rows["bootstrap.servers"]
    assert "`1073741824` (1 GiB)" in rows["remote.log.index.file.cache.total.size.bytes"]
    assert "remote.log.index.file.cache.total.size.mb" in rows["remote.log.index.file.cache.total.size.bytes"]
    assert ">= 5242880" in rows["remote.log.storage.s3.multipart.part.bytes"]
    # Topic-level keys in their own table, with the key each falls back to.
    assert "`log.local.retention.ms`" in rows["local.retention.ms"]
    for group in {key.group for key in KEYS.values()}:
        assert f"## {group[0].upper()}{group[1:]}\n" in docs


def test_both_commands_print_the_reference():
    for argv in (["-m", "tierproxy.cli", "config", "docs"], ["-m", "tierproxy.config_check", "--docs"]):
        result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout == generate_docs()


def _rows(output: str) -> dict[str, tuple[str, str]]:
    """KEY -> (VALUE, SOURCE) of `config check`'s table."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("KEY "))
    value_at, source_at = lines[header].index("VALUE"), lines[header].index("SOURCE")
    return {
        line[:value_at].strip(): (line[value_at:source_at].strip(), line[source_at:].strip())
        for line in lines[header + 1:]
    }


def test_check_prints_effective_values_with_their_source(tmp_path, capsys):
    properties = tmp_path / "tierproxy.properties"
    properties.write_text(
        "bootstrap.servers=kafka:9092\n"
        "remote.log.storage.backend=s3\n"
        "remote.log.storage.s3.bucket=tierproxy\n"
        "remote.log.storage.s3.secret.access.key=very-secret\n"
        "remote.log.index.file.cache.total.size.mb=64\n"
        "remote.fetch.max.wait.ms=500\n"
        "topic.orders.remote.storage.enable=true\n"
        "topic.orders.retention.ms=1000\n"
    )
    code = main(["config", "check", "--config", str(properties), "--override", "metrics.port=9500"])
    out = capsys.readouterr().out
    assert code == 0
    assert "very-secret" not in out
    assert out.splitlines()[0] == f"# {properties}: valid; tiered topics: orders"
    rows = _rows(out)
    assert set(KEYS) <= set(rows)
    assert rows["remote.log.storage.s3.secret.access.key"] == ("[hidden]", "file")
    assert rows["bootstrap.servers"] == ("kafka:9092", "file")
    assert rows["metrics.port"] == ("9500", "override")
    assert rows["remote.log.index.file.cache.total.size.bytes"] == (
        str(64 * 1024 * 1024), "file (as remote.log.index.file.cache.total.size.mb)")
    # Given in the file although equal to the default: still the file's.
    assert rows["remote.fetch.max.wait.ms"] == ("500", "file")
    assert rows["remote.log.reader.threads"] == ("10", "default")
    assert rows["remote.log.storage.key.prefix"] == ('""', "default")
    assert rows["topic.orders.retention.ms"] == ("1000", "file")
    assert rows["topic.orders.segment.bytes"] == (str(KEYS["log.segment.bytes"].default), "from log.segment.bytes")
    # Kafka's -2: local retention follows the topic's own retention.
    assert rows["topic.orders.local.retention.ms"] == ("1000", "from log.local.retention.ms=-2, the topic's retention.ms")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bootstrap.servers=k:9092\nremote.fetch.max.wait.msec=5\n",
         "remote.fetch.max.wait.msec: unknown configuration key (did you mean remote.fetch.max.wait.ms?)"),
        ("bootstrap.servers=k:9092\nremote.log.storage.backend=gcs\n",
         "remote.log.storage.backend='gcs': must be one of local, s3"),
        ("metrics.port=9404\n", "bootstrap.servers is required"),
        ("bootstrap.servers=k:9092\nremote.log.storage.backend=s3\n",
         "remote.log.storage.s3.bucket is required when remote.log.storage.backend=s3"),
        ("bootstrap.servers=127.0.0.1\n", "bootstrap.servers='127.0.0.1': '127.0.0.1' is not host:port: no port"),
        ("bootstrap.servers=k:9092\ntopic.orders.local.retension.ms=1\n",
         "topic.orders.local.retension.ms: unknown configuration key (did you mean topic.orders.local.retention.ms?)"),
    ],
)
def test_check_exits_2_naming_the_key(tmp_path, capsys, text, message):
    properties = tmp_path / "bad.properties"
    properties.write_text(text)
    assert main(["config", "check", "--config", str(properties)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_check_exits_2_on_a_missing_file_and_a_bad_override(tmp_path, capsys):
    assert main(["config", "check", "--config", str(tmp_path / "missing.properties")]) == 2
    assert "cannot read configuration file" in capsys.readouterr().err
    good = tmp_path / "good.properties"
    good.write_text("bootstrap.servers=k:9092\n")
    assert main(["config", "check", "--config", str(good), "--override", "metrics.port=http"]) == 2
    assert "metrics.port='http': must be an integer" in capsys.readouterr().err


def test_the_deployed_configuration_is_valid(capsys):
    assert main(["config", "check", "--config", str(ROOT / "deploy" / "tierproxy.properties")]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["remote.log.storage.s3.secret.access.key"] == ("[hidden]", "file")
    assert rows["topic.orders.remote.storage.enable"] == ("true", "file")


def test_check_shows_encryption_key_ids_and_files_and_reads_but_never_shows_them(tmp_path, capsys):
    material = base64.b64encode(os.urandom(32)).decode()
    (tmp_path / "k1.key").write_text(material + "\n")
    properties = tmp_path / "tierproxy.properties"
    properties.write_text(f"bootstrap.servers=k:9092\nremote.log.storage.encryption.keys=k1:{tmp_path}/k1.key\n"
                          "remote.log.storage.encryption.active.key=k1\n")
    assert main(["config", "check", "--config", str(properties)]) == 0
    out = capsys.readouterr().out
    assert material not in out
    assert _rows(out)["remote.log.storage.encryption.keys"] == (f"k1:{tmp_path}/k1.key", "file")
    (tmp_path / "k1.key").write_text(material[:20] + "\n")  # not 32 bytes any more
    assert main(["config", "check", "--config", str(properties)]) == 2
    captured = capsys.readouterr()
    assert f"key 'k1' (file {tmp_path}/k1.key): holds 15 bytes, a key is 32" in captured.err
    assert material[:20] not in captured.err and captured.out == ""


def test_check_says_where_the_pipelines_metrics_port_went(tmp_path, capsys):
    """A file from before pipeline.metrics.port sets metrics.port for `tier --every` too: valid
    (it is serve's port), with a warning naming the pipeline's own key."""
    properties = tmp_path / "tierproxy.properties"
    properties.write_text("bootstrap.servers=k:9092\nmetrics.port=9500\n")
    assert main(["config", "check", "--config", str(properties)]) == 0
    err = capsys.readouterr().err
    assert "warning: metrics.port=9500 is the metrics port of `tierproxy serve` only" in err
    assert "serves its metrics on pipeline.metrics.port (9405, its default)" in err
    properties.write_text("bootstrap.servers=k:9092\nmetrics.port=9500\npipeline.metrics.port=9501\n")
    assert main(["config", "check", "--config", str(properties)]) == 0
    assert "warning" not in capsys.readouterr().err
