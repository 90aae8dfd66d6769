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

Across processes this reaches the processes the erasure asks: a second replica of a service that
the coordinator's call did not reach keeps its caches until their own bounds evict the entries.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clearable", "clear_all", "register", "track"]


class Clearable(Protocol):
    def clear(self) -> None: ...


_lock = threading.Lock()
_objects: weakref.WeakSet[Clearable] = weakref.WeakSet()
_functions: list[Callable[[], None]] = []


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
