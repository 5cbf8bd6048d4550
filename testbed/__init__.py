"""Real Apache Kafka (KRaft) and S3 (moto) servers on 127.0.0.1, for tests, benchmarks and the demo."""

from testbed.jars import KAFKA_VERSION, MavenError, kafka_libs
from testbed.kafka import KafkaCluster, KafkaStartError
from testbed.s3 import S3Server, S3StartError, s3_client

__all__ = [
    "KAFKA_VERSION", "KafkaCluster", "KafkaStartError", "MavenError", "S3Server",
    "S3StartError", "kafka_libs", "s3_client",
]
