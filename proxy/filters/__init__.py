"""The proxy as a chain of per-API filters (see `chain`), one module per API it
intercepts:

- `addresses`: broker addresses in responses become the proxy's (Metadata,
  FindCoordinator, DescribeCluster, and the node endpoints of Fetch and Produce). It is
  first in the chain, so it is the last to see each response, the Fetch filter's too.
- `api_versions`: the versions clients are offered; the broker's, learned per connection.
- `fetch` (with `fetch_session`, and `protocol.fetch_wire` for the bytes): the remote tier behind Fetch.
- `list_offsets`: ListOffsets over the whole log, remote part included.
- `offset_for_leader_epoch`: OffsetForLeaderEpoch of read replica topics, from the remote
  log's leader epochs.
- `replica`: read replica topics, served from another cluster's remote tier only (Fetch
  and ListOffsets ask it which partitions those are); Produce to them is refused.

`messages` is what travels through a chain (the client's request, parsed at most once,
and the response), `context` what a filter sees of the proxy and the connection, and
`tiered_state` what Fetch and ListOffsets keep per connection.

A filter's ``handle(ctx, request, call_next)``: an exception closes that client
connection with a log line and hurts nothing else; InvalidRequest (a request that does
not parse) is the client's fault: one WARN line, counted as ``bad_request``;
RefusedRequest (`Filter.admit`: a request that gets no response must not reach the
broker) one WARN line too, counted as ``refused``.
"""

from .chain import AnswerCheck, CallNext, Filter, FilterChains, as_answered, pass_through, run_chain
from .context import ConnectionContext, Forward, NodeDirectory, OwnCorrelationIds, PerConnection, ProxyServices
from .messages import ClientRequest, InvalidRequest, RefusedRequest, Response

__all__ = (
    "AnswerCheck",
    "CallNext",
    "ClientRequest",
    "ConnectionContext",
    "Filter",
    "FilterChains",
    "Forward",
    "InvalidRequest",
    "NodeDirectory",
    "OwnCorrelationIds",
    "PerConnection",
    "ProxyServices",
    "RefusedRequest",
    "Response",
    "as_answered",
    "pass_through",
    "run_chain",
)
