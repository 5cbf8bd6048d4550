"""`tierproxy tier`: one tiering pass, or `--every INTERVAL` until SIGINT/SIGTERM.

With `--every`, the pipeline's metrics are served on `pipeline.metrics.port` (on
`proxy.listener.host`; 0 turns them off). The summary of each pass goes to stdout (a
table, or one JSON document per line with `--json`); progress and log lines to stderr.
A failure of the cluster, the object store or the metadata is one line in the summary
and the log, never a traceback.

With `--dry-run`, one pass's summary says what it would copy, trim and expire, and
nothing is changed (`pipeline.dry_run`).

Exit status: 0 when the (last) pass succeeded, 1 when it failed or reported errors,
2 for a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys

from tierproxy.client.cluster import check_login
from tierproxy.client.connection import AuthenticationError
from tierproxy.config import (
    PIPELINE_METRICS_PORT,
    PROXY_LISTENER_HOST,
    REMOTE_LOG_MANAGER_TASK_INTERVAL_MS,
    ConfigError,
    load,
    moved_key_warnings,
)

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$")


def parse_interval_ms(text: str) -> int:
    """`30s`, `5m`, `1h`, `250ms`; a bare number is milliseconds, as Kafka's *.ms keys."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) <= 0:
        raise ConfigError(f"--every {text!r}: must be a positive duration such as 30s, 5m, 1h or 500ms")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def run(args: argparse.Namespace) -> int:
    logging.getLogger("py4j").setLevel(max(logging.WARNING, logging.getLogger().level))
    interval_ms = None
    try:
        config = load(args.config, args.override)
        for warning in moved_key_warnings(config):
            logging.getLogger("tierproxy").warning("%s", warning)
        if args.every is not None and args.dry_run:
            raise ConfigError("--dry-run shows one pass: it does not go with --every")
        if args.every is not None:
            interval_ms = parse_interval_ms(args.every) if args.every else config[REMOTE_LOG_MANAGER_TASK_INTERVAL_MS]
        # Certificate files, credentials and the login itself are checked before Spark starts.
        asyncio.run(check_login(config))
    except ConfigError as e:
        print(f"tierproxy tier: {e}", file=sys.stderr)
        return 2
    except ConnectionError as e:
        # Refused credentials stop every mode; with --every, a broker that is down now
        # is retried by the loop.
        if interval_ms is None or isinstance(e, AuthenticationError):
            print(f"tierproxy tier: {e}", file=sys.stderr)
            return 1
        logging.getLogger("tierproxy").warning("no broker answered yet: %s", e)

    from tierproxy.pipeline.spark import spark_session
    from tierproxy.pipeline.tier import PipelineBusy, run_every, run_pass

    metrics = http = None
    if interval_ms is not None and config[PIPELINE_METRICS_PORT]:
        from tierproxy.config.metrics import metrics_endpoint
        from tierproxy.pipeline.metrics import PipelineMetrics

        metrics = PipelineMetrics()
        try:
            http = metrics_endpoint(config[PROXY_LISTENER_HOST], config[PIPELINE_METRICS_PORT], metrics.registry)
        except OSError as e:
            print(f"tierproxy tier: {e} (pipeline.metrics.port; 0 turns the endpoint off)", file=sys.stderr)
            return 2
    spark = spark_session(config)
    try:
        if interval_ms is not None:
            return 1 if run_every(config, spark, interval_ms, as_json=args.json, metrics=metrics) else 0
        try:
            return 0 if run_pass(config, spark, as_json=args.json, dry_run=args.dry_run).ok else 1
        except (PipelineBusy, OSError) as e:
            # Another pipeline holds the lock, or the lock file cannot be made: one line.
            print(f"tierproxy tier: {e}", file=sys.stderr)
            return 1
    finally:
        spark.stop()
        if http is not None:
            http.shutdown()
            http.server_close()
