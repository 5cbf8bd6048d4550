"""`tierproxy replica create` before it reaches any cluster: where the origin's partition
counts come from, and what it says when the store holds no metadata to count from."""

from __future__ import annotations

import pytest

from tierproxy.config import parse
from tierproxy.replica import ReplicaError, origin_partition_counts


async def test_a_store_with_no_metadata_under_the_prefix_is_named_not_taken_for_untiered(tmp_path):
    """A mistyped key prefix: the error names where the metadata was looked for, instead of
    suggesting that nothing was tiered."""
    config = parse({"bootstrap.servers": "127.0.0.1:9", "remote.log.storage.backend": "local",
                    "remote.log.storage.local.dir": str(tmp_path / "remote"),
                    "remote.log.storage.key.prefix": "tiered-typo",
                    "remote.log.metadata.backend": "remote",
                    "topic.orders.remote.log.read.replica": "true"})
    with pytest.raises(ReplicaError) as raised:
        await origin_partition_counts(config)
    message = str(raised.value)
    assert "no remote log metadata of orders" in message
    assert "tiered-typo/__remote_log_metadata" in message and "nothing of it is tiered yet" not in message
