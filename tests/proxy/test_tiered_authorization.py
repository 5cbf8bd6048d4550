"""Authorization stays with the broker, for remote offsets too.

A SASL/PLAIN cluster with Kafka's StandardAuthorizer: alice may read the topic, carol
may only describe it, bob may do nothing. The proxy has no credentials of its own;
each client authenticates through it to the broker on its own connection. alice reads
everything from offset 0 (remote and local); carol and bob get
TOPIC_AUTHORIZATION_FAILED and never a remote byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import TopicAuthorizationFailedError
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.list_offsets.v9 import request as list_offsets9
from kio.static.primitive import i8, i32, i64

from tierproxy.proxy.filters.tiered_state import OFFSETS_MAX_AGE_S
from tierproxy.protocol.apis import ErrorCode, OffsetSpec
from tierproxy.protocol.records import iter_batches
from tierproxy.client.connection import KafkaConnection
from testbed.fixtures import SASL_USERS
from tests.helpers.acl import authenticated, consume_until_refused, fetch_at, grant
from tests.helpers.consume import consume_aiokafka, consume_confluent, expected_by_partition, in_partition_order
from tests.helpers.consume import record_keys
from tests.helpers.fetch_sessions import answered, chain_handled, session_fetch
from tests.helpers.proxy import ProxyThread
from tests.helpers.tiered import Timed, TieredTopic, TopicSpec

PARTITIONS = 2
PER_PARTITION = 1000
SPEC = TopicSpec(Timed(PER_PARTITION), partitions=PARTITIONS)
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tiered(sasl_kafka, own_tiered_topics) -> TieredTopic:
    """Tiered through the cluster's PLAINTEXT inter-broker listener; the tests change its ACLs."""
    data = own_tiered_topics(SPEC, sasl_kafka)
    grant(sasl_kafka, "alice", ResourceType.TOPIC, data.topic, AclOperation.READ, AclOperation.DESCRIBE)
    grant(sasl_kafka, "alice", ResourceType.GROUP, "*", AclOperation.READ, AclOperation.DESCRIBE)
    grant(sasl_kafka, "carol", ResourceType.TOPIC, data.topic, AclOperation.DESCRIBE)
    grant(sasl_kafka, "carol", ResourceType.GROUP, "*", AclOperation.READ)
    assert all(data.boundary[p] > 0 for p in range(PARTITIONS))
    return data


@pytest.fixture(scope="module")
def proxy(tiered) -> Iterator[ProxyThread]:
    with tiered.proxy() as proxy:
        yield proxy


def _aiokafka_sasl(user: str) -> dict[str, str]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": SASL_USERS[user]}


def _confluent_sasl(proxy: ProxyThread, user: str) -> dict[str, str]:
    return {"bootstrap.servers": proxy.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": SASL_USERS[user]}


def _remote_reads(proxy: ProxyThread, topic: str) -> float:
    return proxy.metrics.value("tierproxy_remote_read_requests_total", {"topic": topic})


async def test_alice_reads_remote_and_local(proxy, tiered):
    data = tiered
    consumed = await consume_aiokafka(proxy.bootstrap_servers, data.topic, len(data.records),
                                      **_aiokafka_sasl("alice"))
    assert in_partition_order(record_keys(sorted(consumed, key=lambda r: (r.partition, r.offset)))) == \
        expected_by_partition(data.records)
    assert _remote_reads(proxy, data.topic) > 0
    # librdkafka, in a consumer group (alice may read groups).
    messages = await asyncio.to_thread(consume_confluent, proxy.bootstrap_servers, data.topic, len(data.records),
                                       **{k: v for k, v in _confluent_sasl(proxy, "alice").items()
                                          if k != "bootstrap.servers"})
    got = sorted((m.partition(), m.offset(), m.key(), m.value()) for m in messages)
    assert got == sorted(record_keys(data.records))


@pytest.mark.parametrize("user", ["carol", "bob"])
async def test_without_read_aiokafka_gets_topic_authorization_failed(proxy, tiered, user):
    """carol's Fetch is refused by the broker; bob does not even see the topic's metadata."""
    data = tiered
    before = _remote_reads(proxy, data.topic)
    consumer = AIOKafkaConsumer(data.topic, bootstrap_servers=proxy.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest", **_aiokafka_sasl(user))
    records = []
    with pytest.raises(TopicAuthorizationFailedError):
        await consume_until_refused(consumer, records)
    assert records == []
    assert _remote_reads(proxy, data.topic) == before


def _confluent_errors(proxy: ProxyThread, user: str, topic: str) -> tuple[list, set[int]]:
    consumer = Consumer({**_confluent_sasl(proxy, user), "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    messages, errors = [], set()
    try:
        deadline = time.monotonic() + 30
        while KafkaError.TOPIC_AUTHORIZATION_FAILED not in errors and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.3):
                if message.error() is None:
                    messages.append(message)
                else:
                    errors.add(message.error().code())
    finally:
        consumer.close()
    return messages, errors


def test_describe_only_confluent_gets_topic_authorization_failed(proxy, tiered):
    """(librdkafka as bob stops at GROUP_AUTHORIZATION_FAILED before any Fetch.)"""
    data = tiered
    before = _remote_reads(proxy, data.topic)
    messages, errors = _confluent_errors(proxy, "carol", data.topic)
    assert messages == []
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, errors
    assert _remote_reads(proxy, data.topic) == before


async def test_raw_fetch_of_a_remote_offset_per_principal(proxy, tiered):
    """The same Fetch of offset 0 (remote only), on connections authenticated as alice and
    as carol: remote bytes for alice, TOPIC_AUTHORIZATION_FAILED and no bytes for carol,
    also when asked again after alice's connection proved the offset remote."""
    data = tiered
    for user in ("carol", "alice", "carol"):
        conn = await authenticated(proxy.bootstrap_servers, user)
        try:
            for _ in range(2):  # the second fetch on a connection may skip the broker
                response = await conn.request(fetch_at(data.topic, 0))
                (answer,) = response.responses[0].partitions
                if user == "alice":
                    assert answer.error_code == ErrorCode.none
                    first = next(iter_batches(answer.records))
                    assert first.base_offset == 0 < data.boundary[0]
                else:
                    assert answer.error_code == ErrorCode.topic_authorization_failed
                    assert not answer.records
        finally:
            await conn.close()


async def test_a_refused_session_fetch_comes_back_as_the_broker_answered_it(sasl_kafka, proxy, tiered, monkeypatch):
    """carol (DESCRIBE only) and bob (nothing) open fetch sessions at remote and at local
    offsets, through the proxy and directly: the proxy's answers are the broker's (but for
    the session id each connection's broker picks), TOPIC_AUTHORIZATION_FAILED, and none of
    them meets the Fetch filter's chain (so no query of the proxy's own) or the remote tier."""
    data = tiered
    handled = chain_handled(monkeypatch)
    reads = _remote_reads(proxy, data.topic)
    remote = {p: 0 for p in range(PARTITIONS)}
    local = {p: data.boundary[p] for p in range(PARTITIONS)}
    for user in ("carol", "bob"):
        proxied = await authenticated(proxy.bootstrap_servers, user)
        direct = await authenticated(sasl_kafka.bootstrap_servers, user)
        try:
            for positions in (remote, local):
                opened = [await conn.request(session_fetch(data.topic, positions, session_id=0, epoch=0))
                          for conn in (proxied, direct)]
                assert [r.error_code for r in opened] == [ErrorCode.none] * 2
                assert {p.error_code for p in answered(opened[0]).values()} == {ErrorCode.topic_authorization_failed}
                same = [dataclasses.replace(r, session_id=i32(0), throttle_time=opened[1].throttle_time)
                        for r in opened]
                assert same[0] == same[1], user
                if opened[0].session_id and opened[1].session_id:  # the session goes on, still refused
                    later = [await conn.request(session_fetch(data.topic, positions, session_id=r.session_id,
                                                              epoch=1))
                             for conn, r in zip((proxied, direct), opened)]
                    assert [r.session_id for r in later] == [r.session_id for r in opened]
                    assert dataclasses.replace(later[0], session_id=i32(0), throttle_time=later[1].throttle_time) \
                        == dataclasses.replace(later[1], session_id=i32(0))
        finally:
            await proxied.close()
            await direct.close()
    assert handled == []
    assert _remote_reads(proxy, data.topic) == reads


async def test_list_offsets_of_the_remote_part_is_the_brokers_to_refuse(proxy, tiered):
    """ListOffsets needs DESCRIBE: carol gets the remote answers, bob the broker's refusal."""
    data = tiered
    first_remote = data.of(0)[0]
    specs = {OffsetSpec.EARLIEST: 0, OffsetSpec.LATEST_TIERED_TIMESTAMP: data.boundary[0] - 1,
             first_remote.timestamp_ms: first_remote.offset}
    for user in ("carol", "bob"):
        conn = await authenticated(proxy.bootstrap_servers, user)
        try:
            for spec, offset in specs.items():
                partition = list_offsets9.ListOffsetsPartition(partition_index=i32(0), timestamp=i64(spec))
                response = await conn.request(list_offsets9.ListOffsetsRequest(
                    replica_id=i32(-1), isolation_level=i8(0),
                    topics=(list_offsets9.ListOffsetsTopic(name=data.topic, partitions=(partition,)),)))
                (answer,) = response.topics[0].partitions
                if user == "carol":
                    assert (answer.error_code, answer.offset) == (ErrorCode.none, offset), spec
                else:
                    assert answer.error_code == ErrorCode.topic_authorization_failed, spec
                    assert answer.offset == -1, spec
        finally:
            await conn.close()


async def test_read_permission_taken_away_applies_to_a_proven_connection(sasl_kafka, proxy, tiered):
    """dave's connection proved offset 0 remote; then his READ is revoked (DESCRIBE stays).
    Once the broker refuses him, the proxy must not keep serving him remote bytes on the
    connection it proved earlier."""
    data = tiered
    grant(sasl_kafka, "dave", ResourceType.TOPIC, data.topic, AclOperation.READ, AclOperation.DESCRIBE)
    proxied = await authenticated(proxy.bootstrap_servers, "dave")
    direct = await authenticated(sasl_kafka.bootstrap_servers, "dave")
    try:
        async def error_of(conn: KafkaConnection) -> int:
            (answer,) = (await conn.request(fetch_at(data.topic, 0))).responses[0].partitions
            assert answer.error_code != ErrorCode.none or next(iter_batches(answer.records)).base_offset == 0
            return answer.error_code

        deadline = time.monotonic() + 30
        while await error_of(direct) != ErrorCode.offset_out_of_range:  # the grant has reached the broker
            assert time.monotonic() < deadline, "dave's READ never applied"
            await asyncio.sleep(0.2)
        assert await error_of(proxied) == ErrorCode.none
        assert await error_of(proxied) == ErrorCode.none  # proven: may skip the broker now
        revoke = AclBindingFilter(ResourceType.TOPIC, data.topic, ResourcePatternType.LITERAL, "User:dave", "*",
                                  AclOperation.READ, AclPermissionType.ALLOW)
        for future in sasl_kafka.admin().delete_acls([revoke], request_timeout=30).values():
            future.result(30)
        while await error_of(direct) != ErrorCode.topic_authorization_failed:
            assert time.monotonic() < deadline, "the revocation never applied"
            await asyncio.sleep(0.2)
        # Kafka checks READ on every Fetch; the proxy trails the broker by at most its proof's
        # age (OFFSETS_MAX_AGE_S, docs/operations.md), plus this loop's 50 ms poll and one
        # fetch round trip through the proxy: 0.5 s of margin.
        refused_directly = time.monotonic()
        deadline = refused_directly + 10
        while (error := await error_of(proxied)) == ErrorCode.none and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        trailed = time.monotonic() - refused_directly
        assert error == ErrorCode.topic_authorization_failed
        assert trailed < OFFSETS_MAX_AGE_S + 0.5, trailed
    finally:
        await proxied.close()
        await direct.close()
