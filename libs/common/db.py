"""PostgreSQL: the asyncpg pool (with the pgvector codec) and ordered, concurrent-safe migrations.

Each component owns a directory of ``NNNN_name.sql`` files. ``migrate`` applies the ones not yet
recorded in ``schema_migrations`` in order, under a transaction-level advisory lock, so two
processes starting at once apply each file exactly once (the second waits, then finds nothing to
do).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

__all__ = ["COMMON_MIGRATIONS", "Migrations", "as_array", "connect_pool", "migrate"]

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


async def connect_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections speak pgvector; run :func:`migrate` first (it creates the type)."""
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection)
    assert pool is not None
    return pool


def as_array(value: object) -> np.ndarray:
    """A pgvector column value as a float32 array."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()  # type: ignore[union-attr]
    return np.asarray(value, dtype=np.float32)
