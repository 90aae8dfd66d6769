"""Scratch databases on the session's embedded PostgreSQL: created (empty or from a template) for a
test or a module, dropped with ``FORCE`` afterwards."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg

__all__ = ["admin_execute", "scratch_database", "with_db"]


def with_db(uri: str, name: str) -> str:
    """``uri`` pointed at database ``name``."""
    return re.sub(r"/[^/?]*\?", f"/{name}?", uri, count=1)


async def admin_execute(pg_uri: str, *statements: str) -> None:
    """Runs ``statements`` in order on a connection of their own (CREATE/DROP DATABASE)."""
    admin = await asyncpg.connect(pg_uri)
    try:
        for sql in statements:
            await admin.execute(sql)
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def scratch_database(pg_uri: str, prefix: str, template: str | None = None) -> AsyncIterator[str]:
    """A new database named ``<prefix>_<random>`` (a copy of ``template`` if given, else empty):
    its DSN, and the database dropped when the block ends."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await admin_execute(pg_uri, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield with_db(pg_uri, name)
    finally:
        await admin_execute(pg_uri, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
