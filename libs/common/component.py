"""What a service's bootstrap hands the runner: servicers to mount, HTTP routes to serve, passes to
tick, tasks to run."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.common.grpcserver import Registration
from libs.common.passrunner import PassSpec
from libs.common.vectorindex import IndexUnavailable, VectorIndex, collection_name

__all__ = ["Component", "prepare_collections"]

_log = logging.getLogger(__name__)


@dataclass
class Component:
    name: str
    registrations: list[Registration]
    service: Any = None
    """The service's use-case object (operators' tools and tests reach it here)."""
    passes: list[PassSpec] = field(default_factory=list)
    rebuild_index: Callable[[], Awaitable[int]] | None = None
    vector_collections: list[str] = field(default_factory=list)
    """The collection families (``collection_name`` bases) its rows are indexed in: a server opens
    them at start (``VectorIndex.prepare``), so its first turns do not wait for the index's files."""
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    """Long-running tasks started once the server serves (e.g. the reflector's workers)."""
    http_routes: list[Any] = field(default_factory=list)
    """Starlette routes the runner serves over HTTP (``libs.common.httpserver``) beside the gRPC
    server, on ``server.http_port``; a process none of whose components has any serves no HTTP."""
    http_open_paths: list[str] = field(default_factory=list)
    """Paths of those routes (exact, or a prefix ending in ``*``) that answer a request without a
    valid credential themselves (the inspector sends a browser to its sign-in page) instead of the
    authentication middleware's 401; they see it as ANONYMOUS and must refuse it everything else."""


async def prepare_collections(components: Sequence[Component], index: VectorIndex, dimensions: int | None) -> list[str]:
    """Open every collection ``components`` index their rows in, at start: a fresh embedded
    collection's files are made, or an existing one loaded, before the first turn rather than during
    it (the first writes of a new deployment waited 0.2-0.7 s for them; docs/benchmarks.md). An
    index that is down at start is logged and left to the first write, as any later write would be:
    the rows are in PostgreSQL either way and the fill pass indexes them. ``dimensions`` None (no
    embedder, or a remote one that has not said its width yet) opens nothing. Returns the names
    opened."""
    opened: list[str] = []
    if dimensions is None:
        return opened
    for name in sorted({collection_name(base, dimensions) for c in components for base in c.vector_collections}):
        try:
            await index.prepare(name, dimensions)
        except IndexUnavailable as exc:
            _log.warning("could not open the vector collection %s at start (%s); it opens on first use", name, exc)
            continue
        opened.append(name)
    return opened
