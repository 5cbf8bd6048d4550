"""Kafka jars: the version comes from the pom, the cache is used, Maven failures are clear."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from testbed import jars


def test_kafka_version_comes_from_the_pom() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom_version = ET.parse(jars.POM).getroot().findtext("m:properties/m:kafka.version",
                                                         namespaces=ns)
    assert jars.KAFKA_VERSION == pom_version


def test_cached_jars_are_used_without_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError("Maven must not run when the jars are cached")

    monkeypatch.setattr(jars, "_copy_dependencies", no_maven)
    libs = jars.kafka_libs()
    assert (libs / f"kafka_2.13-{jars.KAFKA_VERSION}.jar").is_file()
    assert (libs / f"kafka-tools-{jars.KAFKA_VERSION}.jar").is_file()
    # The log4j2 binding needs slf4j-api 2.x; 1.7 would silence the broker's log.
    assert [p.name for p in libs.glob("slf4j-api-*.jar")] == ["slf4j-api-2.0.17.jar"]


def test_unreachable_maven_central_is_reported(tmp_path: Path) -> None:
    # Every repository mirrored to a loopback port nothing listens on, and an empty
    # local repository: Maven has to go to the network and cannot.
    settings = tmp_path / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>unreachable</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>")
    cache = tmp_path / "cache"
    with pytest.raises(jars.MavenError) as caught:
        jars.kafka_libs(cache=cache, maven_args=[
            "-s", str(settings), f"-Dmaven.repo.local={tmp_path / 'm2'}"])
    message = str(caught.value)
    assert message.startswith("Maven Central could not be reached")
    assert "[ERROR]" in message and "127.0.0.1:9" in message  # mvn's own last lines
    # Nothing half-resolved is left where a later run would use it.
    assert not (cache / f"kafka-{jars.KAFKA_VERSION}" / "libs").exists()
    assert list((cache / f"kafka-{jars.KAFKA_VERSION}").iterdir()) == []
