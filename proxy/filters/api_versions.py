"""ApiVersions: the broker's versions, with the intercepted APIs limited to what the
proxy handles (and raised where the proxy answers newer versions itself, such as
ListOffsets -4/-5)."""

from __future__ import annotations

import dataclasses
import struct

from types import MappingProxyType

from kio.static.primitive import i16

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import INTERCEPTED

from .chain import CallNext, Filter
from .context import ConnectionContext
from .messages import ClientRequest, Response

__all__ = ("ApiVersionsFilter",)

_ERROR_CODE = struct.Struct(">h")


class ApiVersionsFilter(Filter):
    apis = MappingProxyType({ApiKey.API_VERSIONS: INTERCEPTED[ApiKey.API_VERSIONS]})

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        response = await call_next(request)
        payload = response.payload
        # Every version starts with the error code. On an error (UNSUPPORTED_VERSION
        # comes with a v0 body, KIP-511) the client must get the broker's answer as is.
        if memoryview(payload).nbytes < _ERROR_CODE.size or _ERROR_CODE.unpack_from(payload, 0)[0] != 0:
            return response
        body = response.body
        # Filters that talk to the broker in other versions need its real ranges.
        ctx.broker_api_versions = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in body.api_keys}
        filters = ctx.services.filters
        api_keys = []
        for api in body.api_keys:
            if filters.filters_of(api.api_key):
                low, high = filters.advertised_versions(api.api_key, api.min_version, api.max_version)
                api = dataclasses.replace(api, min_version=i16(low), max_version=i16(high))
            api_keys.append(api)
        return Response.of(dataclasses.replace(body, api_keys=tuple(api_keys)))
