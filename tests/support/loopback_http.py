"""The plumbing the scripted HTTP servers of the tests share (OpenAI-compatible, Confluence, the
Kubernetes API, the OTLP collector): a ``ThreadingHTTPServer`` on a free loopback port served from
a daemon thread, and a JSON answer written to a client that may have given up."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["LoopbackHTTP", "send_json"]


class LoopbackHTTP:
    """Base of a scripted server: ``serve_in_background`` from its ``start``; ``stop`` ends it."""

    _server: ThreadingHTTPServer | None = None

    def serve_in_background(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    payload: bytes,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> None:
    """``payload`` (JSON bytes, unless ``content_type`` says otherwise: a proxy's HTML page) as the
    answer, with ``headers``; a client that gave up (a scripted timeout) is no error."""
    try:
        handler.send_response(status)
        handler.send_header("content-type", content_type)
        for k, v in (headers or {}).items():
            handler.send_header(k, v)
        handler.send_header("content-length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass
