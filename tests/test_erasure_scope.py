"""The statements every owner of rows shares to erase a seat's or a company's rows and rows keyed by
two columns (libs/common/erasure.py: ``scope_rows``, ``delete_scope``, ``delete_keyed``), and the
one NotFound of a seat's missing item (libs/common/not_found.py), on the real PostgreSQL: each takes
exactly the rows it names and no other seat's or company's."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from libs.common.erasure import Kind, Target, delete_keyed, delete_scope, scope_rows
from libs.common.errors import NotFound
from libs.common.not_found import require_found

ROWS = [
    ("acme", "ana", "r1", 1),
    ("acme", "ana", "r2", 2),
    ("acme", "ben", "r1", 1),
    ("globex", "ana", "r1", 1),
]


async def _table(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE TABLE held (company text, seat text, turn_id text, seq bigint, kept boolean)")
    await conn.executemany("INSERT INTO held VALUES ($1, $2, $3, $4, $4::bigint = 1)", ROWS)


async def _left(conn: asyncpg.Connection) -> list[tuple[str, str, str, int]]:
    rows = await conn.fetch("SELECT company, seat, turn_id, seq FROM held ORDER BY company, seat, turn_id")
    return [(r["company"], r["seat"], r["turn_id"], r["seq"]) for r in rows]


def _target(kind: Kind, company: str = "acme", seat: str = "") -> Target:
    return Target(uuid.uuid4(), company, kind, seat=seat, handle="ana" if kind is Kind.SUBJECT else "")


async def test_scope_rows_are_the_seats_or_the_companys_and_no_others(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await _table(conn)
        seat = await scope_rows(conn, _target(Kind.SEAT, seat="ana"), "held", "seat, turn_id")
        assert sorted(tuple(r) for r in seat) == [("ana", "r1"), ("ana", "r2")]
        company = await scope_rows(conn, _target(Kind.COMPANY), "held", "seat, turn_id")
        assert sorted(tuple(r) for r in company) == [("ana", "r1"), ("ana", "r2"), ("ben", "r1")]
        also = await scope_rows(conn, _target(Kind.COMPANY), "held", "turn_id", also=" AND kept")
        assert sorted(r["turn_id"] for r in also) == ["r1", "r1"]
        by_column = await scope_rows(conn, _target(Kind.SEAT, seat="r2"), "held", "seat", seat_column="turn_id")
        assert [r["seat"] for r in by_column] == ["ana"]
        with pytest.raises(ValueError):  # a person's rows are found by the owner's own statements
            await scope_rows(conn, _target(Kind.SUBJECT), "held", "seat")
    finally:
        await conn.close()


async def test_delete_scope_takes_the_seats_rows_then_the_companys(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await _table(conn)
        await delete_scope(conn, _target(Kind.SEAT, seat="ana"), "held")
        assert await _left(conn) == [("acme", "ben", "r1", 1), ("globex", "ana", "r1", 1)]
        await delete_scope(conn, _target(Kind.COMPANY), "held")
        assert await _left(conn) == [("globex", "ana", "r1", 1)]
    finally:
        await conn.close()


async def test_delete_keyed_takes_exactly_the_keys_of_the_company(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await _table(conn)
        await delete_keyed(conn, "held", "acme", [("ana", "r1"), ("ben", "r2")])  # (ben, r2) is no row
        assert await _left(conn) == [("acme", "ana", "r2", 2), ("acme", "ben", "r1", 1), ("globex", "ana", "r1", 1)]
        await delete_keyed(conn, "held", "acme", [("r1", 1)], ("turn_id", "seq"), second_type="bigint")
        assert await _left(conn) == [("acme", "ana", "r2", 2), ("globex", "ana", "r1", 1)]
        await delete_keyed(conn, "held", "acme", [])
        assert len(await _left(conn)) == 2
    finally:
        await conn.close()


def test_require_found_passes_a_found_item_and_refuses_a_missing_one_naming_it() -> None:
    assert require_found(0, "note", "n1", seat="ana", domain="diary.test") == 0  # found, though falsy
    with pytest.raises(NotFound) as err:
        require_found(None, "profile", "p1", seat="ana", domain="profiles.test", scope="observer")
    assert str(err.value) == "NOT_FOUND PROFILE_NOT_FOUND: profile p1 not found for observer ana"
    assert err.value.domain == "profiles.test"
    assert err.value.metadata == {"profile_id": "p1", "observer": "ana"}
