"""Broker addresses in responses become the proxy's, so clients never bypass it.

Metadata, FindCoordinator (v4+ its coordinators list), DescribeCluster and the
``node_endpoints`` of Fetch (v16+) and Produce (v10+) responses name brokers by node
id, host and port. Each node is learned (its listener opened before the client can
read the answer) and advertised as the proxy host and ``proxy.broker.port.base +
node id``, as in kroxylicious' BrokerAddressFilter.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kio.static.primitive import i32

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import INTERCEPTED, decode_response, kio_versions, response_schema

from . import ConnectionContext, Forward, Interceptor, Response

if TYPE_CHECKING:
    from tierproxy.protocol.headers import RequestHeader

__all__ = ("AddressRewriter", "address_rewriters", "rewrite_node_endpoints")

_DESCRIBE_CLUSTER_CONTROLLERS = 2


async def _rewritten(ctx: ConnectionContext, entity: Any, id_field: str = "node_id") -> Any:
    node_id = getattr(entity, id_field)
    if node_id < 0:  # "no node", e.g. FindCoordinator with COORDINATOR_NOT_AVAILABLE
        return entity
    host, port = await ctx.services.nodes.learn(node_id, entity.host, entity.port)
    return dataclasses.replace(entity, host=host, port=i32(port))


async def _rewrite_all(ctx: ConnectionContext, entities: tuple[Any, ...], id_field: str = "node_id") -> tuple:
    return tuple([await _rewritten(ctx, entity, id_field) for entity in entities])


async def _metadata(ctx: ConnectionContext, response: Any) -> Any:
    return dataclasses.replace(response, brokers=await _rewrite_all(ctx, response.brokers))


async def _find_coordinator(ctx: ConnectionContext, response: Any) -> Any:
    if hasattr(response, "coordinators"):  # v4+: one entry per key
        return dataclasses.replace(response, coordinators=await _rewrite_all(ctx, response.coordinators))
    return await _rewritten(ctx, response)


async def _describe_cluster(ctx: ConnectionContext, response: Any) -> Any:
    # Controllers (v2, endpoint type 2) are not behind the proxy: their addresses stay.
    if getattr(response, "endpoint_type", 1) == _DESCRIBE_CLUSTER_CONTROLLERS:
        return response
    return dataclasses.replace(response, brokers=await _rewrite_all(ctx, response.brokers, "broker_id"))


async def rewrite_node_endpoints(ctx: ConnectionContext, response: Any) -> Any:
    """A Fetch or Produce response with its ``node_endpoints`` pointing at the proxy.

    Returns ``response`` itself when it has none (the usual case), so a caller can
    tell by identity that nothing changed. The Fetch handler calls this on the
    responses it builds.
    """
    endpoints = getattr(response, "node_endpoints", ())
    if not endpoints:
        return response
    return dataclasses.replace(response, node_endpoints=await _rewrite_all(ctx, endpoints))


_Rewrite = Callable[[ConnectionContext, Any], Awaitable[Any]]


def _versions_with_node_endpoints(api_key: ApiKey) -> range:
    """The versions whose response has ``node_endpoints`` (KIP-951), as kio's schemas say."""
    versions = [v for v in kio_versions(api_key)
                if any(f.name == "node_endpoints" for f in dataclasses.fields(response_schema(api_key, v)))]
    return range(versions[0], versions[-1] + 1)


_REWRITES: dict[ApiKey, tuple[range, _Rewrite]] = {
    ApiKey.METADATA: (INTERCEPTED[ApiKey.METADATA], _metadata),
    ApiKey.FIND_COORDINATOR: (INTERCEPTED[ApiKey.FIND_COORDINATOR], _find_coordinator),
    ApiKey.DESCRIBE_CLUSTER: (INTERCEPTED[ApiKey.DESCRIBE_CLUSTER], _describe_cluster),
    # Only these versions carry node_endpoints; older ones pass through untouched.
    ApiKey.FETCH: (_versions_with_node_endpoints(ApiKey.FETCH), rewrite_node_endpoints),
    ApiKey.PRODUCE: (_versions_with_node_endpoints(ApiKey.PRODUCE), rewrite_node_endpoints),
}


class AddressRewriter(Interceptor):
    """Forwards the request and rewrites the broker addresses of the response."""

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.versions, self._rewrite = _REWRITES[api_key]

    def __repr__(self) -> str:
        return f"AddressRewriter({ApiKey(self.api_key).name})"

    async def handle(
        self, ctx: ConnectionContext, header: RequestHeader, frame_body: memoryview, forward: Forward
    ) -> Response:
        payload = await forward(frame_body)
        response = decode_response(self.api_key, header.api_version, payload)
        rewritten = await self._rewrite(ctx, response)
        # Unchanged responses go back as the broker's own bytes, not re-encoded.
        return payload if rewritten is response else rewritten


def address_rewriters(*, fetch: bool = True) -> list[AddressRewriter]:
    """One rewriter per API with broker addresses. ``fetch=False`` when a Fetch handler
    is registered: it calls ``rewrite_node_endpoints`` itself."""
    keys = [key for key in _REWRITES if fetch or key != ApiKey.FETCH]
    return [AddressRewriter(key) for key in keys]
