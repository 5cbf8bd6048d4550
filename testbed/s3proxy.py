"""S3Proxy (gaul/s3proxy, Java, from Maven Central) as a real S3 endpoint on 127.0.0.1.

moto's server is one Python process and tops out near 30 MB/s, so it bounds every S3
figure. S3Proxy serves a filesystem blobstore (in its working directory) through Jetty,
fast enough to measure the proxy's own S3 path against; with a `LatencyRelay`
(testbed.latency) in front it stands for an object store with a first-byte latency.
Unlike moto it keeps its objects across `restart()`.

With `tls=True` it serves HTTPS only, as real object stores are reached: a certificate for
127.0.0.1 from a throwaway CA (testbed.tls) in a PKCS#12 keystore made at start in its
working directory; `ca` is that CA's PEM, which the S3 clients are given
(`remote.log.storage.s3.ssl.truststore.location` in `storage_properties`).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from testbed import jars
from testbed.kafka import java_binary
from testbed.ports import LOOPBACK
from testbed.s3 import S3Server
from testbed.tls import write_tls_files

S3PROXY_VERSION = "2.6.0"


class S3ProxyServer(S3Server):
    name = "s3proxy"

    def __init__(self, bucket: str = "tierproxy-test", *, tls: bool = False, **options: Any) -> None:
        super().__init__(bucket, **options)
        self.tls = tls

    def _command(self, workdir: Path, port: int) -> list[str]:
        jar = jars.maven_jar("org.gaul", "s3proxy", S3PROXY_VERSION, "jar-with-dependencies")
        blobs = workdir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        properties = workdir / "s3proxy.properties"
        properties.write_text("\n".join([
            *(self._https(workdir / "tls", port) if self.tls else [f"s3proxy.endpoint=http://{LOOPBACK}:{port}"]),
            "s3proxy.authorization=aws-v2-or-v4",
            "s3proxy.ignore-unknown-headers=true",  # botocore's x-amz-checksum-* on DeleteObjects
            f"s3proxy.identity={self.access_key}",
            f"s3proxy.credential={self.secret_key}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={blobs}",
        ]) + "\n")
        return [java_binary(), "-Xmx512m", "-XX:+UseG1GC", "-XX:-UsePerfData", "-jar", str(jar),
                "--properties", str(properties)]

    def _https(self, directory: Path, port: int) -> list[str]:
        """S3Proxy's properties for HTTPS on `port`, with a keystore made now."""
        files = write_tls_files(directory)
        password = secrets.token_urlsafe(16)
        key = serialization.load_pem_private_key(files.broker_key.read_bytes(), password=None)
        server_cert, *chain = x509.load_pem_x509_certificates(files.broker_cert.read_bytes())
        keystore = directory / "s3proxy.p12"
        keystore.write_bytes(pkcs12.serialize_key_and_certificates(
            b"s3proxy", key, server_cert, chain,  # type: ignore[arg-type]
            serialization.BestAvailableEncryption(password.encode())))
        keystore.chmod(0o600)
        self.ca = files.ca
        return [f"s3proxy.secure-endpoint=https://{LOOPBACK}:{port}",
                f"s3proxy.keystore-path={keystore}", f"s3proxy.keystore-password={password}"]
