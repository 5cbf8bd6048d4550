"""`tierproxy iceberg backfill` and `tierproxy iceberg maintain`: the Iceberg tables of the
tier, outside a tiering pass.

`backfill` appends to each table (or `--topic`'s) the records of every remote segment not
yet in it, exactly as the table step of `tierproxy tier` does: the first run after enabling
a topic so fills its table with the whole remote history. `maintain` expires old snapshots,
compacts small data files and deletes rows past `topic.<name>.iceberg.retention.ms`. Both
hold the pipeline's lock: they never run beside a tiering pass.

Exit status: 0 when every table succeeded, 1 when one failed (or the pipeline is busy),
2 for a configuration error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from tierproxy.config import ConfigError, load


def add_arguments(iceberg: argparse.ArgumentParser) -> None:
    """The `iceberg` subcommand's actions (their --config and logging come from the caller)."""
    iceberg.add_argument("--topic", action="append", default=None, metavar="TOPIC",
                         help="only this topic's table (repeatable; default: every topic with "
                              "topic.<name>.iceberg.enable=true)")


def run(args: argparse.Namespace) -> int:
    logging.getLogger("py4j").setLevel(max(logging.WARNING, logging.getLogger().level))
    command = f"tierproxy iceberg {args.iceberg_command}"
    try:
        config = load(args.config, args.override)
        from tierproxy.pipeline.iceberg.settings import enabled_topics

        enabled = enabled_topics(config)
        topics = args.topic or enabled
        unknown = sorted(set(topics) - set(enabled))
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: no Iceberg table (set topic.<name>.iceberg.enable=true "
                              "for a tiered topic)")
        if not topics:
            raise ConfigError("no topic has topic.<name>.iceberg.enable=true")
    except ConfigError as e:
        print(f"{command}: {e}", file=sys.stderr)
        return 2

    from tierproxy.pipeline.tier import PipelineBusy, pipeline_lock

    try:
        with pipeline_lock(config):
            if args.iceberg_command == "maintain":
                from tierproxy.pipeline.iceberg.maintain import format_maintenance, maintain_tables

                reports = maintain_tables(config, topics)
                print("\n".join(format_maintenance(reports)), flush=True)
                return 1 if any(r.error for r in reports) else 0
            return _backfill(config, topics)
    except (PipelineBusy, OSError) as e:
        print(f"{command}: {e}", file=sys.stderr)
        return 1


def _backfill(config, topics: list[str]) -> int:
    from tierproxy.pipeline.iceberg.append import append_tables, format_reports, table_errors
    from tierproxy.pipeline.spark import spark_session

    spark = spark_session(config)
    try:
        reports = append_tables(config, spark, topics=topics)
    finally:
        spark.stop()
    errors = table_errors(reports)
    print("\n".join(format_reports(reports) + [f"ERROR {e}" for e in errors]), flush=True)
    return 1 if errors else 0
