"""The `tierproxy` command. Subcommands import their modules lazily so that, for
example, the proxy never pulls in pyspark."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    try:
        return version("tierproxy")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierproxy",
        description="Tiered storage for any Kafka cluster, served by a Kafka-protocol proxy.",
    )
    parser.add_argument("--version", action="version", version=f"tierproxy {_version()}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
