"""ApiVersions: the broker's versions, with the intercepted APIs limited to what the
proxy handles (and raised where the proxy answers newer versions itself, such as
ListOffsets -4/-5)."""

from __future__ import annotations

import dataclasses
import struct

from typing import TYPE_CHECKING

from kio.static.primitive import i16

from tierproxy.protocol.apis import ApiKey
from tierproxy.protocol.codecs import INTERCEPTED, decode_response

from . import ConnectionContext, Forward, Interceptor, Response

if TYPE_CHECKING:
    from tierproxy.protocol.headers import RequestHeader

__all__ = ("ApiVersionsInterceptor", "BROKER_VERSIONS_KEY")

BROKER_VERSIONS_KEY = "broker_api_versions"
"""ctx.state key: the broker's {api key: (min, max)} from this connection's ApiVersions."""

_ERROR_CODE = struct.Struct(">h")


class ApiVersionsInterceptor(Interceptor):
    api_key = ApiKey.API_VERSIONS
    versions = INTERCEPTED[ApiKey.API_VERSIONS]

    async def handle(
        self, ctx: ConnectionContext, header: RequestHeader, frame_body: memoryview, forward: Forward
    ) -> Response:
        payload = await forward(frame_body)
        # Every version starts with the error code. On an error (UNSUPPORTED_VERSION
        # comes with a v0 body, KIP-511) the client must get the broker's answer as is.
        if len(payload) < _ERROR_CODE.size or _ERROR_CODE.unpack_from(payload, 0)[0] != 0:
            return payload
        response = decode_response(self.api_key, header.api_version, payload)
        # Handlers that talk to the broker in other versions need its real ranges.
        ctx.state[BROKER_VERSIONS_KEY] = {a.api_key: (a.min_version, a.max_version) for a in response.api_keys}
        registry = ctx.services.interceptors
        api_keys = []
        for api in response.api_keys:
            interceptor = registry.get(api.api_key)
            if interceptor is not None:
                low, high = interceptor.advertised_versions(api.min_version, api.max_version)
                api = dataclasses.replace(api, min_version=i16(low), max_version=i16(high))
            api_keys.append(api)
        return dataclasses.replace(response, api_keys=tuple(api_keys))
