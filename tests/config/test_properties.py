"""Reading a .properties file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierproxy.config import ConfigError
from tierproxy.config.properties import read_properties


def test_keys_and_values_as_written(tmp_path: Path):
    path = tmp_path / "tierproxy.properties"
    path.write_text("# a comment\nbootstrap.servers = broker:9092\nsasl.jaas.config=a \\\n  b;\nname=caf\\u00e9\n",
                    encoding="utf-8")
    assert read_properties(path) == {"bootstrap.servers": "broker:9092", "sasl.jaas.config": "a b;", "name": "café"}
    assert read_properties(str(path)) == read_properties(path)


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path):
    missing = tmp_path / "missing.properties"
    with pytest.raises(ConfigError, match=f"cannot read configuration file {missing}: No such file or directory"):
        read_properties(missing)
    with pytest.raises(ConfigError, match=f"cannot read configuration file {tmp_path}"):
        read_properties(tmp_path)  # a directory
    latin1 = tmp_path / "latin1.properties"
    latin1.write_bytes(b"name=caf\xe9\n")
    with pytest.raises(ConfigError, match=f"cannot read configuration file {latin1}"):
        read_properties(latin1)
    bad_escape = tmp_path / "escape.properties"
    bad_escape.write_text("name=\\uZZZZ\n")
    with pytest.raises(ConfigError, match=f"cannot read configuration file {bad_escape}"):
        read_properties(bad_escape)
