"""What every owner of rows shares to erase its own (issue 17): the erasure target, the report of
what one owner erased, matching a person's identifiers and names in text, running an owner's
erasure once per erasure id, and removing the erased rows' vectors from the index.

Each service owns its tables, so each erases its own rows, in its own transaction, through its own
``EraseRows`` RPC; the privacy service (``services/privacy``) coordinates. An owner's erasure is
recorded in the owner's own ``<owner>_erasures`` table in the same transaction as the deletes: a
repeat of the same erasure (a retry, a resume after SIGKILL) returns the recorded report, so the
receipt is the same however many times it ran. Index points are removed after the commit and again
on every repeat (a delete of a missing point is a no-op); the orphan sweep removes what an index
that was down kept.

A person is matched by their identifiers (handle, external id) and the names the request gives, as
whole words, case-insensitively: "Ana" matches "ask Ana." but not "banana" (an identifier of one
character is matched in structured columns only: ``MIN_TEXT_TERM``). Identifiers are compared
the way their owners file them: a platform case-insensitively everywhere (the profiles store it
lowercased, the reflector keeps the engine's spelling: :func:`platform_key` on both sides), a handle
or an external id exactly (no owner folds their case: "Carla" and "carla" are two profiles). A
handle and an external id recorded together for one sender are one person: the coordinator's
collection pass finds the ones the request did not name (``Target.aliases``) and every owner
matches them as its own.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import asyncpg
from google.protobuf.json_format import MessageToJson, ParseDict

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.embeddings import Embedder
from libs.common.errors import InvalidArgument
from libs.common.not_found import require_found
from libs.common.vectorindex import IndexUnavailable, VectorIndex, collection_name

__all__ = [
    "ERASE_ROUNDS",
    "IDS_KEPT",
    "INDEX_PREFIX",
    "MIN_TEXT_TERM",
    "PENDING_CHECK",
    "Kind",
    "Report",
    "TableReport",
    "Target",
    "delete_indexed",
    "delete_keyed",
    "delete_scope",
    "drop_points",
    "platform_key",
    "provenance_from_json",
    "provenance_json",
    "provenance_row",
    "provenance_subjects",
    "prune_indexed",
    "report_to_proto",
    "retention_cutoffs",
    "round_id",
    "run_once",
    "scope_rows",
    "sweep_orphans",
    "target_from_proto",
    "verify_index",
]

INDEX_PREFIX = "index:"
"""A ``FindRows`` report's table ``index:<collection>``: points of the index that the verification
found for the erasure (an erased row's point, or a near match whose row names the person)."""

_log = logging.getLogger(__name__)

IDS_KEPT = 5000
"""At most this many ids per table in a report (counts are always whole)."""

ERASE_ROUNDS = 3
"""Erase rounds of one erasure at most: a verification that finds rows written after the erase step
(a reflection of the person that was running when it started) erases again, under
``round_id(erasure_id, n)``."""

INDEX_NEAR = 10
"""Nearest points the verification reads back for each of a person's names, per seat and index."""

PENDING_CHECK = "pending:"
"""A ``FindRows`` report's table named ``pending:<check>`` (count 0) is a verification check the
owner could not run (e.g. ``pending:index:diary_notes_384``: that vector index was down): the
erasure is not verified until it runs. A table ``index:<collection>`` names points found there."""


MIN_TEXT_TERM = 2
"""The shortest identifier matched as a word in text (``Target.terms``). The contract takes any
sender a turn carries (``ErasureSubject``: a one-letter handle included), so this protection lives
in the matcher, not in what a caller may name."""


class Kind(StrEnum):
    SUBJECT = "subject"
    SEAT = "seat"
    COMPANY = "company"


_KIND_OF_PROTO = {
    erasure_pb2.ERASURE_KIND_SUBJECT: Kind.SUBJECT,
    erasure_pb2.ERASURE_KIND_SEAT: Kind.SEAT,
    erasure_pb2.ERASURE_KIND_COMPANY: Kind.COMPANY,
}
PROTO_OF_KIND = {v: k for k, v in _KIND_OF_PROTO.items()}


def _are_escape(term: str) -> str:
    """A literal for a PostgreSQL ARE: a backslash before a non-alphanumeric character is that
    character, so every one is escaped."""
    return "".join(c if c.isalnum() else "\\" + c for c in term)


def platform_key(platform: str) -> str:
    """A platform as an erasure compares it: stripped and casefolded. The profiles file a platform
    lowercased (their names are ASCII, so ``lower`` there is this), while a turn's senders keep the
    engine's spelling ("Slack"): both sides are compared through this, never as given."""
    return platform.strip().casefold()


@dataclass(frozen=True)
class Target:
    erasure_id: uuid.UUID
    company: str
    kind: Kind
    seat: str = ""
    handle: str = ""
    external_id: str = ""
    platform: str = ""
    names: tuple[str, ...] = ()
    turn_ids: tuple[str, ...] = ()
    session_ids: tuple[str, ...] = ()
    page_ids: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    """The person's other identifiers, found by the collection pass recorded together with the
    handle or external id the request named (a sender's handle beside its external id on the
    platform): the same person, matched as ``handle`` and ``external_id`` are."""

    def __post_init__(self) -> None:
        # Normalised once, wherever the target is built (the request, an owner's RPC, the stored
        # erasure): every owner then compares ``platform`` as ``platform_key`` of its own column.
        object.__setattr__(self, "platform", platform_key(self.platform))

    @property
    def identifiers(self) -> list[str]:
        """The person's handle, external id and aliases (what structured columns hold): every one
        of them is this person, never another one."""
        return list(dict.fromkeys(x for x in (self.handle, self.external_id, *self.aliases) if x))

    @property
    def terms(self) -> list[str]:
        """Every string that names the person in text, longest first (so the longest matches). An
        identifier shorter than :data:`MIN_TEXT_TERM` characters is not one: a one-letter GitHub
        login "q" is her handle in the structured columns (``identifiers``), but as a word it is in
        any text saying "option q", and would erase rows that never named her."""
        seen = {t.casefold(): t for t in [*self.identifiers, *self.names] if len(t.strip()) >= MIN_TEXT_TERM}
        return sorted(seen.values(), key=len, reverse=True)

    def sql_pattern(self) -> str:
        """A case-insensitive (``~*``) PostgreSQL pattern matching any term as a whole word; one
        that matches nothing when there are no terms."""
        terms = self.terms
        if not terms:
            return "a^"  # never matches: "^" is an anchor anywhere in an ARE
        alternatives = "|".join(_are_escape(t) for t in terms)
        return f"(^|[^[:alnum:]_])({alternatives})($|[^[:alnum:]_])"

    def regex(self) -> re.Pattern[str]:
        """The same match in Python (payloads that are not text columns)."""
        terms = self.terms
        if not terms:
            return re.compile(r"(?!)")
        return re.compile(r"(?<![\w])(" + "|".join(re.escape(t) for t in terms) + r")(?![\w])", re.IGNORECASE)

    def names_text(self, *texts: str | None) -> bool:
        rx = self.regex()
        return any(t and rx.search(t) for t in texts)


@dataclass
class TableReport:
    table: str
    count: int = 0
    ids: list[str] = field(default_factory=list)
    changed: int = 0


@dataclass
class Report:
    owner: str
    tables: dict[str, TableReport] = field(default_factory=dict)
    turn_ids: set[str] = field(default_factory=set)
    session_ids: set[str] = field(default_factory=set)
    page_ids: set[str] = field(default_factory=set)
    points: dict[str, list[str]] = field(default_factory=dict)
    """Vector points to remove, by collection (kept in the owner's record so a repeat removes them
    again)."""
    index_points_pending: int = 0
    aliases: set[str] = field(default_factory=set)
    """Identifiers of the person this owner keeps recorded with one the target names (collection
    pass). Answered over the RPC only: never in ``to_json`` (the owner's record, the audit's
    receipt and residues name no person)."""

    def add(self, table: str, ids: Iterable[object], *, changed: bool = False) -> None:
        named = [str(i) for i in ids]
        entry = self.tables.setdefault(table, TableReport(table))
        if changed:
            entry.changed += len(named)
        else:
            entry.count += len(named)
        room = IDS_KEPT - len(entry.ids)
        entry.ids.extend(named[: max(0, room)])

    def add_points(self, base: str, rows: Iterable[tuple[object, int | None]]) -> None:
        """Rows that had vectors (id, width): their points leave ``<base>_<width>``."""
        for row_id, dims in rows:
            if dims:
                self.points.setdefault(collection_name(base, int(dims)), []).append(str(row_id))

    @property
    def total(self) -> int:
        return sum(t.count + t.changed for t in self.tables.values())

    def merge(self, other: Report) -> None:
        """Fold a later round's report of the same owner into this one (the receipt is one report
        per owner, whatever number of rounds the erasure took)."""
        for table, entry in other.tables.items():
            mine = self.tables.setdefault(table, TableReport(table))
            mine.count += entry.count
            mine.changed += entry.changed
            room = IDS_KEPT - len(mine.ids)
            mine.ids.extend([i for i in entry.ids if i not in mine.ids][: max(0, room)])
        self.turn_ids |= other.turn_ids
        self.session_ids |= other.session_ids
        self.page_ids |= other.page_ids
        for collection, ids in other.points.items():
            self.points.setdefault(collection, []).extend(ids)
        self.index_points_pending += other.index_points_pending

    def to_json(self) -> str:
        return json.dumps(
            {
                "owner": self.owner,
                "tables": [vars(t) for t in self.tables.values()],
                "turn_ids": sorted(self.turn_ids),
                "session_ids": sorted(self.session_ids),
                "page_ids": sorted(self.page_ids),
                "points": self.points,
                "index_points_pending": self.index_points_pending,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        data = json.loads(text)
        return cls(
            owner=data["owner"],
            tables={t["table"]: TableReport(**t) for t in data["tables"]},
            turn_ids=set(data["turn_ids"]),
            session_ids=set(data["session_ids"]),
            page_ids=set(data["page_ids"]),
            points={k: list(v) for k, v in data["points"].items()},
            index_points_pending=int(data.get("index_points_pending", 0)),
        )


def target_from_proto(msg: erasure_pb2.ErasureTarget, *, domain: str) -> Target:
    """The target an owner is asked about; refuses a target that names nobody (an erasure never
    means "everything" by omission)."""
    kind = _KIND_OF_PROTO.get(msg.kind)
    if kind is None:
        raise InvalidArgument("target.kind is required", reason="FIELD_REQUIRED", domain=domain, field="target.kind")
    subject = msg.subject
    if kind is Kind.SUBJECT and not (subject.handle or subject.external_id):
        raise InvalidArgument(
            "a subject erasure names the person's handle or external id",
            reason="SUBJECT_REQUIRED",
            domain=domain,
            field="target.subject",
        )
    if kind is Kind.SEAT and not msg.seat:
        raise InvalidArgument(
            "a seat erasure names the seat", reason="FIELD_REQUIRED", domain=domain, field="target.seat"
        )
    return Target(
        erasure_id=uuid.UUID(msg.erasure_id),
        company=msg.company,
        kind=kind,
        seat=msg.seat if kind is Kind.SEAT else "",
        handle=subject.handle,
        external_id=subject.external_id,
        platform=subject.platform,
        names=tuple(msg.names),
        turn_ids=tuple(dict.fromkeys(msg.turn_ids)),
        session_ids=tuple(dict.fromkeys(msg.session_ids)),
        page_ids=tuple(dict.fromkeys(msg.page_ids)),
        aliases=tuple(dict.fromkeys(msg.aliases)) if kind is Kind.SUBJECT else (),
    )


def target_to_proto(target: Target) -> erasure_pb2.ErasureTarget:
    return erasure_pb2.ErasureTarget(
        erasure_id=str(target.erasure_id),
        company=target.company,
        kind=PROTO_OF_KIND[target.kind],
        seat=target.seat,
        subject=erasure_pb2.ErasureSubject(
            handle=target.handle, external_id=target.external_id, platform=target.platform
        ),
        names=list(target.names),
        turn_ids=list(target.turn_ids),
        session_ids=list(target.session_ids),
        page_ids=list(target.page_ids),
        aliases=list(target.aliases),
    )


def report_to_proto(report: Report) -> erasure_pb2.ErasureReport:
    return erasure_pb2.ErasureReport(
        owner=report.owner,
        tables=[
            erasure_pb2.ErasedRows(table=t.table, count=t.count, ids=t.ids, changed=t.changed)
            for t in sorted(report.tables.values(), key=lambda t: t.table)
        ],
        turn_ids=sorted(report.turn_ids),
        session_ids=sorted(report.session_ids),
        page_ids=sorted(report.page_ids),
        index_points_pending=report.index_points_pending,
        aliases=sorted(report.aliases),
    )


def report_from_proto(msg: erasure_pb2.ErasureReport) -> Report:
    return Report(
        owner=msg.owner,
        tables={t.table: TableReport(t.table, t.count, list(t.ids), t.changed) for t in msg.tables},
        turn_ids=set(msg.turn_ids),
        session_ids=set(msg.session_ids),
        page_ids=set(msg.page_ids),
        index_points_pending=msg.index_points_pending,
        aliases=set(msg.aliases),
    )


async def drop_points(index: VectorIndex | None, points: dict[str, list[str]]) -> int:
    """Remove the points; how many could not be removed (the index was down). A missing point is
    no error, so this runs again on every repeat."""
    pending = 0
    if index is None:
        return 0
    for collection, ids in points.items():
        try:
            await index.delete(collection, [uuid.UUID(i) for i in ids])
        except IndexUnavailable as err:
            pending += len(ids)
            _log.warning("%d erased rows keep points in %s until the orphan sweep: %s", len(ids), collection, err)
    return pending


def round_id(erasure_id: uuid.UUID, round_: int) -> uuid.UUID:
    """The id an owner records a later round of an erasure under (round 1 is the erasure's own id):
    each round erases once per owner, and a resumed round finds its records."""
    if round_ <= 1:
        return erasure_id
    return uuid.uuid5(erasure_id, f"round-{round_}")


# Statements over an owner's table, named once; the ``{...}`` fields (its table, columns, seat
# column, text expression, key columns, name) are filled from the owner's fixed description, never
# from a request's value.
_TABLE_SQL = {
    "delete_rows": "DELETE FROM {table} WHERE id = ANY($1::uuid[])",
    "fill_pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
    "round_reports": "SELECT report FROM {owner}_erasures WHERE erasure_id = ANY($1::uuid[])",
    "vector_spaces": (
        "SELECT DISTINCT {scope} AS seat, embedding_model, embedding_dims FROM {table}"
        " WHERE company = $1 AND embedding_dims IS NOT NULL"
    ),
    "naming": "SELECT id FROM {table} WHERE id = ANY($1::uuid[]) AND ({text}) ~* $2",
    "live_ids": "SELECT id FROM {table} WHERE id = ANY($1::uuid[])",
    "companies": "SELECT DISTINCT company FROM {table}",
    "seat_rows": "SELECT {columns} FROM {table} WHERE company = $1 AND {seat} = $2{also}",
    "company_rows": "SELECT {columns} FROM {table} WHERE company = $1{also}",
    "delete_seat": "DELETE FROM {table} WHERE company = $1 AND {seat} = $2",
    "delete_company": "DELETE FROM {table} WHERE company = $1",
    "delete_keyed": (
        "DELETE FROM {table} t USING unnest($2::text[], $3::{second_type}[]) AS g({first}, {second})"
        " WHERE t.company = $1 AND t.{first} = g.{first} AND t.{second} = g.{second}"
    ),
}


def _scope(target: Target, seat_sql: str, company_sql: str) -> tuple[str, tuple[str, ...]]:
    """The statement of a seat's or a company's erasure and its parameters; a person's erasure
    finds its rows by the owner's own statements (there is no one column that names a person)."""
    if target.kind is Kind.SEAT:
        return _TABLE_SQL[seat_sql], (target.company, target.seat)
    if target.kind is Kind.COMPANY:
        return _TABLE_SQL[company_sql], (target.company,)
    raise ValueError("a person's erasure finds its rows by the owner's own statements")


async def scope_rows(
    conn: asyncpg.Connection | asyncpg.Pool,
    target: Target,
    table: str,
    columns: str,
    *,
    seat_column: str = "seat",
    also: str = "",
) -> list[asyncpg.Record]:
    """``columns`` of the rows of ``table`` a seat's erasure takes (its ``seat_column`` is the
    seat) or a company's (all of the company's); ``also`` is a further fixed condition
    (`` AND ...``)."""
    sql, args = _scope(target, "seat_rows", "company_rows")
    return list(await conn.fetch(sql.format(columns=columns, table=table, seat=seat_column, also=also), *args))


async def delete_scope(conn: asyncpg.Connection, target: Target, table: str, *, seat_column: str = "seat") -> None:
    """Delete the rows of ``table`` a seat's or a company's erasure takes (as ``scope_rows``)."""
    sql, args = _scope(target, "delete_seat", "delete_company")
    await conn.execute(sql.format(table=table, seat=seat_column), *args)


async def delete_keyed(
    conn: asyncpg.Connection,
    table: str,
    company: str,
    keys: Sequence[tuple[Any, Any]],
    columns: tuple[str, str] = ("seat", "turn_id"),
    *,
    second_type: str = "text",
) -> None:
    """Delete the company's rows of ``table`` whose two-column key (``columns``: the first text,
    the second ``second_type``) is one of ``keys``, in one statement."""
    first, second = columns
    sql = _TABLE_SQL["delete_keyed"].format(table=table, first=first, second=second, second_type=second_type)
    await conn.execute(sql, company, [k[0] for k in keys], [k[1] for k in keys])


async def delete_indexed(
    conn: asyncpg.Connection, report: Report, table: str, base: str, rows: Iterable[asyncpg.Record]
) -> list[object]:
    """The shape every owner of indexed rows shares (diary notes, knowledge pages): delete
    ``rows`` (each with ``id`` and ``embedding_dims``) from ``table`` with their fill pieces,
    name them in ``report`` and queue their points (``<base>_<width>``) for removal. The ids."""
    rows = list(rows)
    ids = [r["id"] for r in rows]
    await conn.execute(_TABLE_SQL["delete_rows"].format(table=table), ids)
    await conn.execute(_TABLE_SQL["fill_pieces"], ids)
    report.add(table, ids)
    report.add_points(base, [(r["id"], r["embedding_dims"]) for r in rows])
    return ids


def _sql(owner: str) -> dict[str, str]:
    table = f"{owner}_erasures"
    return {
        "lock": "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        "get": f"SELECT report FROM {table} WHERE erasure_id = $1",
        "put": f"INSERT INTO {table} (erasure_id, company, report, erase_time) VALUES ($1, $2, $3::jsonb, $4)",
    }


async def run_once(
    pool: asyncpg.Pool,
    owner: str,
    target: Target,
    now: datetime,
    work: Callable[[asyncpg.Connection], Awaitable[Report]],
    *,
    index: VectorIndex | None = None,
) -> Report:
    """Run ``work`` (the owner's deletes, on the connection it is given) in one transaction with
    the record of its report, once per erasure id; a repeat returns the recorded report. The
    erased rows' points then leave the index."""
    sql = _sql(owner)
    async with pool.acquire() as conn, conn.transaction():
        # Two concurrent repeats of one erasure: the second waits, then reads the first's record.
        await conn.execute(sql["lock"], f"erasure/{owner}/{target.erasure_id}")
        recorded = await conn.fetchval(sql["get"], target.erasure_id)
        if recorded is not None:
            report = Report.from_json(recorded)
        else:
            report = await work(conn)
            await conn.execute(sql["put"], target.erasure_id, target.company, report.to_json(), now)
    report.index_points_pending = await drop_points(index, report.points)
    return report


async def _still_there(index: VectorIndex, collection: str, wanted: set[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``wanted`` the collection still holds: one walk of its point ids, as the orphan
    sweep walks them (the port has no lookup by id; an erasure is rare, a walk is correct)."""
    if collection not in await index.collections():
        return set()
    found: set[uuid.UUID] = set()
    after: uuid.UUID | None = None
    while True:
        page = await index.point_ids(collection, after, ORPHAN_PAGE)
        found |= wanted.intersection(page)
        if len(page) < ORPHAN_PAGE:
            return found
        after = page[-1]


async def verify_index(
    pool: asyncpg.Pool,
    index: VectorIndex | None,
    embedder: Embedder | None,
    owner: str,
    base: str,
    table: str,
    text_sql: str,
    target: Target,
    report: Report,
    *,
    scope: str = "seat",
) -> None:
    """The verification's look at an owner's vector index (``<base>_<width>`` collections of the
    rows of ``table``), added to ``report``:

    1. the points of every row this erasure erased (each round's record keeps them) must be gone:
       those left are ``index:<collection>``;
    2. a person's names and handles are embedded and searched in each seat's index; a near point
       whose row, re-read from PostgreSQL, names them (``text_sql`` matched as whole words) is
       ``index:<collection>`` too (index payloads hold no person's identifiers — company, seat,
       model, expiry, labels — so this is how a point "names" them);
    3. an index (or the embedder) that cannot answer is ``pending:index:<collection>`` (count 0):
       the erasure is not verified until a later attempt runs the check.

    ``scope`` is the column the index payload's ``seat`` holds (``container`` for knowledge pages).
    """
    if index is None:
        return
    rounds = [round_id(target.erasure_id, n) for n in range(1, ERASE_ROUNDS + 1)]
    erased: dict[str, set[uuid.UUID]] = {}
    for row in await pool.fetch(_TABLE_SQL["round_reports"].format(owner=owner), rounds):
        for collection, ids in Report.from_json(row["report"]).points.items():
            erased.setdefault(collection, set()).update(uuid.UUID(i) for i in ids)
    for collection, wanted in sorted(erased.items()):
        try:
            left = await _still_there(index, collection, wanted)
        except IndexUnavailable:
            report.add(f"{PENDING_CHECK}{INDEX_PREFIX}{collection}", [])
            continue
        if left:
            report.add(f"{INDEX_PREFIX}{collection}", sorted(left))
    if target.kind is not Kind.SUBJECT or embedder is None or not target.terms:
        return
    try:
        vectors = [v for v in await embedder.embed(target.terms) if v is not None]
    except Exception as err:  # the embedder down: the check waits, like an index down
        _log.warning("erasure %s: names not embedded for the %s index check: %s", target.erasure_id, base, err)
        report.add(f"{PENDING_CHECK}embeddings:{base}", [])
        return
    spaces = await pool.fetch(_TABLE_SQL["vector_spaces"].format(scope=scope, table=table), target.company)
    pattern = target.sql_pattern()
    for space in spaces:
        collection = collection_name(base, int(space["embedding_dims"]))
        for vector in vectors:
            if vector.model != space["embedding_model"] or vector.dimensions != space["embedding_dims"]:
                continue
            try:
                hits = await index.search(
                    collection,
                    vector.values,
                    company=target.company,
                    seat=space["seat"],
                    model=vector.model,
                    now=0.0,  # every point, expired or not: an expired one is still stored
                    limit=INDEX_NEAR,
                )
            except IndexUnavailable:
                report.add(f"{PENDING_CHECK}{INDEX_PREFIX}{collection}", [])
                break
            if not hits:
                continue
            named = await pool.fetch(
                _TABLE_SQL["naming"].format(table=table, text=text_sql), [h.id for h in hits], pattern
            )
            if named:
                report.add(f"{INDEX_PREFIX}{collection}", [r["id"] for r in named])


def provenance_json(msg: provenance_pb2.Provenance) -> str:
    """A ``Provenance`` as the JSON an owner keeps (field names as in the proto)."""
    return MessageToJson(msg, preserving_proto_field_name=True, indent=None)


def provenance_from_json(text: str | dict[str, Any] | None) -> provenance_pb2.Provenance:
    """The kept JSON back as a ``Provenance`` (empty when nothing was kept)."""
    data = json.loads(text) if isinstance(text, str) else dict(text or {})
    return ParseDict(data, provenance_pb2.Provenance(), ignore_unknown_fields=True)


async def provenance_row(
    pool: asyncpg.Pool, sql: str, kind: str, row_id: str, company: str, seat: str, *, domain: str
) -> asyncpg.Record:
    """The row an owner's ``sql`` reads for the provenance of a seat's ``kind`` ``row_id`` (its
    parameters: the id, the company, the seat); NotFound (``<KIND>_NOT_FOUND``) when the seat has
    none."""
    row = await pool.fetchrow(sql, uuid.UUID(row_id), company, seat)
    return require_found(row, kind, row_id, seat=seat, domain=domain)


def provenance_subjects(msg: object) -> list[str]:
    """The identifiers (handles, external ids) of the people a provenance names."""
    out: list[str] = []
    for subject in getattr(msg, "subjects", []):
        out += [x for x in (subject.handle, subject.external_id) if x]
    return sorted(set(out))


ORPHAN_PAGE = 500


async def sweep_orphans(pool: asyncpg.Pool, index: VectorIndex, base: str, table: str) -> int:
    """Remove the points of ``<base>_<width>`` collections whose row is gone from ``table`` (an
    index that was down when the rows were erased or deleted keeps their points until this runs).
    Returns how many were removed. A point written for a row committed meanwhile has its row, so
    it is never taken for an orphan."""
    removed = 0
    prefix = f"{base}_"
    for collection in await index.collections():
        if not (collection.startswith(prefix) and collection[len(prefix) :].isdigit()):
            continue
        after: uuid.UUID | None = None
        while True:
            ids = await index.point_ids(collection, after, ORPHAN_PAGE)
            if not ids:
                break
            after = ids[-1]
            live = {r["id"] for r in await pool.fetch(_TABLE_SQL["live_ids"].format(table=table), ids)}
            orphans = [i for i in ids if i not in live]
            if orphans:
                await index.delete(collection, orphans)
                removed += len(orphans)
            if len(ids) < ORPHAN_PAGE:
                break
    if removed:
        _log.info("removed %d orphaned points of %s", removed, base)
    return removed


async def retention_cutoffs(
    pool: asyncpg.Pool, table: str, privacy: PrivacyConfig, knob: str, now: datetime
) -> list[tuple[str, datetime]]:
    """(company, cutoff) for every company of ``table`` whose retention ``knob`` (a
    ``RetentionConfig`` field, in days) is set: rows older than the cutoff are past retention."""
    default = getattr(privacy.retention, knob)
    listed = privacy.companies
    if default > 0:
        companies = [r["company"] for r in await pool.fetch(_TABLE_SQL["companies"].format(table=table))]
    else:
        companies = list(listed)
    out = []
    for company in sorted(set(companies)):
        days = getattr(privacy.retention_of(company), knob)
        if days > 0:
            out.append((company, now - timedelta(days=days)))
    return out


async def prune_indexed(
    pool: asyncpg.Pool,
    index: VectorIndex | None,
    privacy: PrivacyConfig,
    now: datetime,
    *,
    table: str,
    knob: str,
    base: str,
    past: str,
    also: Sequence[str] = (),
) -> int:
    """Delete the indexed rows of ``table`` past their company's retention ``knob``, in one
    transaction per company: ``past`` is the owner's ``DELETE ... RETURNING id, embedding_dims``
    ($1 the company, $2 the cutoff); ``also``, its further statements over the deleted ids ($1),
    run before their fill pieces go. Then their points leave ``<base>_<width>``. How many rows
    went."""
    deleted = 0
    for company, cutoff in await retention_cutoffs(pool, table, privacy, knob, now):
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(past, company, cutoff)
            ids = [r["id"] for r in rows]
            for sql in also:
                await conn.execute(sql, ids)
            await conn.execute(_TABLE_SQL["fill_pieces"], ids)
        gone = Report(table)  # only its points: a retention prune keeps no receipt
        gone.add_points(base, [(r["id"], r["embedding_dims"]) for r in rows])
        await drop_points(index, gone.points)
        deleted += len(rows)
    return deleted
