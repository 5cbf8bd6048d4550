"""Reading a Kafka-style `.properties` file."""

from __future__ import annotations

import os

import javaproperties

__all__ = ("read_properties",)


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """The keys and values of a `.properties` file (Java syntax, UTF-8), as written: no
    defaults, nothing checked. Raises ConfigError naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return dict(javaproperties.load(f))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or a bad \\u escape
        # Imported here: `config` itself reads its file through this module.
        from tierproxy.config import ConfigError

        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read configuration file {os.fspath(path)}: {reason}") from None
