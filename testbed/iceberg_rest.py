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

import urllib.error
import urllib.request
from pathlib import Path

from testbed import jars
from testbed.kafka import java_binary
from testbed.ports import LOOPBACK
from testbed.processes import ServerProcess
from testbed.s3 import S3Server

POM = Path(__file__).with_name("iceberg-rest-pom.xml")
LAUNCHER = Path(__file__).parent / "java" / "IcebergRestCatalog.java"
# Compiling the launcher and loading Iceberg, Hadoop and the AWS SDK takes a while on a busy machine.
START_TIMEOUT_S = 120.0
ICEBERG_VERSION = jars.pom_property(POM, "iceberg.version")


class IcebergRestStartError(RuntimeError):
    pass


def iceberg_rest_libs(*, cache: Path | None = None) -> Path:
    """The jars of the REST catalog server, resolved from Maven Central on first use."""
    return jars.pom_libs(POM, (cache or jars.cache_dir()) / f"iceberg-rest-{ICEBERG_VERSION}",
                         f"iceberg-open-api-{ICEBERG_VERSION}-test-fixtures.jar", {},
                         f"Apache Iceberg {ICEBERG_VERSION} REST catalog server")


class IcebergRestCatalog(ServerProcess):
    """One REST catalog server process; a context manager (start, then close)."""

    name = "iceberg-rest"
    start_timeout_s = START_TIMEOUT_S
    start_error = IcebergRestStartError

    def __init__(self, *, s3: S3Server | None = None, prefix: str = "iceberg", workdir: Path | None = None,
                 port: int | None = None) -> None:
        super().__init__(port=port, workdir=workdir)
        self.s3 = s3
        self.prefix = prefix.strip("/")

    @property
    def uri(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

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

    def _command(self, workdir: Path, port: int) -> list[str]:
        if self.s3 is None:
            (workdir / "warehouse").mkdir(exist_ok=True)
        return [java_binary(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                "-cp", jars.classpath(iceberg_rest_libs()), str(LAUNCHER), str(port)]

    def answers(self) -> bool:
        """True when the catalog answers its configuration route."""
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2.0) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False
