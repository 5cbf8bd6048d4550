"""S3Proxy (gaul/s3proxy, Java, from Maven Central) as a real S3 endpoint on 127.0.0.1.

moto's server is one Python process and tops out near 30 MB/s, so it bounds every S3
figure. S3Proxy serves a filesystem blobstore (in its working directory) through Jetty,
fast enough to measure the proxy's own S3 path against; with a `LatencyRelay`
(testbed.latency) in front it stands for an object store with a first-byte latency.
Unlike moto it keeps its objects across `restart()`.
"""

from __future__ import annotations

from pathlib import Path

from testbed import jars
from testbed.kafka import java_binary
from testbed.ports import LOOPBACK
from testbed.s3 import S3Server

S3PROXY_VERSION = "2.6.0"


class S3ProxyServer(S3Server):
    name = "s3proxy"

    def _command(self, workdir: Path, port: int) -> list[str]:
        jar = jars.maven_jar("org.gaul", "s3proxy", S3PROXY_VERSION, "jar-with-dependencies")
        blobs = workdir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        properties = workdir / "s3proxy.properties"
        properties.write_text("\n".join([
            f"s3proxy.endpoint=http://{LOOPBACK}:{port}",
            "s3proxy.authorization=aws-v2-or-v4",
            "s3proxy.ignore-unknown-headers=true",  # botocore's x-amz-checksum-* on DeleteObjects
            f"s3proxy.identity={self.access_key}",
            f"s3proxy.credential={self.secret_key}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={blobs}",
        ]) + "\n")
        return [java_binary(), "-Xmx512m", "-XX:+UseG1GC", "-XX:-UsePerfData", "-jar", str(jar),
                "--properties", str(properties)]
