"""The remote tier as the proxy's filters share it: storage, metadata, the read engine,
and the Kafka error code that stands for TIERED_STORAGE_NOT_AVAILABLE.

Kafka never shipped a wire code named TIERED_STORAGE_NOT_AVAILABLE; it answers a failed
remote read with UNKNOWN_SERVER_ERROR and metadata that is not ready with
REPLICA_NOT_AVAILABLE. The proxy keeps the name in its logs and metrics and sends
`tiered.storage.not.available.error.code` (default -1) on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry

from tierproxy.protocol.apis import ErrorCode
from tierproxy.storage.factory import remote_log_metadata_manager, remote_storage_manager
from tierproxy.storage.metadata import RemoteLogMetadataManager
from tierproxy.storage.model import TopicIdPartition
from tierproxy.storage.quota import RateQuota, fetch_quota_settings
from tierproxy.storage.shared_quota import SharedQuotaFile, SharedSampledRate
from tierproxy.storage.rsm import RemoteStorageManager

from tierproxy.config import Config, TIERED_STORAGE_NOT_AVAILABLE_ERROR_CODE
from tierproxy.remote_log.engine import RemoteReadEngine
from tierproxy.remote_log.failures import Cause, cause_of
from tierproxy.remote_log.metrics import RemoteMetrics
from tierproxy.remote_log.throttled_log import ThrottledLog

from .fetch_turns import FetchTurns
from .paced import give_back_paused

log = logging.getLogger("tierproxy.tiered")

# How often a reader of the file metadata store picks up what the pipeline appended.
METADATA_REFRESH_S = 1.0


class RemoteTier:
    def __init__(
        self,
        config: Config,
        *,
        rsm: RemoteStorageManager | None = None,
        rlmm: RemoteLogMetadataManager | None = None,
        registry: CollectorRegistry | None = None,
        shared_index_dir: bool = False,
        shared_fetch_quota: SharedQuotaFile | None = None,
    ) -> None:
        self.config = config
        self.rsm = rsm if rsm is not None else remote_storage_manager(config)
        self.rlmm = rlmm if rlmm is not None else remote_log_metadata_manager(config, read_only=True)
        self.metrics = RemoteMetrics(registry) if registry is not None else RemoteMetrics()
        self.engine = RemoteReadEngine.from_config(config, self.rsm, self.rlmm, self.metrics,
                                                   shared_index_dir=shared_index_dir)
        self.rsm.observe_requests(self.metrics.store_request)
        self.rlmm.observe_problems(self.metrics.metadata_problem)
        # Clients that stopped reading give their chunks back when others need the room.
        self.engine.chunk_cache.on_full = give_back_paused
        self.unavailable_code = ErrorCode(config[TIERED_STORAGE_NOT_AVAILABLE_ERROR_CODE])
        # KIP-956: remote.log.manager.fetch.max.bytes.per.second, for the whole proxy: with
        # proxy.workers, one rate and one line of turns that all the workers share.
        fetch_settings = fetch_quota_settings(config)
        shared_rate = (SharedSampledRate(shared_fetch_quota, fetch_settings.window_size_s)
                       if shared_fetch_quota is not None and fetch_settings.enabled else None)
        self.fetch_quota = RateQuota(fetch_settings, rate=shared_rate)
        self.fetch_turns = FetchTurns(self.fetch_quota, shared=shared_fetch_quota if shared_rate else None)
        # Bytes count against it as the store reads them, read-ahead and runs of chunks too.
        self.engine.chunk_cache.on_store_read = self.fetch_quota.record
        self.engine.chunk_cache.read_ahead_fits = self.fetch_quota.allows
        self._refresher: asyncio.Task | None = None
        # A consumer retrying a failing read meets the same error again and again.
        self._failures_log = ThrottledLog(log)

    async def start(self) -> None:
        await self.rsm.start()
        await self.rlmm.start()
        await self.engine.start()
        if self.rlmm.needs_refresh:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_metadata())

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self.engine.close()
        await self.rlmm.close()
        await self.rsm.close()

    async def _refresh_metadata(self) -> None:
        failing: str | None = None  # the failure logged last: a lasting one is logged once, not every second
        while True:
            await asyncio.sleep(METADATA_REFRESH_S)
            try:
                await self.rlmm.refresh()
            except Exception as e:  # a bad read now is retried next time; serving goes on
                if repr(e) != failing:
                    log.exception("refreshing the remote log metadata failed (retried every %.0f s, logged again "
                                  "when the failure changes)", METADATA_REFRESH_S)
                failing = repr(e)
            else:
                if failing is not None:
                    log.info("the remote log metadata is refreshed again")
                failing = None

    def remote_log_start(self, tp: TopicIdPartition) -> int | None:
        """The remote log start offset, or None when the partition has nothing remote.
        Raises MetadataNotReady while its metadata loads."""
        return self.rlmm.log_start_offset(tp)

    def error_code_for(self, tp: TopicIdPartition, error: BaseException, api: str) -> ErrorCode:
        """The wire code of a failed remote read, logged and counted under Kafka's names."""
        code = self._error_code_for(tp, error)
        self.metrics.partition_error(api, code)
        return code

    def _error_code_for(self, tp: TopicIdPartition, error: BaseException) -> ErrorCode:
        cause = cause_of(error)
        kind = (tp, type(error))
        if cause is Cause.METADATA_NOT_READY:
            # Counted here, not by the reader: most reads meet it before they reach one.
            self.metrics.read_error(tp.topic, cause)
            self._failures_log.log(kind, logging.WARNING, "remote log metadata of %s is not ready: "
                                   "REPLICA_NOT_AVAILABLE", tp)
            return ErrorCode.replica_not_available
        if cause is Cause.UNEXPECTED:
            self._failures_log.log(kind, logging.ERROR, "TIERED_STORAGE_NOT_AVAILABLE for %s: unexpected %s", tp,
                                   type(error).__name__, exc_info=error)
        else:
            self._failures_log.log(kind, logging.WARNING, "TIERED_STORAGE_NOT_AVAILABLE for %s (%s, %s): %s", tp,
                                   cause.value, type(error).__name__, error)
        self.metrics.tiered_storage_not_available(tp.topic, cause)
        return self.unavailable_code
