"""Concurrent callers' items run as one batch (the diary's WriteNote inserts, the index writes of
:class:`libs.common.vector_service.VectorRowWriter`): one statement and one commit for what waited,
instead of one a caller."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Item = TypeVar("Item")
R = TypeVar("R")


class Coalescer(Generic[Item, R]):
    """Concurrent callers' items run together: an item submitted while ``max_running`` batches are
    in flight waits and goes with every other item that waited, in one call of ``run`` (up to
    ``max_batch`` items); an item submitted when a slot is free runs at once (no waiting window).
    ``run`` answers every item in order, a result or the exception that item's caller gets; if it
    raises, every caller of the batch gets that exception. A batch runs in its own task: a caller
    that goes away (cancelled) does not take the others' items, nor its own, out of it."""

    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[Sequence[R | Exception]]],
        *,
        max_batch: int = 64,
        max_running: int = 1,
    ):
        self._run = run
        self._max_batch = max(1, max_batch)
        self._max_running = max(1, max_running)
        self._waiting: list[tuple[Item, asyncio.Future[R]]] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: Item) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._kick()
        return await future

    def _kick(self) -> None:
        while self._waiting and self._running < self._max_running:
            take, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._flush(take))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, take: list[tuple[Item, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in take])
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else RuntimeError(f"batch stopped: {exc!r}")
            for _, future in take:
                if not future.done():
                    future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(take, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        finally:
            self._running -= 1
            self._kick()
