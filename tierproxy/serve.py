"""`tierproxy serve`: run the proxy on uvloop until SIGTERM or SIGINT.

Start-up fails with a message naming the key when the configuration is wrong, or
naming the address when a listener cannot be opened. On a signal the listeners
close, every client connection is closed, the interceptors are stopped and the
command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys

from aiokafka.errors import KafkaError

from client.cluster import check_login
from client.connection import AuthenticationError
from config import ConfigError, load
from storage.errors import RemoteLogMetadataError


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        config = load(args.config, args.override)
    except ConfigError as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 2
    import uvloop

    from proxy.serve import serve

    try:
        # A refused login or an untrusted certificate stops start-up with the key to fix;
        # a broker that is merely down is waited for by the clients, as without the proxy.
        uvloop.run(check_login(config))
    except AuthenticationError as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 1
    except ConnectionError as e:
        logging.getLogger("tierproxy").warning("no broker answered yet: %s", e)
    try:
        uvloop.run(serve(config))
    except (ConfigError, OSError, KafkaError, RemoteLogMetadataError) as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 1
    return 0
