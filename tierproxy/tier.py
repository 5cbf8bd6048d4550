"""`tierproxy tier`: one tiering pass, or `--every INTERVAL` until SIGINT/SIGTERM.

Exit status: 0 when the (last) pass succeeded, 1 when it failed or reported errors,
2 for a configuration error.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys

from config import ConfigError, load

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$")


def parse_interval_ms(text: str) -> int:
    """`30s`, `5m`, `1h`, `250ms`; a bare number is milliseconds, as Kafka's *.ms keys."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) <= 0:
        raise ConfigError(f"--every {text!r}: must be a positive duration such as 30s, 5m, 1h or 500ms")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        config = load(args.config, args.override)
        interval_ms = None
        if args.every is not None:
            interval_ms = parse_interval_ms(args.every) if args.every else config["remote.log.manager.task.interval.ms"]
    except ConfigError as e:
        print(f"tierproxy tier: {e}", file=sys.stderr)
        return 2

    from pipeline.spark import spark_session
    from pipeline.tier import PipelineBusy, run_every, run_pass

    spark = spark_session(config)
    try:
        if interval_ms is not None:
            return 1 if run_every(config, spark, interval_ms) else 0
        try:
            return 0 if run_pass(config, spark).ok else 1
        except PipelineBusy as e:
            print(f"tierproxy tier: {e}", file=sys.stderr)
            return 1
    finally:
        spark.stop()
