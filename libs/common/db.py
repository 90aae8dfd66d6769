"""PostgreSQL: the asyncpg pool (with the pgvector codec) and ordered, concurrent-safe migrations.

Each component owns a directory of ``NNNN_name.sql`` files. ``migrate`` applies the ones not yet
recorded in ``schema_migrations`` in order, under a session-level advisory lock, so two processes
starting at once apply each file exactly once (the second waits, then finds nothing to do).

Each file is its own transaction (it and its ledger row commit together, or neither does), so the
locks a file takes end with it: one run over every component's files in a single transaction kept
an early file's ACCESS EXCLUSIVE locks until the last file, and a later file waiting behind any open
reader of its table stalled every reader of the earlier tables meanwhile. A file waits at most
``MIGRATION_LOCK_TIMEOUT_S`` for its locks (a queued ACCESS EXCLUSIVE request blocks the table's new
readers too), then rolls back, logs who holds locks, and tries again, ``MIGRATION_LOCK_ATTEMPTS``
times in all before :class:`MigrationBlocked`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from pgvector.asyncpg import register_vector

__all__ = [
    "COMMON_MIGRATIONS",
    "MigrationBlocked",
    "Migrations",
    "PooledStore",
    "as_array",
    "configure_pool_reset",
    "configure_sql_spans",
    "connect_pool",
    "migrate",
    "pending_migrations",
    "refused_by_server",
    "unflushed",
]

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

SQL_MIGRATION_LOCK = "SELECT pg_advisory_lock($1)"
SQL_MIGRATION_TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
SQL_MIGRATION_UNLOCK = "SELECT pg_advisory_unlock($1)"
# applied_at keeps its database default: the migration ledger is the one table written outside the
# injected clock (it runs before any service, and its time is only read by operators).
SQL_MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS schema_migrations (
    component text NOT NULL,
    version int NOT NULL,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version))"""
SQL_APPLIED_OF = "SELECT version FROM schema_migrations WHERE component = $1"
SQL_RECORD_MIGRATION = "INSERT INTO schema_migrations (component, version, name) VALUES ($1, $2, $3)"
SQL_MIGRATIONS_EXIST = "SELECT to_regclass('schema_migrations') IS NOT NULL"
# Who holds table locks in this database now, other than the migrator: what a file that timed out
# waiting for its locks was most likely waiting for (its own wait ended with its rollback).
SQL_LOCK_HOLDERS = """SELECT a.pid, a.state, a.xact_start, left(a.query, 120) AS query,
       string_agg(DISTINCT c.relname, ',' ORDER BY c.relname) AS tables
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.pid <> pg_backend_pid()
 GROUP BY a.pid, a.state, a.xact_start, a.query
 ORDER BY a.xact_start NULLS LAST
 LIMIT 5"""

MIGRATION_LOCK_TIMEOUT_S = 5.0
"""How long one file waits for its table locks before it rolls back and tries again."""
MIGRATION_LOCK_ATTEMPTS = 60
"""Tries per file before :class:`MigrationBlocked` (about six minutes with the pause)."""
MIGRATION_RETRY_PAUSE_S = 1.0


class MigrationBlocked(RuntimeError):
    """A migration file could not take its locks in ``MIGRATION_LOCK_ATTEMPTS`` tries: one line
    naming the file and the sessions holding locks. The files before it are applied (each is its
    own transaction); the next run starts again at this one."""


async def _lock_holders(conn: asyncpg.Connection) -> str:
    rows = await conn.fetch(SQL_LOCK_HOLDERS)
    return (
        "; ".join(
            f"pid {r['pid']} ({r['state']}, transaction since "
            f"{r['xact_start'].isoformat(timespec='seconds') if r['xact_start'] else '-'}) "
            f"on {r['tables']}: {' '.join(str(r['query']).split())!r}"
            for r in rows
        )
        or "no session holds a table lock now"
    )


async def _apply(conn: asyncpg.Connection, component: str, version: int, file: str, sql: str) -> None:
    """One file and its ledger row in one transaction, retried while its locks are held elsewhere."""
    name = f"{component}/{file}"
    timeout_ms = max(1, int(MIGRATION_LOCK_TIMEOUT_S * 1000))
    for attempt in range(1, MIGRATION_LOCK_ATTEMPTS + 1):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {timeout_ms}")
                await conn.execute(sql)
                await conn.execute(SQL_RECORD_MIGRATION, component, version, file)
            return
        except asyncpg.LockNotAvailableError:
            holders = await _lock_holders(conn)
            if attempt == MIGRATION_LOCK_ATTEMPTS:
                raise MigrationBlocked(
                    f"migration {name} could not take its locks in {attempt} tries of "
                    f"{MIGRATION_LOCK_TIMEOUT_S:g} s (sessions holding table locks: {holders}); "
                    "the migrations before it are applied, run ./run migrate again once those end"
                ) from None
            _log.warning(
                "migration %s waited %g s for its locks (try %d of %d); sessions holding table locks: %s",
                name,
                MIGRATION_LOCK_TIMEOUT_S,
                attempt,
                MIGRATION_LOCK_ATTEMPTS,
                holders,
            )
            await asyncio.sleep(MIGRATION_RETRY_PAUSE_S)


async def migrate(dsn: str, components: Sequence[Migrations]) -> list[str]:
    """Apply pending migrations of ``components`` (in the order given), each file in its own
    transaction; returns what was applied. Raises :class:`MigrationBlocked` when a file cannot take
    its locks (the ones before it stay applied)."""
    applied: list[str] = []
    conn = await asyncpg.connect(dsn)
    try:
        # Session-level: it spans the files' transactions. A migrator that dies releases it with
        # its connection.
        if not await conn.fetchval(SQL_MIGRATION_TRY_LOCK, _LOCK_KEY):
            _log.info("waiting for another ./run migrate (or a starting process) to finish migrating")
            await conn.execute(SQL_MIGRATION_LOCK, _LOCK_KEY)
        try:
            await conn.execute(SQL_MIGRATIONS_TABLE)
            for comp in components:
                done = {r["version"] for r in await conn.fetch(SQL_APPLIED_OF, comp.component)}
                for version, path in comp.files():
                    if version in done:
                        continue
                    await _apply(conn, comp.component, version, path.name, path.read_text())
                    applied.append(f"{comp.component}/{path.name}")
                    _log.info("applied migration %s/%s", comp.component, path.name)
        finally:
            if not conn.is_closed():
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await conn.execute(SQL_MIGRATION_UNLOCK, _LOCK_KEY)
    finally:
        await conn.close()
    return applied


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


# A transaction's own statements are named too (``db begin``, ``db commit``): an ``unflushed`` write
# and asyncpg's transactions show where their round trips go.
_VERB = re.compile(r"\s*(INSERT|UPDATE|DELETE|SELECT|COPY|BEGIN|COMMIT|ROLLBACK)\b", re.I)
_WITH = re.compile(r"^\s*WITH\b", re.I)
_TABLE = re.compile(r"\b(?:INTO|UPDATE|FROM)\s+([a-z_][a-z0-9_]*)", re.I)
_tracer = trace.get_tracer("agentlearn.db")


def _main_statement(query: str) -> int:
    """Where the main statement of ``query`` begins: past its common table expressions (each a
    parenthesised body, comma-separated), or 0. A statement is named by its main statement (the
    CTEs' own work is in ``db.query.text``)."""
    with_ = _WITH.match(query)
    if with_ is None:
        return 0
    depth = 0
    for i in range(with_.end(), len(query)):
        c = query[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                rest = query[i + 1 :].lstrip()
                if not rest.startswith(",") and not rest[:2].upper() == "AS":  # not a column list
                    return len(query) - len(rest)
    return 0


_WRITING_CTE = re.compile(r"\bAS\s*\(\s*(INSERT|UPDATE|DELETE)\b", re.I)


def _span_name(query: str) -> tuple[str, str, str]:
    start = _main_statement(query)
    found = _VERB.match(query, start)
    verb = found.group(1).upper() if found else "SQL"
    if start and verb == "SELECT":
        # A SELECT over data-modifying CTEs (a write that returns what it wrote) is named by the
        # write it reads back (``SELECT … FROM ins``: the note it stored, not the key it claimed on
        # the way), else by its first write: the span says which table the statement changed.
        read = _TABLE.search(query, start)
        writing = None
        if read is not None:
            own = re.compile(rf"\b{re.escape(read.group(1))}\s+AS\s*\(\s*(INSERT|UPDATE|DELETE)\b", re.I)
            writing = own.search(query, 0, start)
        writing = writing or _WRITING_CTE.search(query, 0, start)
        if writing is not None:
            verb, start = writing.group(1).upper(), writing.start(1)
    table = _TABLE.search(query, start)
    name = table.group(1) if table else ""
    return f"db {verb.lower()} {name}".strip(), verb, name


SQL_SPAN_MODES = ("off", "slow", "all")
_sql_spans = "slow"
_slow_ns = 50_000_000
_UNTRACED = contextlib.nullcontext()


def configure_sql_spans(mode: str, slow_ms: float = 50.0) -> None:
    """Which statements are spans (``telemetry.sql_spans``): ``all``, only those slower than
    ``slow_ms`` (``slow``, the default), or none (``off``)."""
    global _sql_spans, _slow_ns
    if mode not in SQL_SPAN_MODES:
        raise ValueError(f"sql_spans must be one of {', '.join(SQL_SPAN_MODES)}, not {mode!r}")
    _sql_spans = mode
    _slow_ns = int(slow_ms * 1_000_000)


_reset_always = False


def configure_pool_reset(always: bool) -> None:
    """``True``: send asyncpg's reset statement on every release, as asyncpg does by default (an A/B
    of ``bench/prefetch.py --ab poolreset``); ``False`` (the default): only after a statement that
    may have left session state (:meth:`TracedConnection.get_reset_query`)."""
    global _reset_always
    _reset_always = always


def _attributes(query: str) -> tuple[str, dict[str, AttributeValue]]:
    name, verb, table = _span_name(query)
    attributes: dict[str, AttributeValue] = {
        "db.system.name": "postgresql",
        "db.operation.name": verb,
        "db.query.text": query.strip()[:500],
    }
    if table:
        attributes["db.collection.name"] = table
    return name, attributes


class _SlowSpan:
    """Times a statement and records it as a span (with its real start and end) only when it took
    longer than the threshold: a fast statement costs a clock read, not a span."""

    __slots__ = ("_query", "_start")

    def __init__(self, query: str):
        self._query = query
        self._start = 0

    def __enter__(self) -> None:
        self._start = time.time_ns()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        end = time.time_ns()
        if end - self._start < _slow_ns:
            return
        name, attributes = _attributes(self._query)
        attributes["agentlearn.db.slow"] = True
        span = _tracer.start_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes, start_time=self._start)
        if exc is not None:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        span.end(end_time=end)


_SESSION_STATE = re.compile(
    r"\bpg_(?:try_)?advisory_lock(?:_shared)?\b|\bset_config\b"
    r"|(?:^|;)\s*(?:SET(?!\s+LOCAL\b)|RESET|LISTEN|DECLARE|CREATE\s+TEMP)",
    re.IGNORECASE,
)
_SESSION_CACHE: dict[str, bool] = {}


def _changes_session(query: str) -> bool:
    """Whether ``query`` may leave state in the session past its statement: a session advisory
    lock, a setting, a LISTEN, a cursor, a temporary table. Conservative (``set_config`` counts
    whatever its third argument); a ``SET LOCAL`` does not, as it ends with its transaction, which
    asyncpg rolls back on release if it is still open. Remembered per query text, which is a
    handful of named statements."""
    found = _SESSION_CACHE.get(query)
    if found is None:
        found = bool(_SESSION_STATE.search(query))
        if len(_SESSION_CACHE) < 4096:
            _SESSION_CACHE[query] = found
    return found


class TracedConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped here (pyproject), so its Connection is Any
    """A statement is a span when a trace is recording and ``telemetry.sql_spans`` asks for it —
    by default only a statement slower than ``telemetry.sql_span_slow_ms``; ``all`` spans every
    statement (a turn start's trace then reaches every store write of every service: 24 spans a
    turn start, about a twentieth of its CPU) — named and attributed by the database semantic
    conventions (``db.system.name``, ``db.operation.name``, ``db.collection.name``,
    ``db.query.text``). The pool's own reset statement, run each time a connection goes back to the
    pool, is never traced (it says nothing about the request). Nothing is created when tracing is
    off.

    The maintained ``opentelemetry-instrumentation-asyncpg`` was considered: its releases lag the
    instrumentation packages pinned here (0.66b1 against 0.66b2) and it cannot leave the reset
    statement out, so this small wrapper stays."""

    _untraced = False
    _session_changed = False

    def get_reset_query(self) -> str:
        """The reset statement only after a statement that may have left session state behind
        (:func:`_changes_session`); otherwise none. asyncpg sends it on EVERY release to the pool,
        and the caller awaits it: a second round trip after each ``pool.fetch``, about as much of a
        recall's socket time as its own statements (docs/perf/after.md, wip/perfread). An open
        transaction is still rolled back on release either way (asyncpg does that apart)."""
        if not (self._session_changed or _reset_always):
            return ""
        self._session_changed = False
        query: str = super().get_reset_query()
        return query

    def _traced(self, query: str) -> contextlib.AbstractContextManager[object]:
        if not (self._untraced or self._session_changed) and _changes_session(query):  # not the reset itself
            self._session_changed = True
        if self._untraced or _sql_spans == "off" or not trace.get_current_span().is_recording():
            return _UNTRACED
        if _sql_spans == "slow":
            return _SlowSpan(query)
        name, attributes = _attributes(query)
        return _tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes)

    async def reset(self, *, timeout: float | None = None) -> Any:
        self._untraced = True
        try:
            return await super().reset(timeout=timeout)
        finally:
            self._untraced = False

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._traced(query):
            return await super().execute(query, *args, **kwargs)

    async def executemany(self, command: str, args: Any, **kwargs: Any) -> Any:
        with self._traced(command):
            return await super().executemany(command, args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._traced(query):
            return await super().fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._traced(query):
            return await super().fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        with self._traced(query):
            return await super().fetchval(query, *args, **kwargs)


@contextlib.asynccontextmanager
async def unflushed(pool: asyncpg.Pool, timeout: float | None = None) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection in a transaction whose COMMIT does not wait for the WAL to reach the disk
    (``SET LOCAL synchronous_commit = off``: this transaction only, PgBouncer-safe). For the records
    a turn start keeps of what it served (the run's claim, the frozen context and its bookkeeping,
    note uses — best-effort or a cache by the spec): the write is visible at once and ordered as
    any other, so it is durable as soon as any later commit is flushed, and lost only if PostgreSQL
    itself stops within the WAL writer's next flush (``wal_writer_delay``, 200 ms by default) —
    never when our process is killed. What it buys: the disk's flush latency, whose half-second
    freezes were a turn start's p99 on this machine (docs/benchmarks.md, wave 13), is off the path.
    Two round trips more than an autocommitted statement (the BEGIN and the COMMIT). ``timeout``
    bounds the wait for a connection and each of those two statements, as asyncpg's own does."""
    async with pool.acquire(timeout=timeout) as conn:
        await conn.execute("BEGIN; SET LOCAL synchronous_commit = off", timeout=timeout)
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(Exception):  # a broken connection: asyncpg discards it on release
                await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT", timeout=timeout)


async def pending_migrations(
    dsn: str, components: Sequence[Migrations], *, statement_cache_size: int = 100
) -> list[str]:
    """The migration files of ``components`` not yet applied (read-only: no DDL right needed)."""
    conn = await asyncpg.connect(dsn, statement_cache_size=statement_cache_size)
    try:
        exists = await conn.fetchval(SQL_MIGRATIONS_EXIST)
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
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


class PooledStore:
    """A store on the pool whose multi-statement writes share one transaction: ``transaction()``
    yields a pooled connection inside it, the handle the caller passes to the store and to the
    queue alike (a row and its job commit together)."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """One transaction on a pooled connection: every write made through it commits together."""
        async with self.pool.acquire() as conn, conn.transaction():
            yield conn


def refused_by_server(err: BaseException) -> bool:
    """PostgreSQL answered the statement with an error: it rolled back, nothing of it was written.
    A statement timeout or a cancel too (the statement was rolled back). Not a lost connection, nor
    an operator's shutdown or termination of the backend, nor a cancelled caller: those may come
    after the server committed, so their outcome is unknown."""
    if isinstance(err, asyncpg.exceptions.QueryCanceledError):
        # A statement timeout or a cancel: PostgreSQL reports one only for a statement it rolled
        # back (a commit under way is not interrupted).
        return True
    return isinstance(err, asyncpg.PostgresError) and not isinstance(
        err, asyncpg.PostgresConnectionError | asyncpg.exceptions.OperatorInterventionError
    )
