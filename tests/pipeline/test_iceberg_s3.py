"""An Iceberg table of a topic tiered to S3 (moto's server): the embedded catalog puts the
warehouse in the bucket under the store's key prefix, Apache Iceberg's REST catalog server
keeps it in its own warehouse in the bucket, and the rows read back exactly."""

from __future__ import annotations

import asyncio

import pytest

from tierproxy.pipeline.iceberg.commit import files_of_write
from tierproxy.pipeline.tier import run_pass
from tests.helpers.iceberg import committed, table_of, table_rows
from tests.helpers.pipeline import BROKER_SEGMENT_BYTES, assert_clean, tier_config
from tests.helpers.produce import produce_mixed, until_older

pytestmark = [pytest.mark.timeout(600), pytest.mark.s3]


def test_a_table_of_a_topic_tiered_to_s3_lives_in_the_bucket(spark, kafka_cluster, topic, s3_server, tmp_path):
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    records = asyncio.run(produce_mixed(kafka_cluster.bootstrap_servers, name, 2, per_codec=60, per_transaction=20))
    asyncio.run(until_older(records, 2000))
    prefix = f"tier-{name}"
    config = tier_config(tmp_path, kafka_cluster.bootstrap_servers, name, s3=s3_server, key_prefix=prefix,
                         topic_settings={"segment.ms": 2000, "iceberg.enable": "true"})
    report = run_pass(config, spark)
    assert_clean(report)
    table = table_of(config, name)
    assert table.location().startswith(f"s3://{s3_server.bucket}/{prefix}/iceberg/")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                  Prefix=f"{prefix}/iceberg/")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    assert table_rows(config, name) == committed(records)
    # The listing a pass cleans up with works on the bucket too.
    write_id = table.current_snapshot().summary.additional_properties["tierproxy.write-id"]
    assert len(files_of_write(table, write_id)) == len(list(table.scan().plan_files()))


def test_a_pass_through_a_rest_catalog_writes_its_table_to_the_catalogs_bucket(
        spark, kafka_cluster, topic, s3_server, iceberg_rest_catalog_s3, tmp_path):
    name = topic(partitions=2, config={"internal.segment.bytes": BROKER_SEGMENT_BYTES})
    records = asyncio.run(produce_mixed(kafka_cluster.bootstrap_servers, name, 2, per_codec=40, per_transaction=20))
    asyncio.run(until_older(records, 2000))
    config = tier_config(tmp_path, kafka_cluster.bootstrap_servers, name, s3=s3_server, key_prefix=f"tier-{name}",
                         topic_settings={"segment.ms": 2000, "iceberg.enable": "true"})
    config = config.with_overrides({f"iceberg.catalog.{key}": value
                                    for key, value in iceberg_rest_catalog_s3.client_properties().items()})
    assert_clean(run_pass(config, spark))
    table = table_of(config, name)
    # The catalog's warehouse, not the tier's prefix: the catalog decides where tables live.
    assert table.location().startswith(iceberg_rest_catalog_s3.warehouse + "/")
    data_files = [task.file.file_path for task in table.scan().plan_files()]
    assert data_files and all(path.startswith(iceberg_rest_catalog_s3.warehouse + "/") for path in data_files)
    assert table_rows(config, name) == committed(records)
    snapshots = len(table.snapshots())
    # A second pass finds every offset in the table (the catalog's snapshot summary) and adds nothing.
    assert_clean(run_pass(config, spark))
    table.refresh()
    assert len(table.snapshots()) == snapshots
    assert table_rows(config, name) == committed(records)
