"""moto's S3 server as a real HTTP server on 127.0.0.1, in its own process.

moto keeps everything in memory: ``restart()`` comes back on the same port
with no buckets and no objects. It creates the bucket again only when asked
(``restart(create_bucket=True)``), so a test can tell "S3 was down" apart
from "S3 lost the data".
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from testbed.ports import LOOPBACK
from testbed.processes import ServerProcess

REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
START_TIMEOUT_S = 30.0


class S3StartError(RuntimeError):
    pass


def moto_server_binary() -> Path:
    # The console script installed beside this interpreter (the venv's bin dir).
    path = Path(sys.executable).parent / "moto_server"
    if not path.is_file():
        raise S3StartError(f"{path} not found: install moto[server]")
    return path


class S3Server(ServerProcess):
    """moto's server; subclasses run another S3 implementation (`_command`)."""

    name = "moto_server"
    start_timeout_s = START_TIMEOUT_S
    start_error = S3StartError

    def __init__(self, bucket: str = "tierproxy-test", *, port: int | None = None,
                 workdir: Path | None = None, detached: bool = False) -> None:
        super().__init__(port=port, workdir=workdir, detached=detached)
        self.bucket = bucket
        self.region = REGION
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        # The CA of the server's certificate when it serves HTTPS (set by a subclass as it starts).
        self.ca: Path | None = None

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{LOOPBACK}:{self.port}"

    def start(self, *, create_bucket: bool = True) -> "S3Server":
        self._launch("tierproxy-s3-")
        try:
            if create_bucket:
                self.create_bucket()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, workdir: Path, port: int) -> list[str]:
        return [str(moto_server_binary()), "-H", LOOPBACK, "-p", str(port)]

    def answers(self) -> bool:
        """True when the server answers HTTP (any status) on its port."""
        try:
            context = ssl.create_default_context(cafile=self.ca) if self.ca else None
            with urllib.request.urlopen(self.endpoint_url + "/", timeout=1.0, context=context):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, urllib.error.URLError):
            return False

    def create_bucket(self) -> None:
        self.client().create_bucket(Bucket=self.bucket)

    def storage_properties(self, prefix: str = "", *, endpoint_url: str | None = None) -> dict[str, str]:
        """tierproxy's remote storage keys for this server (`endpoint_url`: something in front of it)."""
        return {
            "remote.log.storage.backend": "s3",
            "remote.log.storage.key.prefix": prefix,
            "remote.log.storage.s3.bucket": self.bucket,
            "remote.log.storage.s3.endpoint.url": endpoint_url or self.endpoint_url,
            "remote.log.storage.s3.region": self.region,
            "remote.log.storage.s3.access.key.id": self.access_key,
            "remote.log.storage.s3.secret.access.key": self.secret_key,
            **({"remote.log.storage.s3.ssl.truststore.location": str(self.ca)} if self.ca else {}),
        }

    def client(self) -> Any:
        """A synchronous botocore S3 client, for set-up and checks in tests."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            **_https_options(self.ca),
        )

    def restart(self, *, create_bucket: bool = False) -> "S3Server":
        """Stop, then start on the same port. moto's state is gone afterwards."""
        self.stop()
        return self.start(create_bucket=create_bucket)


def _https_options(ca: Path | None) -> dict[str, Any]:
    """A botocore client's options for a server with a certificate from `ca` (none without).
    Over HTTPS botocore sends uploads unsigned, aws-chunked with a trailing checksum, which
    S3Proxy refuses: checksums only where an operation requires them, as tierproxy's own
    client asks."""
    if ca is None:
        return {}
    from botocore.config import Config

    return {"verify": str(ca), "config": Config(request_checksum_calculation="when_required")}


def s3_client(server_or_endpoint: S3Server | str, *, region: str = REGION,
              access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY,
              **client_kwargs: Any) -> Any:
    """An aiobotocore S3 client context manager: ``async with s3_client(s3) as client:``."""
    from aiobotocore.session import get_session

    if isinstance(server_or_endpoint, S3Server):
        client_kwargs = {**_https_options(server_or_endpoint.ca), **client_kwargs}
        endpoint = server_or_endpoint.endpoint_url
        region = server_or_endpoint.region
        access_key = server_or_endpoint.access_key
        secret_key = server_or_endpoint.secret_key
    else:
        endpoint = server_or_endpoint
    return get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=region,
        aws_access_key_id=access_key, aws_secret_access_key=secret_key, **client_kwargs,
    )
