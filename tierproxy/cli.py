"""The `tierproxy` command. Subcommands import their modules lazily so that, for
example, the proxy never pulls in pyspark."""

from __future__ import annotations

import argparse
import logging
import sys

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s {who}%(name)s: %(message)s"


def _version() -> str:
    from tierproxy.config.metrics import tierproxy_version

    return tierproxy_version()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierproxy",
        description="Tiered storage for any Kafka cluster, served by a Kafka-protocol proxy.",
        epilog=_security_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tierproxy {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_status(commands)
    _add_config(commands)
    _add_serve(commands)
    _add_tier(commands)
    _add_replica(commands)
    _add_iceberg(commands)
    _add_loadtest(commands)
    return parser


def _security_epilog() -> str:
    """The security keys of the .properties file, from their declarations."""
    from tierproxy.config import KEYS

    keys = [key for key in KEYS.values() if key.group == "security"]
    lines = ["Secured clusters: every command reaches the brokers as the --config file says, with",
             "Kafka's client keys:"]
    lines += [f"  {key.name:<40} {key.valid_values or key.type_name}" for key in keys]
    lines.append("Every key and its meaning: tierproxy config docs")
    return "\n".join(lines)


# What each extra of pyproject.toml brings (module: distribution), for the subcommands
# that need it: `pip install kafka-tierproxy` alone is the proxy.
EXTRAS: dict[str, dict[str, str]] = {
    "pipeline": {"pyspark": "pyspark", "pyarrow": "pyarrow", "pandas": "pandas", "pyiceberg": "pyiceberg"},
    "loadtest": {"confluent_kafka": "confluent-kafka"},
}


def missing_extra(extra: str) -> str | None:
    """A one-line error when a package of `extra` is not installed, else None."""
    from importlib.util import find_spec

    for module, distribution in EXTRAS[extra].items():
        if find_spec(module) is None:
            return f"{distribution} is not installed: pip install 'kafka-tierproxy[{extra}]'"
    return None


def _lazy(module: str, function: str = "run", extra: str | None = None):
    """A subcommand's entry point, imported only when that subcommand runs."""

    def run(args: argparse.Namespace) -> int:
        from importlib import import_module

        if extra is not None and (error := missing_extra(extra)):
            print(f"tierproxy {args.command}: {error}", file=sys.stderr)
            return 1
        return getattr(import_module(module), function)(args)

    return run


def _log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default, metavar="LEVEL",
                        help=f"log messages of this level and above to stderr: {', '.join(LOG_LEVELS)} "
                             f"(default {default})")


def log_format(args: argparse.Namespace) -> str:
    """A proxy worker's lines name the worker."""
    worker = getattr(args, "worker_of", None) is not None
    return LOG_FORMAT.format(who=f"worker-{args.worker_index} " if worker else "")


def configure_logging(args: argparse.Namespace) -> None:
    """One stderr handler, the root logger at `--log-level`."""
    logging.basicConfig(format=log_format(args), stream=sys.stderr)
    logging.getLogger().setLevel(args.log_level)


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the .properties file")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="set a key on top of the file (repeatable)")


def _add_status(commands) -> None:
    status = commands.add_parser("status", help="offsets of the tiered partitions and whether they are safe")
    _config_arguments(status)
    _log_level(status, "WARNING")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.add_argument("--verify", action="store_true",
                        help="check the CRC-32C of every remote object too (S3: the checksum recorded at upload; "
                             "otherwise the object is read back)")
    status.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for the remote log metadata to load")
    status.set_defaults(run=_lazy("tierproxy.status"))


def _add_config(commands) -> None:
    config = commands.add_parser("config", help="check a configuration file, or print its reference")
    actions = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a file and print the effective configuration")
    _config_arguments(check)
    check.add_argument("--connect", action="store_true",
                       help="also try the brokers (a Metadata round trip, with the configured security) "
                            "and the object store (the bucket or directory); one line each")
    _log_level(check, "WARNING")
    _log_level(actions.add_parser("docs", help="print docs/configuration.md, generated from the declarations"),
               "WARNING")
    _log_level(actions.add_parser("metrics", help="print docs/metrics.md, generated from the metric declarations"),
               "WARNING")
    config.set_defaults(run=_lazy("tierproxy.config_check"))


def _add_serve(commands) -> None:
    serve = commands.add_parser("serve", help="run the proxy until SIGTERM or SIGINT")
    _config_arguments(serve)
    _log_level(serve, "INFO")
    # How the supervisor of several workers (proxy.workers) starts each of them.
    serve.add_argument("--worker-of", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    serve.add_argument("--fetch-quota-file", help=argparse.SUPPRESS)
    serve.set_defaults(run=_lazy("tierproxy.serve"))


def _add_tier(commands) -> None:
    tier = commands.add_parser("tier", help="copy tiered partitions to remote storage (a Spark job), then retention")
    _config_arguments(tier)
    _log_level(tier, "INFO")
    tier.add_argument("--json", action="store_true",
                      help="the summary of each pass as one JSON document on stdout (one line per pass)")
    tier.add_argument("--every", nargs="?", const="", default=None, metavar="INTERVAL",
                      help="repeat every INTERVAL (30s, 5m, 1h, or ms); without a value "
                           "remote.log.manager.task.interval.ms")
    tier.add_argument("--dry-run", action="store_true",
                      help="print what one pass would copy, trim and expire, and change nothing")
    tier.set_defaults(run=_lazy("tierproxy.tier", extra="pipeline"))


def _add_replica(commands) -> None:
    replica = commands.add_parser("replica", help="read replica topics: another cluster's remote log, served here")
    actions = replica.add_subparsers(dest="replica_command", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create each topic.<name>.remote.log.read.replica=true topic on "
                                               "this cluster, empty, with the origin's partition count")
    _config_arguments(create)
    _log_level(create, "WARNING")
    replica.set_defaults(run=_lazy("tierproxy.replica"))


def _add_iceberg(commands) -> None:
    iceberg = commands.add_parser("iceberg", help="the Iceberg tables of tiered topics (topic.<name>.iceberg.enable)")
    actions = iceberg.add_subparsers(dest="iceberg_command", metavar="ACTION", required=True)
    backfill = actions.add_parser("backfill", help="append every remote segment not yet in each table (a Spark job)")
    maintain = actions.add_parser("maintain", help="expire old snapshots, compact small files, apply "
                                                   "topic.<name>.iceberg.retention.ms")
    from .iceberg import add_arguments

    for action in (backfill, maintain):
        _config_arguments(action)
        _log_level(action, "INFO")
        add_arguments(action)
    iceberg.set_defaults(run=_lazy("tierproxy.iceberg", extra="pipeline"))


def _add_loadtest(commands) -> None:
    loadtest = commands.add_parser("loadtest", help="replay a topic with N concurrent consumers: MB/s, "
                                                    "records/s, fetch latency, errors")
    from .loadtest import add_arguments  # confluent-kafka is imported only when the test runs

    add_arguments(loadtest)
    _log_level(loadtest, "WARNING")
    loadtest.set_defaults(run=_lazy("tierproxy.loadtest", extra="loadtest"))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    configure_logging(args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
