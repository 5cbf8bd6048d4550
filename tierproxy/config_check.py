"""`tierproxy config check` and `tierproxy config docs`.

`check` validates a configuration file (with `--override key=value` on top) and prints
every key's effective value and where it came from: the file, an override, or the
default. Secrets are masked; encryption keys show as their ids and files, and their
files are read to check them, never shown. A bad file exits 2 with the message naming
the key. With `--connect` it then tries the brokers and the object store, one line each,
and exits 1 when either cannot be reached.

`docs` writes docs/configuration.md from the declarations in config/__init__.py, so the
reference can never drift from what `parse` accepts:

    tierproxy config docs > docs/configuration.md
    python -m tierproxy.config_check --docs > docs/configuration.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from tierproxy.client.security import security
from tierproxy.config import (
    TOPIC_DEFAULTS as TOPIC_FALLBACKS,  # topic-level key -> the default key it falls back to
    GIB,
    KEYS,
    MIB,
    PREFIX_KEYS,
    REQUIRED,
    TOPIC_KEYS,
    Config,
    ConfigError,
    ConfigKey,
    Range,
    effective,
    load,
    moved_key_warnings,
    parse_overrides,
)
from tierproxy.config.properties import read_properties
from tierproxy.config.tables import text_table
from tierproxy.storage.encryption import KeyRing

EXIT_OK = 0
EXIT_UNREACHABLE = 1  # valid, but --connect could not reach the brokers or the store
EXIT_INVALID = 2
REGENERATE = "tierproxy config docs > docs/configuration.md"


def show(value: Any) -> str:
    """A value as it would be written in the .properties file."""
    if value is REQUIRED:
        return "(required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# --------------------------------------------------------------------------- check


def _given_keys(path: str | None) -> set[str]:
    """Names set in the file itself, to tell file values from defaults that happen to match."""
    if path is None:
        return set()
    return set(read_properties(path))


def _source(key: ConfigKey, given: set[str], overridden: set[str]) -> str:
    for name in (key.name, key.alias):
        if name is None:
            continue
        suffix = "" if name == key.name else f" (as {name})"
        if name in overridden:
            return "override" + suffix
        if name in given:
            return "file" + suffix
    return "default"


def effective_rows(config: Config, given: set[str], overridden: set[str]) -> list[tuple[str, str, str]]:
    """(name, shown value, source) of every key, then of every topic-level setting named."""
    rows = [(key.name, show(value) or '""', _source(key, given, overridden)) for key, value, _ in effective(config)]
    for topic in config.topics.values():
        for name in TOPIC_KEYS:
            full = f"topic.{topic.name}.{name}"
            value = getattr(topic, name.replace(".", "_"))
            if full in overridden:
                source = "override"
            elif full in given:
                source = "file"
            elif name not in TOPIC_FALLBACKS:
                source = "default"
            elif config[TOPIC_FALLBACKS[name]] == -2:  # Kafka's -2: local retention follows retention
                source = f"from {TOPIC_FALLBACKS[name]}=-2, the topic's {name.removeprefix('local.')}"
            else:
                source = f"from {TOPIC_FALLBACKS[name]}"
            rows.append((full, show(value), source))
    return rows


def format_rows(rows: Iterable[tuple[str, str, str]]) -> str:
    return "\n".join(text_table([("KEY", "VALUE", "SOURCE"), *rows]))


def check(path: str | None, overrides: Iterable[str], out: TextIO, err: TextIO, *, connect: bool = False) -> int:
    overrides = list(overrides)
    try:
        config = load(path, overrides)
        security(config)  # the certificate files and the JAAS line are read now, not at first use
        KeyRing.from_config(config)  # so are the encryption keys' files
        given = _given_keys(path)
    except ConfigError as e:
        print(f"tierproxy: invalid configuration: {e}", file=err)
        return EXIT_INVALID
    for warning in moved_key_warnings(config):
        print(f"tierproxy: warning: {warning}", file=err)
    rows = effective_rows(config, given, set(parse_overrides(overrides)))
    tiered = ", ".join(t.name for t in config.tiered_topics) or "none"
    print(f"# {config.source}: valid; tiered topics: {tiered}", file=out)
    print(format_rows(rows), file=out)
    return connect_check(config, out) if connect else EXIT_OK


def connect_check(config: Config, out: TextIO) -> int:
    """One line for the brokers and one for the object store: `ok`, or what is wrong."""
    import asyncio

    from .probes import brokers_name, probe_brokers, probe_store, store_name

    async def both() -> tuple[str | None, str | None]:
        return await asyncio.gather(probe_brokers(config), probe_store(config))

    brokers, store = asyncio.run(both())
    for name, problem in ((brokers_name(config), brokers), (store_name(config), store)):
        print(f"{name}: {problem or 'ok'}", file=out)
    return EXIT_UNREACHABLE if brokers or store else EXIT_OK


# --------------------------------------------------------------------------- docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _show_default(key: ConfigKey) -> str:
    value = key.default
    if value is REQUIRED:
        return "*(required)*"
    text = show(value)
    if text == "":
        return '`""`'
    # Byte sizes read better with their unit beside them.
    if key.type is int and key.name.endswith(".bytes") and value > 0 and value % MIB == 0:
        unit = f"{value // GIB} GiB" if value % GIB == 0 else f"{value // MIB} MiB"
        return f"`{text}` ({unit})"
    return f"`{text}`"


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


def _valid(key: ConfigKey) -> str:
    """Valid values with whole numbers written out (a byte bound of 5 MiB is 5242880)."""
    validator = key.validator
    if isinstance(validator, Range):
        if validator.high is None:
            return f">= {_number(validator.low)}"
        if validator.low is None:
            return f"<= {_number(validator.high)}"
        return f"[{_number(validator.low)}, {_number(validator.high)}]"
    return _cell(key.valid_values)


def _doc(key: ConfigKey) -> str:
    doc = key.doc
    if key.alias:
        doc += f" Also accepted as `{key.alias}`."
    if key.secret:
        doc += " Masked in `tierproxy config check`."
    return doc


def generate_docs() -> str:
    groups: dict[str, list[ConfigKey]] = {}
    for key in (*KEYS.values(), *PREFIX_KEYS.values()):
        groups.setdefault(key.group, []).append(key)
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from config/__init__.py by `{REGENERATE}`. Do not edit by hand. -->",
        "",
        "The proxy (`tierproxy serve`) and the pipeline (`tierproxy tier`) read one Kafka-style",
        "`.properties` file, given with `--config FILE`; `--override key=value` sets a key on the",
        "command line. An unknown key, a bad value or a missing required key stops start-up with",
        "a message naming the key. `tierproxy config check --config FILE` validates a file and",
        "prints every effective value and whether it came from the file or the default.",
        "",
    ]
    for group, keys in groups.items():
        lines += [
            f"## {group[0].upper()}{group[1:]}",
            "",
            "| Key | Type | Default | Valid values | Description |",
            "|---|---|---|---|---|",
        ]
        for key in keys:
            lines.append(
                f"| `{key.name}` | {key.type_name} | {_cell(_show_default(key))} | {_valid(key)} | {_cell(_doc(key))} |"
            )
        lines.append("")
    lines += [
        "## Topic-level settings",
        "",
        "Per topic, with Kafka's topic-level names: `topic.<topic name>.<key>`, for example",
        "`topic.orders.remote.storage.enable=true`. A topic is tiered only when",
        "`remote.storage.enable` is true for it; a key not given for a topic takes the value of",
        "the key it falls back to. A local retention of -2 takes the topic's (remote) retention.",
        "",
        "| Key | Type | Falls back to | Valid values | Description |",
        "|---|---|---|---|---|",
    ]
    for name, key in TOPIC_KEYS.items():
        fallback = f"`{TOPIC_FALLBACKS[name]}`" if name in TOPIC_FALLBACKS else f"(default `{show(key.default)}`)"
        lines.append(f"| `{name}` | {key.type_name} | {fallback} | {_valid(key)} | {_cell(key.doc)} |")
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def run(args: argparse.Namespace) -> int:
    if args.config_command == "docs":
        sys.stdout.write(generate_docs())
        return EXIT_OK
    if args.config_command == "metrics":
        from .metrics_docs import generate_metrics_docs

        sys.stdout.write(generate_metrics_docs())
        return EXIT_OK
    return check(args.config, args.override, sys.stdout, sys.stderr, connect=args.connect)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierproxy.config_check")
    parser.add_argument("--docs", action="store_true", help="print docs/configuration.md")
    parser.add_argument("--config", metavar="FILE")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.docs:
        sys.stdout.write(generate_docs())
        return EXIT_OK
    return check(args.config, args.override, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
