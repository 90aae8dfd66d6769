"""In-process caches that hold people's text, and the one call that empties them (issue 17).

A few caches keep what people said in memory to save work: the query-vector cache (the vector of
a query text, by model: an ask quoted whole), the prefetch's content words of a note's text. None
of them is a store an erasure can search, and an erased person's text must not outlive the erasure
in them. Each registers here (:func:`track` an object with ``clear()``, or :func:`register` a
function), and :func:`clear_all` empties every one of this process: every owner's ``EraseRows``
(``libs.common.erasure_rpcs``) calls it once its rows are erased, so every process that serves an
owner (one process for ``./run up``, each service's own in ``--split``) drops them. Emptying all,
not the person's entries: a cache keyed by a digest cannot tell whose text an entry was, and an
erasure is rare; the caches fill again from the erased stores.

Across processes: the coordinator's call reaches one replica of each service, so the process that
erased tells every other one through PostgreSQL (:func:`clear_everywhere`: it counts the erasure in
``text_cache_erasures`` and sends a ``NOTIFY`` on :data:`CHANNEL`), and every serving process
follows (:func:`follow`, started by the runner): it empties its own caches at the notice, and, as the
backstop for a notice it could not hear (a lost connection; PgBouncer in transaction mode carries
none), whenever the count has moved when it reads it (``privacy.cache_poll_seconds``). The owner's
``EraseRows`` fails (and the erasure job retries it) when the erasure cannot be counted, so no
erasure is reported done while a replica could miss it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncpg

__all__ = ["CHANNEL", "Clearable", "announce_through", "clear_all", "clear_everywhere", "follow", "register", "track"]

CHANNEL = "agentlearn_text_caches"
"""The LISTEN/NOTIFY channel on which an erasure tells every process to empty its caches."""
_ERASED = "erased"
"""The notice's payload."""


class Clearable(Protocol):
    def clear(self) -> None: ...


_log = logging.getLogger(__name__)
_lock = threading.Lock()
_objects: weakref.WeakSet[Clearable] = weakref.WeakSet()
_functions: list[Callable[[], None]] = []
_announce_pool: asyncpg.Pool | None = None


def track(cache: Clearable) -> None:
    """Empty ``cache`` with every erasure of this process, while it lives (held weakly)."""
    with _lock:
        _objects.add(cache)


def register(clear: Callable[[], None]) -> None:
    """Run ``clear`` (a module-level cache's, e.g. an ``lru_cache``'s ``cache_clear``) with every
    erasure of this process."""
    with _lock:
        _functions.append(clear)


def clear_all() -> int:
    """Empty every registered cache of this process; how many were emptied."""
    with _lock:
        objects, functions = list(_objects), list(_functions)
    for cache in objects:
        cache.clear()
    for clear in functions:
        clear()
    return len(objects) + len(functions)


def announce_through(pool: asyncpg.Pool | None) -> None:
    """Send this process's erasure notices through ``pool`` (the runner sets it once a serving
    process's database is open; None: this process tells no other, as in a unit test)."""
    global _announce_pool
    _announce_pool = pool


async def clear_everywhere() -> int:
    """Empty this process's caches and tell every other process to empty theirs; how many of this
    process's were emptied. Raises when the notice cannot be sent (the caller's erasure is then not
    done, and is retried)."""
    emptied = clear_all()
    pool = _announce_pool
    if pool is not None:
        await pool.execute(SQL_COUNT_ERASURE, CHANNEL, _ERASED)
    return emptied


SQL_COUNT_ERASURE = """
WITH counted AS (UPDATE text_cache_erasures SET generation = generation + 1 RETURNING generation)
SELECT pg_notify($1, $2) FROM counted
"""
SQL_ERASURES = "SELECT generation FROM text_cache_erasures"


async def follow(dsn: str, pool: asyncpg.Pool, poll_seconds: float) -> None:
    """Empty this process's caches at every erasure any process announces (heard on ``dsn``, a
    session-mode connection: ``database.listen_url``), after every (re)connect of that channel, and
    when the erasures' count read through ``pool`` every ``poll_seconds`` has moved; runs until
    cancelled."""
    from libs.common.jobs import listen

    async with asyncio.TaskGroup() as group:
        heard = "an erasure was announced, or the channel connected"
        group.create_task(listen(dsn, [_ERASED], lambda: _emptied(heard), channel=CHANNEL))
        group.create_task(_poll(pool, poll_seconds))


async def _poll(pool: asyncpg.Pool, poll_seconds: float) -> None:
    seen: int | None = None
    while True:
        try:
            generation = await pool.fetchval(SQL_ERASURES)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database is away: read again at the next turn
            _log.warning("erasures of cached text unreadable (%s); reading again in %ss", exc, poll_seconds)
        else:
            if seen is not None and generation != seen:
                _emptied("an erasure elsewhere was counted")
            seen = generation
        await asyncio.sleep(poll_seconds)


def _emptied(why: str) -> None:
    emptied = clear_all()
    _log.info("emptied %d caches of people's text (%s)", emptied, why)
