"""Remote segments checked where they are stored: before the pipeline trims the broker's
copy of them (local retention) and on demand (`tierproxy status --verify`).

A segment is intact when its manifest reads and every object the manifest lists is in the
store with the size and CRC-32C recorded at copy time (`RemoteStorageManager.verify_segment`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import CorruptRemoteSegment, RemoteObjectMismatch, RemoteResourceNotFound
from .manifest import Manifest
from .model import RemoteLogSegmentMetadata
from .rsm import RemoteStorageManager

# Why a segment failed its check, besides RemoteObjectMismatch's MISSING, SIZE and CHECKSUM:
# its manifest is malformed, names another segment, or is missing beside other objects.
MANIFEST = "manifest"
REASONS = (RemoteObjectMismatch.MISSING, RemoteObjectMismatch.SIZE, RemoteObjectMismatch.CHECKSUM, MANIFEST)


@dataclass(frozen=True, slots=True)
class SegmentDamage:
    segment: RemoteLogSegmentMetadata
    reason: str  # one of REASONS
    key: str | None  # the object at fault; None when the whole segment (its manifest) is
    error: str

    def __str__(self) -> str:
        s = self.segment
        return f"remote segment {s.segment_id.id} (offsets {s.start_offset}-{s.end_offset}): {self.error}"


async def check_segments(
    rsm: RemoteStorageManager, segments: Sequence[RemoteLogSegmentMetadata], *, check_crc: bool, concurrency: int,
) -> list[Manifest | SegmentDamage]:
    """Per segment, in order: its manifest when it is intact, or what is wrong with it.
    A store that cannot be asked (unreachable, refusing) raises its RemoteStorageError:
    that is no finding about the segment."""
    limit = asyncio.Semaphore(concurrency)

    async def check(segment: RemoteLogSegmentMetadata) -> Manifest | SegmentDamage:
        async with limit:
            try:
                return await rsm.verify_segment(segment, check_crc=check_crc)
            except RemoteObjectMismatch as e:
                return SegmentDamage(segment, e.reason, e.key, str(e))
            except RemoteResourceNotFound as e:  # no manifest: the segment, or part of it, is gone
                return SegmentDamage(segment, RemoteObjectMismatch.MISSING, None, str(e))
            except CorruptRemoteSegment as e:
                return SegmentDamage(segment, MANIFEST, None, str(e))

    return list(await asyncio.gather(*(check(s) for s in segments)))
