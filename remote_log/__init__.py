"""The remote read side, written once: Kafka's `RemoteLogManager` read path over the caches.

- `segments`: which remote segment serves an offset, by leader-epoch lineage, and the
  walk to the segment that follows (Kafka's `findNextSegmentMetadata`).
- `reader`: `RemoteLogReader`, the Fetch read, the ListOffsets lookups and an iterator
  over a segment's record batches, over the index and chunk caches.
- `transactions`: the aborted transactions of a read, from the transaction indexes of
  its segment and those after it (Kafka's `collectAbortedTransactions`).
- `reader_pool`: Kafka's remote log reader thread pool, as asyncio tasks.
- `engine`: the caches, the reader and its pool wired from the configuration.
- `metrics`: the Prometheus metrics of remote reads, the pool and the caches.

The proxy serves Fetch and ListOffsets with it; the Spark data source reads with it.
Errors are the storage's own (RemoteStorageError and subclasses, MetadataNotReady);
only the proxy turns them into Kafka error codes.
"""
