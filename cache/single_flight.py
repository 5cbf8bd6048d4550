"""One load per key under concurrency.

Callers that miss a cache for the same key at once share one load: the first
starts it as a task, the others await that task. The load runs in its own task,
so a caller that gives up (cancelled, timed out) neither cancels the load for the
others nor leaves it half done; the load finishes and fills the cache. A failed
load is not remembered: every waiter gets its error, the next caller starts anew.

No lock is taken: the event loop runs one callback at a time, and the loaders
store their result in the cache before their task ends, so a key is always either
cached, in flight, or neither.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def in_flight(self, key: K) -> bool:
        task = self._tasks.get(key)
        return task is not None and not task.done()

    def start(self, key: K, load: Callable[[], Coroutine[Any, Any, V]]) -> asyncio.Task[V]:
        """The task loading `key`: the one in flight, else a new one running `load()`."""
        task = self._tasks.get(key)
        # A task that ended is past its cache insert (or failed): never reuse its outcome.
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(load())
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        return task

    async def run(self, key: K, load: Callable[[], Coroutine[Any, Any, V]]) -> V:
        """Await the load of `key`; cancelling the caller does not cancel the load."""
        return await asyncio.shield(self.start(key, load))

    def _forget(self, key: K, task: asyncio.Task[V]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # retrieved: a load nobody awaited any more is not an error to report

    async def close(self) -> None:
        """Cancel every load in flight and wait for them to end."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
