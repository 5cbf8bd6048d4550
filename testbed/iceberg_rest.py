"""Apache Iceberg's own REST catalog server (Java, from Maven Central) on 127.0.0.1.

The server is ``org.apache.iceberg.rest.RESTCatalogServer`` from the ``iceberg-open-api`` test
fixtures, the one Iceberg's REST compatibility kit runs: a JDBC catalog behind Iceberg's REST
routes. ``testbed/iceberg-rest-pom.xml`` resolves its jars once into
``<cache>/iceberg-rest-<version>/libs``; ``testbed/java/IcebergRestCatalog.java`` runs it bound
to loopback (the server's own ``main`` listens on every interface). Its catalog keeps tables in
``catalog.db`` (SQLite) in the working directory, so a ``restart()`` keeps them.

The warehouse is a local folder (``file:``, Iceberg's HadoopFileIO) or, with ``s3=`` a running
``S3Server``, ``s3://<bucket>/<prefix>`` through Iceberg's S3FileIO with the server's endpoint
and credentials. ``client_properties()`` are what a client (pyiceberg's ``load_catalog``, or
tierproxy's ``iceberg.catalog.<property>`` keys) needs to reach it and the warehouse.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

from testbed import jars
from testbed.kafka import java_binary
from testbed.ports import LOOPBACK, free_port
from testbed.processes import log_tail, spawn, stop_pids
from testbed.s3 import S3Server

POM = Path(__file__).with_name("iceberg-rest-pom.xml")
LAUNCHER = Path(__file__).parent / "java" / "IcebergRestCatalog.java"
# Compiling the launcher and loading Iceberg, Hadoop and the AWS SDK takes a while on a busy machine.
START_TIMEOUT_S = 120.0


def _pom_iceberg_version() -> str:
    node = ET.parse(POM).getroot().find("m:properties/m:iceberg.version", {"m": "http://maven.apache.org/POM/4.0.0"})
    if node is None or not (node.text or "").strip():
        raise RuntimeError(f"{POM} has no <iceberg.version> property")
    return node.text.strip()


ICEBERG_VERSION = _pom_iceberg_version()


class IcebergRestStartError(RuntimeError):
    pass


def iceberg_rest_libs(*, cache: Path | None = None) -> Path:
    """The jars of the REST catalog server, resolved from Maven Central on first use."""
    return jars.pom_libs(POM, (cache or jars.cache_dir()) / f"iceberg-rest-{ICEBERG_VERSION}",
                         f"iceberg-open-api-{ICEBERG_VERSION}-test-fixtures.jar", {},
                         f"Apache Iceberg {ICEBERG_VERSION} REST catalog server")


class IcebergRestCatalog:
    """One REST catalog server process; a context manager (start, then close)."""

    def __init__(self, *, s3: S3Server | None = None, prefix: str = "iceberg", workdir: Path | None = None,
                 port: int | None = None) -> None:
        self.s3 = s3
        self.prefix = prefix.strip("/")
        self._port = port
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = self._given_workdir
        self._process: subprocess.Popen | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the Iceberg REST catalog is not started")
        return self._port

    @property
    def uri(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("the Iceberg REST catalog is not started")
        return self._workdir

    @property
    def log_path(self) -> Path:
        return self.workdir / "iceberg-rest.log"

    @property
    def warehouse(self) -> str:
        if self.s3 is not None:
            return f"s3://{self.s3.bucket}/{self.prefix}"
        return (self.workdir / "warehouse").as_uri()

    def _s3_properties(self) -> dict[str, str]:
        """Iceberg's S3FileIO properties (pyiceberg reads the same names) for the S3 server."""
        if self.s3 is None:
            return {}
        return {
            "s3.endpoint": self.s3.endpoint_url,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.s3.access_key,
            "s3.secret-access-key": self.s3.secret_key,
            "s3.region": self.s3.region,
            "client.region": self.s3.region,
        }

    def client_properties(self) -> dict[str, str]:
        """A client's catalog properties: ``load_catalog("name", **catalog.client_properties())``."""
        return {"type": "rest", "uri": self.uri, **self._s3_properties()}

    def _environment(self) -> dict[str, str]:
        # RESTCatalogServer reads its catalog's properties from CATALOG_* variables: "__" stands
        # for "-", "_" for "." (CATALOG_IO__IMPL -> io-impl).
        def variable(name: str) -> str:
            return "CATALOG_" + name.replace("-", "__").replace(".", "_").upper()

        properties = {
            "warehouse": self.warehouse,
            "uri": f"jdbc:sqlite:{self.workdir / 'catalog.db'}",
            **({"io-impl": "org.apache.iceberg.aws.s3.S3FileIO", **self._s3_properties()} if self.s3 else {}),
        }
        # The AWS SDK looks for a region before it reads the catalog's client.region.
        region = {"AWS_REGION": self.s3.region} if self.s3 is not None else {}
        return {"PATH": "/usr/bin:/bin", **region, **{variable(k): v for k, v in properties.items()}}

    def start(self) -> "IcebergRestCatalog":
        if self._process is not None:
            raise RuntimeError("the Iceberg REST catalog is already started")
        libs = iceberg_rest_libs()
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="tierproxy-iceberg-rest-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self.s3 is None:
            (self._workdir / "warehouse").mkdir(exist_ok=True)
        if self._port is None:
            self._port = free_port()
        atexit.register(self._stop_at_exit)
        command = [java_binary(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                   "-cp", jars.classpath(libs), str(LAUNCHER), str(self._port)]
        self._process = spawn(command, self.log_path, env=self._environment(), cwd=self._workdir)
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def answers(self) -> bool:
        """True when the catalog answers its configuration route."""
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2.0) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _wait_until_serving(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self._process.poll() is not None:
                raise IcebergRestStartError(f"the Iceberg REST catalog exited with {self._process.returncode}:\n"
                                            f"{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise IcebergRestStartError(f"the Iceberg REST catalog did not answer on {self.uri} within "
                                            f"{START_TIMEOUT_S:.0f} s:\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop by pid; the port and the catalog file stay for ``restart()``."""
        atexit.unregister(self._stop_at_exit)
        process, self._process = self._process, None
        if process is not None:
            try:
                stop_pids([process.pid], timeout=timeout)
            finally:
                process.poll()

    def restart(self) -> "IcebergRestCatalog":
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the working directory (if it was a temporary one)."""
        self.stop()
        if self._given_workdir is None and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _stop_at_exit(self) -> None:
        try:
            self.stop(timeout=3.0)
        except Exception:  # noqa: BLE001 - interpreter is exiting
            pass

    def __enter__(self) -> "IcebergRestCatalog":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
