"""Filters and their chains, as in kroxylicious' FilterHandler.

A proxy has an ordered list of filters, each naming the APIs and versions it takes
part in (`Filter.apis`). A client's request goes through the filters of its API key
and version in that order; each passes it on with ``call_next`` (changed or not) and
the last one's ``call_next`` forwards it upstream. The response comes back through the
same filters in reverse: each gets what the filters behind it returned and returns
what the filters before it see. A filter may also answer without passing the request
on, or pass it on more than once.

A request of an API no filter takes (or of a version none takes) never meets a chain:
the connection forwards it as an opaque frame, its header peeked only. Nor does a request
that gets no response (a Produce with acks=0): only the filters that override
`Filter.admit` see it, and only to let it through or refuse it.

A request every filter of its chain lets pass (`Filter.pass_through`: a Fetch at the tail)
meets no chain either while the broker's answer needs nothing of them: the connection
forwards it as it came, with no task, and the filters' checks of the answer (`as_answered`)
say whether it goes back as it came. When one says no, the chain handles the request after
all, its end returning the answer already there (`ClientRequest.answer`).
"""

from __future__ import annotations

import asyncio
import functools
import logging

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from .messages import ClientRequest, Response

if TYPE_CHECKING:
    from .context import ConnectionContext

log = logging.getLogger(__name__)

__all__ = ("AnswerCheck", "CallNext", "Filter", "FilterChains", "as_answered", "pass_through", "run_chain")

_CHAINS_KEPT = 4096

CallNext = Callable[[ClientRequest], Awaitable[Response]]
"""Pass a request on to the rest of the chain; get its response back."""

AnswerCheck = Callable[[Response], bool]
"""A filter's look at the broker's answer to a request it let pass (`Filter.pass_through`):
True when the answer may go to the client as it came."""


class Filter:
    """One step of the chain of the APIs in `apis`. Subclasses set `apis` and override
    `handle`; one instance serves every connection and holds what they share, and
    state of one connection is the filter's own `PerConnection` (context.py), made per
    connection by its factory."""

    apis: Mapping[int, range] = MappingProxyType({})
    """API key -> the request versions this filter takes part in."""

    def advertised_versions(self, api_key: int, broker_min: int, broker_max: int) -> tuple[int, int]:
        """The (min, max) of `api_key` ApiVersions offers clients, given the range the
        filters before this one allow. By default capped at what this filter handles, so
        that no version it cannot read reaches the broker; overriding may raise the max
        (an API the proxy answers partly itself)."""
        top = min(broker_max, self.apis[api_key].stop - 1)
        return (broker_min, top) if top >= broker_min else (broker_min, broker_max)

    async def handle(self, ctx: ConnectionContext, request: ClientRequest, call_next: CallNext) -> Response:
        return await call_next(request)

    def pass_through(self, ctx: ConnectionContext, request: ClientRequest) -> AnswerCheck | None:
        """Whether `request` may go to the broker as the client sent it, with no task and no
        chain: None (the default) when this filter must handle it; else the check of the
        broker's answer, called at once when it comes (no I/O, in reverse chain order, each
        seeing what the checks before it set on the Response). When every check says True
        the answer goes back as it came; when one says False the chain handles the request,
        its end returning that answer instead of forwarding the request again: a filter
        that let a request pass must forward it unchanged then, once."""
        return None

    async def admit(self, ctx: ConnectionContext, request: ClientRequest) -> None:
        """A request of this filter's APIs that gets no response (a Produce with acks=0):
        the connection forwards it as it came once every filter that overrides this
        returned. Raising RefusedRequest keeps it from the broker and closes the
        connection, as a broker does with an acks=0 Produce it cannot take: there is no
        response to carry an error."""

    async def start(self) -> None:
        """Called once when the proxy starts (open clients, load caches)."""

    async def close(self) -> None:
        """Called once when the proxy stops."""

    def __repr__(self) -> str:
        return type(self).__name__


class FilterChains:
    """The filters of one proxy, in chain order: a request meets them in this order,
    its response in reverse."""

    def __init__(self, filters: Iterable[Filter] = ()) -> None:
        self._filters = list(filters)
        self._by_key = _by_api_key(self._filters)
        self._admitting_by_key = _by_api_key(f for f in self._filters if type(f).admit is not Filter.admit)
        self._passing_by_key = _by_api_key(f for f in self._filters if type(f).pass_through is not Filter.pass_through)
        # Every request asks for its chain: each (key, version) is worked out once.
        self._chains: dict[tuple[int, int], tuple[Filter, ...]] = {}
        self._admitting: dict[tuple[int, int], tuple[Filter, ...]] = {}
        self._passing: dict[tuple[int, int], tuple[Filter, ...]] = {}

    def chain(self, api_key: int, api_version: int) -> tuple[Filter, ...]:
        """The filters a request meets, in order; empty for the opaque path."""
        return _filters_for(self._by_key, self._chains, api_key, api_version)

    def admitting(self, api_key: int, api_version: int) -> tuple[Filter, ...]:
        """The filters whose `admit` a request that gets no response meets, in order;
        empty (the usual case, one lookup) when it is forwarded at once."""
        return _filters_for(self._admitting_by_key, self._admitting, api_key, api_version)

    def may_pass(self, api_key: int, api_version: int) -> bool:
        """Whether every filter of the chain may let a request pass (`Filter.pass_through`)."""
        passing = _filters_for(self._passing_by_key, self._passing, api_key, api_version)
        return bool(passing) and len(passing) == len(self.chain(api_key, api_version))

    def filters_of(self, api_key: int) -> list[Filter]:
        """Every filter taking part in an API, at any version, in chain order."""
        return [filter_ for _, filter_ in self._by_key.get(api_key, ())]

    def advertised_versions(self, api_key: int, broker_min: int, broker_max: int) -> tuple[int, int]:
        """The (min, max) ApiVersions offers clients for an API: the broker's range as
        each of its filters, in turn, narrows or widens it."""
        low, high = broker_min, broker_max
        for filter_ in self.filters_of(api_key):
            low, high = filter_.advertised_versions(api_key, low, high)
        return low, high

    def __iter__(self) -> Iterator[Filter]:
        return iter(self._filters)

    async def start(self) -> None:
        for filter_ in self._filters:
            await filter_.start()

    async def close(self) -> None:
        # One failing close must not keep the others open.
        results = await asyncio.gather(*(f.close() for f in self._filters), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        # A client library cancelling its own tasks while it stops (aiokafka, with the
        # broker already gone) is no failure of the proxy's shutdown.
        for filter_, result in zip(self._filters, results):
            if isinstance(result, asyncio.CancelledError):
                log.warning("closing %r was cancelled inside; it is closed all the same", filter_)


def _by_api_key(filters: Iterable[Filter]) -> dict[int, list[tuple[range, Filter]]]:
    by_key: dict[int, list[tuple[range, Filter]]] = {}
    for filter_ in filters:
        for api_key, versions in filter_.apis.items():
            by_key.setdefault(int(api_key), []).append((versions, filter_))
    return by_key


def _filters_for(by_key: dict[int, list[tuple[range, Filter]]], known: dict[tuple[int, int], tuple[Filter, ...]],
                 api_key: int, api_version: int) -> tuple[Filter, ...]:
    found = known.get((api_key, api_version))
    if found is None:
        entries = by_key.get(api_key, ())
        found = tuple(filter_ for versions, filter_ in entries if api_version in versions)
        if len(known) < _CHAINS_KEPT:  # versions come from clients: keep a bounded few
            known[(api_key, api_version)] = found
    return found


def pass_through(chain: tuple[Filter, ...], ctx: ConnectionContext,
                 request: ClientRequest) -> tuple[AnswerCheck, ...] | None:
    """The checks of the broker's answer when every filter of `chain` lets `request` pass,
    in chain order; None when one must handle it."""
    checks = []
    for filter_ in chain:
        check = filter_.pass_through(ctx, request)
        if check is None:
            return None
        checks.append(check)
    return tuple(checks)


def as_answered(checks: tuple[AnswerCheck, ...], response: Response) -> bool:
    """Whether the broker's answer goes to the client as it came: the checks see it in
    reverse chain order, as the chain would, until one says no."""
    for check in reversed(checks):
        if not check(response):
            return False
    return True


async def _upstream(ctx: ConnectionContext, request: ClientRequest) -> Response:
    answer = request.answer
    if answer is not None:  # forwarded already (Filter.pass_through): it went once
        request.answer = None
        return answer
    payload = await ctx.forward(request.upstream_frame_body())
    return Response.encoded(request.api_key, request.api_version, [payload])


async def run_chain(chain: tuple[Filter, ...], ctx: ConnectionContext, request: ClientRequest) -> Response:
    """The response of `request` after it went through `chain` and the broker, and
    back through `chain` in reverse."""
    call_next: CallNext = functools.partial(_upstream, ctx)
    for filter_ in reversed(chain):
        call_next = functools.partial(filter_.handle, ctx, call_next=call_next)
    return await call_next(request)
