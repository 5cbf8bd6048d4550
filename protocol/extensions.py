"""Compiled accelerators: C twins of pure-Python hot paths, used when built.

`pip install` builds them where a C compiler is (setup.py; a failed build is skipped), and
the pure-Python modules stay the reference. As aiokafka's AIOKAFKA_NO_EXTENSIONS, setting
TIERPROXY_NO_EXTENSIONS to any non-empty value (e.g. 1) makes the process use the pure-Python
code even where the compiled modules are built.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ("NO_EXTENSIONS", "compiled")

NO_EXTENSIONS = bool(os.environ.get("TIERPROXY_NO_EXTENSIONS"))


def compiled(name: str) -> ModuleType | None:
    """The compiled module `name`; None when extensions are turned off or it was not built."""
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
