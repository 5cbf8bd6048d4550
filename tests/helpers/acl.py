"""A SASL/PLAIN cluster with Kafka's StandardAuthorizer (testbed's `sasl_kafka`) in a test:
ACLs granted to its users, and raw connections authenticated as one of them."""

from __future__ import annotations

import datetime
import time
from typing import Any

from confluent_kafka.admin import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.static.primitive import i8, i32, i32Timedelta, i64

from testbed.fixtures import SASL_USERS
from testbed.kafka import KafkaCluster
from tierproxy.client.connection import KafkaConnection
from tierproxy.config.addresses import parse_host_port
from tierproxy.protocol.apis import ErrorCode
from tierproxy.protocol.codecs import encode_request
from tierproxy.protocol.framing import encode_frame


def grant(cluster: KafkaCluster, principal: str, resource: ResourceType, name: str, *operations: AclOperation,
          timeout_s: float = 30) -> None:
    """Allow `operations` on the resource, and return once the broker authorizes with them:
    CreateAcls answers when the controller has committed them, and the broker's authorizer
    applies them a moment later (DescribeAcls is answered from that authorizer)."""
    bindings = [AclBinding(resource, name, ResourcePatternType.LITERAL, f"User:{principal}", "*", op,
                           AclPermissionType.ALLOW) for op in operations]
    admin = cluster.admin()
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(30)
    wanted = AclBindingFilter(resource, name, ResourcePatternType.LITERAL, f"User:{principal}", None,
                              AclOperation.ANY, AclPermissionType.ALLOW)
    deadline = time.monotonic() + timeout_s
    while not set(operations) <= {b.operation for b in admin.describe_acls(wanted).result(30)}:
        assert time.monotonic() < deadline, f"the broker's authorizer never had {operations} for {principal} on {name}"
        time.sleep(0.05)


async def authenticated(address: str, user: str) -> KafkaConnection:
    """A connection to `address` logged in as `user` (SASL/PLAIN)."""
    conn = await KafkaConnection.open(*parse_host_port(address))
    handshake = await conn.request(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == ErrorCode.none, handshake
    answer = await conn.request(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{SASL_USERS[user]}".encode()))
    assert answer.error_code == ErrorCode.none, answer
    return conn


def send_unanswered(conn: KafkaConnection, request: Any) -> None:
    """Write a request that gets no response (a Produce with acks=0) on `conn`: its
    `request` would wait for one, so the frame goes to its writer directly."""
    conn._writer.writelines(encode_frame(encode_request(request, 2**31 - 1, "unanswered")))


def fetch_at(topic: str, offset: int, partition_index: int = 0) -> fetch12.FetchRequest:
    """A Fetch v12 (by name, no session) of a partition of `topic` (0 unless told) from `offset`."""
    partition = fetch12.FetchPartition(partition=i32(partition_index), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 20))
    return fetch12.FetchRequest(max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)),
                                min_bytes=i32(1), max_bytes=i32(1 << 20), isolation_level=i8(0),
                                topics=(fetch12.FetchTopic(topic=topic, partitions=(partition,)),),
                                forgotten_topics_data=())


async def consume_until_refused(consumer: Any, records: list[Any], seconds: float = 30) -> None:
    """Start `consumer` and collect what it reads into `records` for `seconds`, stopping it
    however that ends: a consumer without READ raises TopicAuthorizationFailedError."""
    try:
        await consumer.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=300)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
