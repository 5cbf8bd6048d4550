"""Broker addresses in responses become the proxy's, so clients never bypass it.

Metadata, FindCoordinator (v4+ its coordinators list), DescribeCluster and the
``node_endpoints`` of Fetch (v16+) and Produce (v10+) responses name brokers by node
id, host and port. Each node is learned (its listener opened before the client can
read the answer) and advertised as the host and port the configuration gives it
(`config.broker_ports`), as in kroxylicious' BrokerAddressFilter: one filter for every
API whose responses name brokers, first in the chain so that it sees the response last,
after every other filter of the API made it (Fetch's answers from the remote tier included).

A node the configuration gives no port is left out of every broker list, so clients
never connect around the proxy: partitions it leads have a leader no client can find
(they treat it as a leader election, ask Metadata again and go on with the others), and
FindCoordinator naming it answers COORDINATOR_NOT_AVAILABLE, which clients retry.

A Fetch response stays buffers: its node endpoints are in its top-level tagged-field
section, which ends the payload and which the Fetch filter's scan of the broker's
answer already found. Only that section is decoded and rewritten, when it is not
empty (brokers send endpoints only when leadership moved); otherwise the buffers go
on untouched, never scanned again nor decoded.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any

from kio.static.primitive import i32

from tierproxy.protocol.apis import ApiKey, ErrorCode
from tierproxy.protocol.codecs import INTERCEPTED, decode_response, encode_payload, kio_versions, schema_fields
from tierproxy.protocol.codecs import response_schema

from .chain import AnswerCheck, CallNext, Filter
from .context import ConnectionContext
from tierproxy.protocol.fetch_wire import encode_fetch_response, scan_fetch_response
from .messages import ClientRequest, Response

__all__ = ("BrokerAddressFilter",)

_DESCRIBE_CLUSTER_CONTROLLERS = 2
_DESCRIBE_CLUSTER_ENDPOINT_TYPE_VERSION = 1
_FIND_COORDINATOR_BATCHED_VERSION = 4  # KIP-699: one coordinator per key


async def _rewritten(ctx: ConnectionContext, entity: Any, id_field: str = "node_id") -> Any | None:
    """The entity naming the proxy's listener for its node; None when the node has none."""
    node_id = getattr(entity, id_field)
    if node_id < 0:  # "no node", e.g. FindCoordinator with COORDINATOR_NOT_AVAILABLE
        return entity
    advertised = await ctx.services.nodes.learn(node_id, entity.host, entity.port)
    if advertised is None:
        return None
    host, port = advertised
    return dataclasses.replace(entity, host=host, port=i32(port))


async def _rewrite_all(ctx: ConnectionContext, entities: tuple[Any, ...], id_field: str = "node_id") -> tuple:
    """The entities naming the proxy's listeners; nodes without one are left out."""
    rewritten = [await _rewritten(ctx, entity, id_field) for entity in entities]
    return tuple(entity for entity in rewritten if entity is not None)


async def _coordinator(ctx: ConnectionContext, entity: Any) -> Any:
    """A coordinator naming the proxy's listener, or COORDINATOR_NOT_AVAILABLE (which
    clients retry) when its node has none."""
    rewritten = await _rewritten(ctx, entity)
    if rewritten is not None:
        return rewritten
    answer = dict(node_id=i32(-1), host="", port=i32(-1), error_code=ErrorCode.coordinator_not_available)
    if any(f.name == "error_message" for f in dataclasses.fields(entity)):
        answer["error_message"] = f"broker node {entity.node_id} has no tierproxy listener"
    return dataclasses.replace(entity, **answer)


async def _metadata(ctx: ConnectionContext, response: Any) -> Any:
    return dataclasses.replace(response, brokers=await _rewrite_all(ctx, response.brokers))


async def _find_coordinator(ctx: ConnectionContext, response: Any) -> Any:
    if response.__version__ >= _FIND_COORDINATOR_BATCHED_VERSION:
        return dataclasses.replace(response, coordinators=tuple(
            [await _coordinator(ctx, coordinator) for coordinator in response.coordinators]))
    return await _coordinator(ctx, response)


async def _describe_cluster(ctx: ConnectionContext, response: Any) -> Any:
    # Controllers (v2, endpoint type 2) are not behind the proxy: their addresses stay.
    if (response.__version__ >= _DESCRIBE_CLUSTER_ENDPOINT_TYPE_VERSION
            and response.endpoint_type == _DESCRIBE_CLUSTER_CONTROLLERS):
        return response
    return dataclasses.replace(response, brokers=await _rewrite_all(ctx, response.brokers, "broker_id"))


async def _node_endpoints(ctx: ConnectionContext, response: Any) -> Any:
    """A Fetch or Produce response with its ``node_endpoints`` pointing at the proxy;
    ``response`` itself when it has none (the usual case)."""
    if not response.node_endpoints:
        return response
    return dataclasses.replace(response, node_endpoints=await _rewrite_all(ctx, response.node_endpoints))


def _versions_with_node_endpoints(api_key: ApiKey) -> range:
    """The versions whose response has ``node_endpoints`` (KIP-951), as kio's schemas say."""
    versions = [v for v in kio_versions(api_key)
                if any(f.name == "node_endpoints" for f in schema_fields(response_schema(api_key, v)))]
    return range(versions[0], versions[-1] + 1)


_Rewrite = Callable[[ConnectionContext, Any], Awaitable[Any]]

_REWRITES: dict[int, _Rewrite] = {
    ApiKey.METADATA: _metadata,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.DESCRIBE_CLUSTER: _describe_cluster,
    ApiKey.PRODUCE: _node_endpoints,
}


async def _fetch_tagged_fields(ctx: ConnectionContext, version: int, section: Any) -> bytes:
    """A Fetch response's top-level tagged-field section with its node endpoints naming
    the proxy: kio decodes a response of nothing but that section, and the rewritten one
    is encoded the same way."""
    alone = b"".join(encode_fetch_response(version, [], tagged_fields=section))
    response = await _node_endpoints(ctx, decode_response(ApiKey.FETCH, version, alone))
    rewritten = scan_fetch_response(encode_payload(response), version).tagged_fields
    assert rewritten is not None, "a flexible Fetch response has a tagged-field section"
    return bytes(rewritten)


class BrokerAddressFilter(Filter):
    """Rewrites the broker addresses of every response that names brokers."""

    apis = MappingProxyType({
        ApiKey.METADATA: INTERCEPTED[ApiKey.METADATA],
        ApiKey.FIND_COORDINATOR: INTERCEPTED[ApiKey.FIND_COORDINATOR],
        ApiKey.DESCRIBE_CLUSTER: INTERCEPTED[ApiKey.DESCRIBE_CLUSTER],
        # Only these versions carry node_endpoints; older ones pass by untouched.
        ApiKey.FETCH: _versions_with_node_endpoints(ApiKey.FETCH),
        ApiKey.PRODUCE: _versions_with_node_endpoints(ApiKey.PRODUCE),
    })

    def pass_through(self, ctx: ConnectionContext, request: ClientRequest) -> AnswerCheck | None:
        """A Fetch may pass: its answer goes back as it came unless it names node endpoints."""
        return _names_no_endpoints if request.api_key == ApiKey.FETCH else None

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        response = await call_next(request)
        if response.api_key == ApiKey.FETCH:
            return await self._fetch(ctx, response)
        body = response.body
        rewritten = await _REWRITES[response.api_key](ctx, body)
        # Unchanged responses go on as they came (the broker's own bytes), not re-encoded.
        return response if rewritten is body else Response.of(rewritten)

    @staticmethod
    async def _fetch(ctx: ConnectionContext, response: Response) -> Response:
        response = _scanned(response)
        if _names_no_endpoints(response):
            return response
        section = await _fetch_tagged_fields(ctx, response.api_version, response.tagged_fields)
        return response.with_tagged_fields(section)


def _scanned(response: Response) -> Response:
    """A Fetch response whose tagged-field section is known: found once if no Fetch
    filter scanned it."""
    if response.tagged_fields is not None:
        return response
    return Response.encoded(response.api_key, response.api_version, response.parts,
                            tagged_fields=scan_fetch_response(response.payload, response.api_version).tagged_fields)


def _names_no_endpoints(response: Response) -> bool:
    """Whether a Fetch response has no top-level tagged fields (so no node endpoints)."""
    section = _scanned(response).tagged_fields
    return section is None or section[0] == 0  # type: ignore[index]  # a buffer of bytes
