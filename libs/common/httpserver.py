"""The HTTP server of the services that speak HTTP (the sessions API), in the same process and event
loop as the gRPC server: Starlette routes served by uvicorn.

``start_http(routes, host, port)`` binds first (port 0 picks a free one, so tests and a second
all-in-one never collide), then serves in a task of the running loop and returns an
:class:`HttpServer` naming the bound port; ``await server.stop()`` stops accepting, lets in-flight
requests finish within the grace period and closes. uvicorn's own signal handling is off: the
runner owns SIGTERM and drains gRPC and HTTP together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

__all__ = ["HttpServer", "bind_http", "build_app", "start_http"]

_log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The runner owns the process's signals; uvicorn must not install its own handlers.
        yield


@dataclass
class HttpServer:
    host: str
    port: int
    _server: _Server
    _task: asyncio.Task[None]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (at most ``grace_seconds``), close."""
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace_seconds)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:
            _log.exception("HTTP server stopped with an error")


def build_app(routes: Sequence[BaseRoute], middleware: Sequence[Middleware] = ()) -> Starlette:
    return Starlette(routes=list(routes), middleware=list(middleware))


def bind_http(host: str, port: int) -> socket.socket:
    """Bind and listen now (``./run up`` binds every port before it opens a store, so a taken port
    fails in a second). No SO_REUSEPORT: a second server on a taken port is refused, not given
    half the connections. Raises ``BindError``."""
    from libs.common.grpcserver import BindError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise BindError(f"cannot bind HTTP {host}:{port}: {err.strerror or err}") from None
    sock.setblocking(False)
    return sock


async def start_http(
    routes: Sequence[BaseRoute] | Any,
    host: str,
    port: int,
    *,
    middleware: Sequence[Middleware] = (),
    log_level: str = "warning",
    sock: socket.socket | None = None,
    tls: tuple[str, str] | None = None,
) -> HttpServer:
    """Serve ``routes`` (or a ready ASGI app) on ``host:port`` (or on ``sock``, bound earlier by
    :func:`bind_http`) inside the running loop. ``tls``: (certificate file, key file), the public
    gRPC port's own, so a bearer token or the inspector's sign-in never crosses in clear on the
    port beside a TLS one."""
    app = routes if callable(routes) and not isinstance(routes, (list, tuple)) else build_app(routes, middleware)
    sock = sock if sock is not None else bind_http(host, port)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="http-server")
    # Bound already (the socket listens); wait until uvicorn has started serving on it, or failed.
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        sock.close()
        task.result()  # raises what stopped it
        raise RuntimeError("the HTTP server stopped before it started")
    return HttpServer(host, sock.getsockname()[1], server, task)
