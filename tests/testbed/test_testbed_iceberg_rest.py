"""Apache Iceberg's REST catalog server from testbed/: pyiceberg's RestCatalog creates a
namespace and a table through it, appends Arrow data and reads it back, with the warehouse in a
local folder and in the S3 bucket; the server listens on loopback only and keeps its tables
across a restart."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError

from testbed.iceberg_rest import IcebergRestCatalog
from testbed.ports import LISTEN, tcp_sockets
from testbed.processes import is_alive
from testbed.s3 import S3Server

ROWS = pa.table({
    "offset": pa.array([0, 1, 2], pa.int64()),
    "key": pa.array([b"k0", None, b"k2"], pa.binary()),
    "value": pa.array(["a", "b", None], pa.string()),
})


def _round_trip(catalog: IcebergRestCatalog) -> str:
    """Create a namespace and a table, append ROWS, read them back; the data file's location."""
    client = load_catalog("testbed", **catalog.client_properties())
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    client.create_namespace(namespace)
    table = client.create_table(f"{namespace}.records", schema=ROWS.schema)
    table.append(ROWS)
    # A second client sees the commit: the catalog, not the first client, holds the table.
    reread = load_catalog("other", **catalog.client_properties()).load_table(f"{namespace}.records")
    assert reread.scan().to_arrow().sort_by("offset").equals(ROWS)
    assert [ns for ns in client.list_namespaces() if ns == (namespace,)] == [(namespace,)]
    [task] = list(reread.scan().plan_files())
    return task.file.file_path


def test_local_warehouse_round_trip(iceberg_rest_catalog: IcebergRestCatalog) -> None:
    data_file = _round_trip(iceberg_rest_catalog)
    assert data_file.startswith(iceberg_rest_catalog.warehouse + "/")
    assert Path(data_file.removeprefix("file:")).is_file()


def test_s3_warehouse_round_trip(iceberg_rest_catalog_s3: IcebergRestCatalog, s3_server: S3Server) -> None:
    data_file = _round_trip(iceberg_rest_catalog_s3)
    prefix = f"s3://{s3_server.bucket}/"
    assert data_file.startswith(iceberg_rest_catalog_s3.warehouse + "/")
    # The server's S3FileIO wrote the table's metadata into the bucket too.
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=s3_server.bucket, Prefix="iceberg-rest/")["Contents"]]
    assert data_file.removeprefix(prefix) in keys
    assert any(key.endswith(".metadata.json") for key in keys)


def test_listens_on_loopback_only(iceberg_rest_catalog: IcebergRestCatalog) -> None:
    listening = [tcp.local_address for tcp in tcp_sockets()
                 if tcp.state == LISTEN and tcp.local_port == iceberg_rest_catalog.port]
    # 127.0.0.1, as /proc writes it: 0100007F, or IPv4-mapped in tcp6.
    assert listening and all(a.endswith("0100007F") for a in listening), listening


def test_tables_survive_a_restart(iceberg_rest_catalog: IcebergRestCatalog) -> None:
    client = load_catalog("testbed", **iceberg_rest_catalog.client_properties())
    namespace = f"kept_{uuid.uuid4().hex[:8]}"
    client.create_namespace(namespace)
    client.create_table(f"{namespace}.t", schema=ROWS.schema).append(ROWS)
    pid, port = iceberg_rest_catalog.pid, iceberg_rest_catalog.port
    iceberg_rest_catalog.restart()
    assert iceberg_rest_catalog.pid != pid and iceberg_rest_catalog.port == port
    client = load_catalog("testbed", **iceberg_rest_catalog.client_properties())
    assert client.load_table(f"{namespace}.t").scan().to_arrow().num_rows == len(ROWS)
    with pytest.raises(NoSuchTableError):
        client.load_table(f"{namespace}.missing")


def test_close_stops_the_server_and_removes_its_files() -> None:
    with IcebergRestCatalog() as catalog:
        pid, workdir = catalog.pid, catalog.workdir
        assert pid is not None and is_alive(pid) and (workdir / "catalog.db").is_file()
    assert catalog.pid is None and not is_alive(pid) and not workdir.exists()
