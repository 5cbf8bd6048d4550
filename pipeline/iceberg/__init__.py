"""Iceberg tables of the tier: one table per topic with `topic.<name>.iceberg.enable=true`,
built from the remote segments (never the broker), exactly once.

- `settings`: the catalog (`iceberg.catalog.<property>`, or the embedded SQL catalog) and
  each topic's table settings.
- `rows`: the table's schema and Kafka records as its Arrow rows; the seam for decoders.
- `table`: create or load a topic's table (partition spec day(timestamp) by default).
- `commit`: what the table says it holds (offsets in snapshot summaries), the commit of a
  pass's data files, and the clean-up of files a killed pass left.
- `append`: the pass: read the remote segments not yet in the table on Spark, write Parquet
  data files in the tasks, commit them on the driver.
- `maintain`: expire snapshots, compact small files, row retention.
"""
