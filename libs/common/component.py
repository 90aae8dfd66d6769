"""What a service's bootstrap hands the runner: servicers to mount, HTTP routes to serve, passes to
tick, tasks to run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from libs.common.grpcserver import Registration
from libs.common.passrunner import PassSpec

__all__ = ["Component"]


@dataclass
class Component:
    name: str
    registrations: list[Registration]
    service: Any = None
    """The service's use-case object (operators' tools and tests reach it here)."""
    passes: list[PassSpec] = field(default_factory=list)
    rebuild_index: Callable[[], Awaitable[int]] | None = None
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    """Long-running tasks started once the server serves (e.g. the reflector's workers)."""
    http_routes: list[Any] = field(default_factory=list)
    """Starlette routes the runner serves over HTTP (``libs.common.httpserver``) beside the gRPC
    server, on ``server.http_port``; a process none of whose components has any serves no HTTP."""
    http_open_paths: list[str] = field(default_factory=list)
    """Paths of those routes (exact, or a prefix ending in ``*``) that answer a request without a
    valid credential themselves (the inspector sends a browser to its sign-in page) instead of the
    authentication middleware's 401; they see it as ANONYMOUS and must refuse it everything else."""
