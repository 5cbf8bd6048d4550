"""`tierproxy serve`: run the proxy on uvloop until SIGTERM or SIGINT.

Start-up fails with a message naming the key when the configuration is wrong, or
naming the address when a listener cannot be opened or another `serve` holds its port
(proxy/port_owner.py). An object store that cannot be
reached at start is one WARNING line naming it and the error, and the proxy starts
anyway; so does remote log metadata in the store that is missing or damaged (one ERROR
line naming the bucket, prefix or object: storage/metadata/bucket.py). On a signal the listeners close, every client connection is closed, the
interceptors are stopped and the command exits 0. With `proxy.workers` above 1 (0, the
default, is one per core) the command supervises that many worker processes
(proxy/workers.py), each of them this same command with `--worker-of`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from aiokafka.errors import KafkaError

from tierproxy.client.cluster import check_login
from tierproxy.client.connection import AuthenticationError
from tierproxy.config import Config, ConfigError, PROXY_LISTENER_HOST, PROXY_LISTENER_SHARED, load
from tierproxy.storage.errors import RemoteLogMetadataError, RemoteStorageError


def run(args: argparse.Namespace) -> int:
    worker = args.worker_of is not None
    try:
        config = load(args.config, args.override)
    except ConfigError as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return 2
    import uvloop

    from tierproxy.proxy.port_owner import PortTaken, claim_ports, serve_ports
    from tierproxy.proxy.workers import WORKER_CANNOT_START, supervise, watch_supervisor, worker_count

    claims = []
    if worker:
        watch_supervisor(args.worker_of)
    else:
        try:
            # Its workers share the ports through SO_REUSEPORT; another serve must not join them.
            if not config[PROXY_LISTENER_SHARED]:
                claims = claim_ports(config[PROXY_LISTENER_HOST], serve_ports(config))
        except PortTaken as e:
            print(f"tierproxy serve: {e}", file=sys.stderr)
            return 1
        try:
            # A refused login or an untrusted certificate stops start-up with the key to fix;
            # a broker that is merely down is waited for by the clients, as without the proxy.
            uvloop.run(check_login(config))
        except AuthenticationError as e:
            print(f"tierproxy serve: {e}", file=sys.stderr)
            return 1
        except ConnectionError as e:
            logging.getLogger("tierproxy").warning("no broker answered yet: %s", e)
        _check_store(config)
    try:
        count = 1 if worker else worker_count(config)
        if count > 1:
            return supervise(config, count, _config_arguments(args))
        from tierproxy.proxy.serve import serve  # the proxy itself: not in a supervisor's memory

        shared = None
        if worker and args.fetch_quota_file:
            from tierproxy.storage.shared_quota import SharedQuotaFile

            shared = SharedQuotaFile(args.fetch_quota_file, args.worker_index)
        uvloop.run(serve(config, worker=worker, shared_fetch_quota=shared))
    except (ConfigError, OSError, KafkaError, RemoteLogMetadataError, RemoteStorageError) as e:
        print(f"tierproxy serve: {e}", file=sys.stderr)
        return WORKER_CANNOT_START if worker else 1
    finally:
        for claim in claims:
            claim.close()
    return 0


def _check_store(config: Config) -> None:
    """One WARNING line when the object store cannot be reached now; the proxy starts
    anyway (remote partitions get TIERED_STORAGE_NOT_AVAILABLE until it is back)."""
    import uvloop

    from .probes import probe_store, store_name

    problem = uvloop.run(probe_store(config))
    if problem is not None:
        logging.getLogger("tierproxy").warning("%s cannot be reached: %s", store_name(config), problem)


def _config_arguments(args: argparse.Namespace) -> list[str]:
    """What each worker is started with: the same file, overrides and log level."""
    out = ["--log-level", args.log_level]
    out += ["--config", str(args.config)] if args.config is not None else []
    for override in args.override:
        out += ["--override", override]
    return out
