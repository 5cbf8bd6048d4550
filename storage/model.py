"""The remote log's metadata types, after KIP-405 and Kafka's `remote.storage` API.

A segment moves COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED
-> DELETE_SEGMENT_FINISHED; a copy that never finished may go straight to
DELETE_SEGMENT_STARTED. A partition being removed moves DELETE_PARTITION_MARKED ->
DELETE_PARTITION_STARTED -> DELETE_PARTITION_FINISHED. The numeric ids are Kafka's.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import IllegalStateTransition


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @classmethod
    def generate(cls, topic_id_partition: TopicIdPartition) -> RemoteLogSegmentId:
        return cls(topic_id_partition, uuid.uuid4())


class RemoteLogSegmentState(enum.IntEnum):
    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


_SEGMENT_TRANSITIONS = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: {
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
    },
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: {RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED},
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: set(),
}


def check_segment_transition(current: RemoteLogSegmentState, target: RemoteLogSegmentState) -> None:
    if target not in _SEGMENT_TRANSITIONS[current]:
        raise IllegalStateTransition(f"remote log segment cannot go from {current.name} to {target.name}")


class RemotePartitionDeleteState(enum.IntEnum):
    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


_PARTITION_TRANSITIONS = {
    None: {RemotePartitionDeleteState.DELETE_PARTITION_MARKED},
    RemotePartitionDeleteState.DELETE_PARTITION_MARKED: {RemotePartitionDeleteState.DELETE_PARTITION_STARTED},
    RemotePartitionDeleteState.DELETE_PARTITION_STARTED: {RemotePartitionDeleteState.DELETE_PARTITION_FINISHED},
    RemotePartitionDeleteState.DELETE_PARTITION_FINISHED: set(),
}


def check_partition_delete_transition(
    current: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState
) -> None:
    if target not in _PARTITION_TRANSITIONS[current]:
        name = current.name if current is not None else "no state"
        raise IllegalStateTransition(f"remote partition delete cannot go from {name} to {target.name}")


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """One remote segment: offsets [start_offset, end_offset] of one partition.

    `segment_leader_epochs` maps each leader epoch in the segment to its first offset,
    sorted by epoch, as Kafka's leader-epoch checkpoint does. `leader_epoch` is the
    epoch of the writer that created or last updated this entry.
    """

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    leader_epoch: int
    event_timestamp_ms: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    segment_size_in_bytes: int
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    txn_index_empty: bool = False

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"invalid offsets [{self.start_offset}, {self.end_offset}] for {self.segment_id}")
        if not self.segment_leader_epochs:
            raise ValueError(f"segment {self.segment_id} has no leader epochs")
        epochs = [e for e, _ in self.segment_leader_epochs]
        if epochs != sorted(set(epochs)):
            raise ValueError(f"segment {self.segment_id} leader epochs are not strictly increasing: {epochs}")

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.segment_id.topic_id_partition

    def with_update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        check_segment_transition(self.state, update.state)
        return dataclasses.replace(
            self, state=update.state, event_timestamp_ms=update.event_timestamp_ms, leader_epoch=update.leader_epoch
        )


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    state: RemoteLogSegmentState
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata:
    topic_id_partition: TopicIdPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    epoch: int


class IndexType(enum.Enum):
    """The files shipped beside a segment's `.log`, with Kafka's suffixes."""

    OFFSET = ".index"
    TIMESTAMP = ".timeindex"
    PRODUCER_SNAPSHOT = ".snapshot"
    TRANSACTION = ".txnindex"
    LEADER_EPOCH = ".leader_epoch_checkpoint"

    @property
    def suffix(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """Local files of one segment, ready to copy (Kafka's `LogSegmentData`).

    Files, not bytes, so a copy never holds a whole segment in memory.
    """

    log_segment: Path
    offset_index: Path
    time_index: Path
    transaction_index: Path | None
    producer_snapshot_index: Path
    leader_epoch_index: bytes
