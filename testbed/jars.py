"""Apache Kafka jars from Maven Central, resolved once into a cache directory.

``testbed/pom.xml`` is the single source of truth for the Kafka version and
the jar set. ``<cache>/kafka-<version>/libs`` holds the jars, where ``<cache>``
is ``$TIERPROXY_CACHE`` or ``~/.cache/tierproxy``. A ``.pom-sha256`` file in
that directory records which pom resolved it, so editing the pom (a new
dependency, say) re-resolves once; otherwise Maven is never called.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping, Sequence

POM = Path(__file__).with_name("pom.xml")
_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_STAMP = ".pom-sha256"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAVEN_TIMEOUT_S = 900


def pom_property(pom: Path, name: str) -> str:
    """The value of ``<properties><name>`` in ``pom`` (the versions the testbed pins)."""
    node = ET.parse(pom).getroot().find(f"m:properties/m:{name}", _MAVEN_NS)
    text = (node.text or "").strip() if node is not None else ""
    if not text:
        raise RuntimeError(f"{pom} has no <{name}> property")
    return text


KAFKA_VERSION = pom_property(POM, "kafka.version")


class MavenError(RuntimeError):
    """The Kafka jars could not be resolved."""


def cache_dir() -> Path:
    return Path(os.environ.get("TIERPROXY_CACHE") or Path.home() / ".cache" / "tierproxy")


def _pom_digest(pom: Path = POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _is_complete(libs: Path, marker: str, pom: Path = POM) -> bool:
    stamp = libs / _STAMP
    return (
        (libs / marker).is_file()
        and stamp.is_file()
        and stamp.read_text().strip() == _pom_digest(pom)
    )


def kafka_libs(
    version: str = KAFKA_VERSION,
    *,
    cache: Path | None = None,
    maven_args: Sequence[str] = (),
) -> Path:
    """The directory of jars that runs Kafka ``version``, resolving it if needed.

    Maven writes into a temporary directory beside the target, renamed into
    place only when complete, so an interrupted download is never used.
    ``maven_args`` go to ``mvn`` as given (``-o``, ``-s settings.xml`` ...).
    """
    return pom_libs(POM, (cache or cache_dir()) / f"kafka-{version}", f"kafka_2.13-{version}.jar",
                    {"kafka.version": version}, f"Apache Kafka {version}", maven_args=maven_args)


def pom_libs(pom: Path, base: Path, marker: str, properties: Mapping[str, str], what: str, *,
             maven_args: Sequence[str] = ()) -> Path:
    """``<base>/libs``: the dependencies of ``pom`` (``-D`` ``properties``), resolved once; complete
    when ``marker`` (a jar's name) is there and the stamp names this pom. ``what`` names the jars
    in errors."""
    libs = base / "libs"
    if _is_complete(libs, marker, pom):
        return libs
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".libs-", dir=base))
    try:
        _copy_dependencies(pom, properties, staging, maven_args, what)
        (staging / _STAMP).write_text(_pom_digest(pom) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the jars are shared
        if libs.exists():
            # A stale set (older pom). Move it aside first: rename cannot replace a
            # non-empty directory.
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=base))
            libs.rename(stale / "libs")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            staging.rename(libs)
        except OSError:
            if not _is_complete(libs, marker, pom):
                raise
            # Another process resolved the same jars first; use theirs.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs


def _copy_dependencies(pom: Path, properties: Mapping[str, str], out: Path, maven_args: Sequence[str],
                       what: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(f"mvn is not installed; it is needed once to fetch the {what} jars")
    cmd = [
        mvn, "-q", "-B", "-f", str(pom), *(f"-D{name}={value}" for name, value in properties.items()),
        *maven_args,
        "dependency:copy-dependencies", f"-DoutputDirectory={out}",
    ]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=MAVEN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise MavenError(
            f"Maven Central could not be reached: mvn did not finish within "
            f"{MAVEN_TIMEOUT_S} s resolving {what}"
        ) from exc
    if done.returncode == 0:
        return
    output = [line for line in _ANSI.sub("", done.stdout + done.stderr).splitlines()
              if line.strip() not in ("", "[ERROR]")]
    tail = "\n".join(output[-15:])
    if any("could not be found in" in line or "was not found in" in line for line in output):
        raise MavenError(
            f"{what} is not (completely) on Maven Central "
            f"(mvn exit {done.returncode}). Last mvn output:\n{tail}"
        )
    raise MavenError(
        f"Maven Central could not be reached to resolve the {what} jars "
        f"(mvn exit {done.returncode}); nothing is started without them. "
        f"Last mvn output:\n{tail}"
    )


def maven_jar(group: str, artifact: str, version: str, classifier: str = "", *, cache: Path | None = None,
              maven_args: Sequence[str] = ()) -> Path:
    """One jar from Maven Central (``group:artifact:version[:classifier]``), fetched once into
    ``<cache>/<artifact>-<version>``, by ``mvn dependency:copy`` as the Kafka jars are."""
    name = f"{artifact}-{version}{'-' + classifier if classifier else ''}.jar"
    target = (cache or cache_dir()) / f"{artifact}-{version}" / name
    if target.is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(f"mvn is not installed; it is needed once to fetch {name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".jar-", dir=target.parent))
    coordinates = f"{group}:{artifact}:{version}:jar" + (f":{classifier}" if classifier else "")
    try:
        done = subprocess.run([mvn, "-q", "-B", *maven_args, "dependency:copy", f"-Dartifact={coordinates}",
                               f"-DoutputDirectory={staging}"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=MAVEN_TIMEOUT_S, cwd=staging)
        if done.returncode != 0 or not (staging / name).is_file():
            tail = "\n".join(_ANSI.sub("", done.stdout + done.stderr).splitlines()[-15:])
            raise MavenError(f"{coordinates} could not be resolved from Maven Central (mvn exit "
                             f"{done.returncode}). Last mvn output:\n{tail}")
        (staging / name).rename(target)
    except subprocess.TimeoutExpired as exc:
        raise MavenError(f"mvn did not resolve {coordinates} within {MAVEN_TIMEOUT_S} s") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def classpath(libs: Path) -> str:
    # The JVM expands "dir/*" itself; keep it unexpanded.
    return f"{libs}/*"
