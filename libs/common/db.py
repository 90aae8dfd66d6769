"""PostgreSQL: the asyncpg pool (with the pgvector codec) and ordered, concurrent-safe migrations.

Each component owns a directory of ``NNNN_name.sql`` files. ``migrate`` applies the ones not yet
recorded in ``schema_migrations`` in order, under a transaction-level advisory lock, so two
processes starting at once apply each file exactly once (the second waits, then finds nothing to
do).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np
from opentelemetry import trace
from pgvector.asyncpg import register_vector

__all__ = ["COMMON_MIGRATIONS", "Migrations", "as_array", "connect_pool", "migrate", "pending_migrations"]

_log = logging.getLogger(__name__)
_LOCK_KEY = 0x61676C6E  # "agln": one advisory lock for every migration run
_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migrations:
    """A component's ordered migration files."""

    component: str
    directory: Path

    def files(self) -> list[tuple[int, Path]]:
        out = []
        for path in sorted(self.directory.iterdir()):
            m = _FILE.match(path.name)
            if m:
                out.append((int(m.group(1)), path))
        return out


COMMON_MIGRATIONS = Migrations("common", Path(__file__).parent / "migrations")


async def migrate(dsn: str, components: Sequence[Migrations]) -> list[str]:
    """Apply pending migrations of ``components`` (in the order given); returns what was applied."""
    applied: list[str] = []
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       component text NOT NULL,
                       version int NOT NULL,
                       name text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now(),
                       PRIMARY KEY (component, version))"""
            )
            for comp in components:
                done = {
                    r["version"]
                    for r in await conn.fetch(
                        "SELECT version FROM schema_migrations WHERE component = $1", comp.component
                    )
                }
                for version, path in comp.files():
                    if version in done:
                        continue
                    await conn.execute(path.read_text())
                    await conn.execute(
                        "INSERT INTO schema_migrations (component, version, name) VALUES ($1, $2, $3)",
                        comp.component,
                        version,
                        path.name,
                    )
                    applied.append(f"{comp.component}/{path.name}")
    finally:
        await conn.close()
    for name in applied:
        _log.info("applied migration %s", name)
    return applied


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


_VERB = re.compile(r"^\s*(?:WITH\b.*?\)\s*)?(INSERT|UPDATE|DELETE|SELECT|COPY)\b", re.I | re.S)
_TABLE = re.compile(r"\b(?:INTO|UPDATE|FROM)\s+([a-z_][a-z0-9_]*)", re.I)
_tracer = trace.get_tracer("agentlearn.db")


def _span_name(query: str) -> tuple[str, str, str]:
    verb = (_VERB.match(query) or [None, "SQL"])[1].upper()
    table = _TABLE.search(query)
    name = table.group(1) if table else ""
    return f"db {verb.lower()} {name}".strip(), verb, name


class TracedConnection(asyncpg.Connection):
    """Every statement is a span when a trace is recording, named and attributed by the database
    semantic conventions (``db.system.name``, ``db.operation.name``, ``db.collection.name``,
    ``db.query.text``): a turn's trace reaches every store write of every service. The pool's own
    reset statement, run each time a connection goes back to the pool, is not traced (it was a third
    of all spans and says nothing about the request). Nothing is created when tracing is off.

    The maintained ``opentelemetry-instrumentation-asyncpg`` was considered: its releases lag the
    instrumentation packages pinned here (0.66b1 against 0.66b2) and it cannot leave the reset
    statement out, so this small wrapper stays."""

    _untraced = False

    def _traced(self, query: str):  # type: ignore[no-untyped-def]
        if self._untraced or not trace.get_current_span().is_recording():
            return contextlib.nullcontext()
        name, verb, table = _span_name(query)
        attributes = {
            "db.system.name": "postgresql",
            "db.operation.name": verb,
            "db.query.text": query.strip()[:500],
        }
        if table:
            attributes["db.collection.name"] = table
        return _tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes)

    async def reset(self, *, timeout=None):  # type: ignore[no-untyped-def,override]
        self._untraced = True
        try:
            return await super().reset(timeout=timeout)
        finally:
            self._untraced = False

    async def execute(self, query: str, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        with self._traced(query):
            return await super().execute(query, *args, **kwargs)

    async def executemany(self, command: str, args, **kwargs):  # type: ignore[no-untyped-def,override]
        with self._traced(command):
            return await super().executemany(command, args, **kwargs)

    async def fetch(self, query: str, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        with self._traced(query):
            return await super().fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        with self._traced(query):
            return await super().fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        with self._traced(query):
            return await super().fetchval(query, *args, **kwargs)


async def pending_migrations(
    dsn: str, components: Sequence[Migrations], *, statement_cache_size: int = 100
) -> list[str]:
    """The migration files of ``components`` not yet applied (read-only: no DDL right needed)."""
    conn = await asyncpg.connect(dsn, statement_cache_size=statement_cache_size)
    try:
        exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        done: set[tuple[str, int]] = set()
        if exists:
            done = {(r["component"], r["version"]) for r in await conn.fetch(SQL_APPLIED)}
    finally:
        await conn.close()
    return [
        f"{comp.component}/{path.name}"
        for comp in components
        for version, path in comp.files()
        if (comp.component, version) not in done
    ]


SQL_APPLIED = "SELECT component, version FROM schema_migrations"


async def connect_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, statement_cache_size: int = 100
) -> asyncpg.Pool:
    """A pool whose connections speak pgvector and trace their statements; run :func:`migrate`
    first (it creates the type). ``statement_cache_size=0`` for PgBouncer in transaction mode."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        connection_class=TracedConnection,
        statement_cache_size=statement_cache_size,
    )
    assert pool is not None
    return pool


def as_array(value: object) -> np.ndarray:
    """A pgvector column value as a float32 array."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()  # type: ignore[union-attr]
    return np.asarray(value, dtype=np.float32)
