"""The profiles' part of an erasure (issue 17, ``libs.common.erasure``): every observer's profile
of the person is deleted (on the named platform, or every platform); another person's profile that
names them keeps its other entries and loses the ones that name them (changed). A seat's erasure
deletes the profiles it observed and the profiles of it; a company's, all of them."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.erasure import Kind, Report, Target, run_once
from libs.common.errors import NotFound
from services.profiles.domain import DOMAIN

__all__ = ["OWNER", "erase", "find", "provenance"]

OWNER = "profiles"

_TEXT = (
    "(communication_style || ' ' || array_to_string(past_decisions, ' ') || ' ' || array_to_string(sensitivities, ' ')"
    " || ' ' || array_to_string(topics, ' '))"
)
SQL = {
    "subject": """
        SELECT id FROM counterparty_profiles
        WHERE company = $1 AND ($3 = '' OR platform = $3)
          AND (subject_handle = ANY($2::text[]) OR subject_external_id = ANY($2::text[])
               OR subject_key = ANY($2::text[]))""",
    "naming": f"""
        SELECT id, communication_style, past_decisions, sensitivities, topics FROM counterparty_profiles
        WHERE company = $1 AND {_TEXT} ~* $2 AND NOT (id = ANY($3::uuid[]))""",
    Kind.SEAT: """
        SELECT id FROM counterparty_profiles WHERE company = $1 AND (observer = $2 OR subject_handle = $2)""",
    Kind.COMPANY: "SELECT id FROM counterparty_profiles WHERE company = $1",
    "delete": "DELETE FROM counterparty_profiles WHERE id = ANY($1::uuid[])",
    "provenance": """
        SELECT platform, subject_handle, subject_external_id, last_turn_id FROM counterparty_profiles
        WHERE id = $1 AND company = $2 AND observer = $3""",
    "requests_seat": "DELETE FROM profile_requests WHERE company = $1 AND observer = $2",
    # An applied observation's key names its sender (``<work>:profiler:<platform>/<handle>``).
    "requests_subject": "SELECT request_id, observer FROM profile_requests WHERE company = $1 AND request_id ~* $2",
    "delete_requests": """
        DELETE FROM profile_requests r USING unnest($2::text[], $3::text[]) AS g(request_id, observer)
        WHERE r.company = $1 AND r.request_id = g.request_id AND r.observer = g.observer""",
    "requests_company": "DELETE FROM profile_requests WHERE company = $1",
    "scrub": """
        UPDATE counterparty_profiles SET communication_style = $2, past_decisions = $3, sensitivities = $4, topics = $5
        WHERE id = $1""",
}


def _digests(keys: list[tuple[str, str]]) -> list[str]:
    """The keys name the sender: the receipt keeps a digest of each, never the key."""
    return [hashlib.sha256(f"{o}/{k}".encode()).hexdigest()[:16] for k, o in keys]


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> tuple[list[Any], list[Any], list[Any]]:
    """(profiles to delete, profiles naming the person to scrub, observation keys naming them)."""
    if target.kind is Kind.SEAT:
        return [r["id"] for r in await conn.fetch(SQL[Kind.SEAT], target.company, target.seat)], [], []
    if target.kind is Kind.COMPANY:
        return [r["id"] for r in await conn.fetch(SQL[Kind.COMPANY], target.company)], [], []
    gone = [r["id"] for r in await conn.fetch(SQL["subject"], target.company, target.identifiers, target.platform)]
    naming = list(await conn.fetch(SQL["naming"], target.company, target.sql_pattern(), gone))
    keys = [
        (r["request_id"], r["observer"])
        for r in await conn.fetch(SQL["requests_subject"], target.company, target.sql_pattern())
    ]
    return gone, naming, keys


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    report = Report(OWNER)
    gone, naming, keys = await _plan(pool, target)
    if gone:
        report.add("counterparty_profiles", gone)
    if naming:
        report.add("counterparty_profiles", [r["id"] for r in naming], changed=True)
    if keys:
        report.add("profile_requests", _digests(keys))
    return report


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        report = Report(OWNER)
        gone, naming, keys = await _plan(conn, target)
        await conn.execute(SQL["delete"], gone)
        await conn.execute(SQL["delete_requests"], target.company, [k for k, _ in keys], [o for _, o in keys])
        if keys:
            report.add("profile_requests", _digests(keys))
        if target.kind is Kind.SEAT:
            await conn.execute(SQL["requests_seat"], target.company, target.seat)
        elif target.kind is Kind.COMPANY:
            await conn.execute(SQL["requests_company"], target.company)
        for row in naming:

            def keep(items: list[str]) -> list[str]:
                return [x for x in items if not target.names_text(x)]

            style = "" if target.names_text(row["communication_style"]) else row["communication_style"]
            await conn.execute(
                SQL["scrub"],
                row["id"],
                style,
                keep(row["past_decisions"]),
                keep(row["sensitivities"]),
                keep(row["topics"]),
            )
        report.add("counterparty_profiles", gone)
        if naming:
            report.add("counterparty_profiles", [r["id"] for r in naming], changed=True)
        return report

    return await run_once(pool, OWNER, target, now, work)


async def provenance(pool: asyncpg.Pool, company: str, observer: str, profile_id: str) -> provenance_pb2.Provenance:
    row = await pool.fetchrow(SQL["provenance"], uuid.UUID(profile_id), company, observer)
    if row is None:
        raise NotFound(
            f"profile {profile_id} not found for observer {observer}",
            reason="PROFILE_NOT_FOUND",
            domain=DOMAIN,
            metadata={"profile_id": profile_id, "observer": observer},
        )
    subject = erasure_pb2.ErasureSubject(
        handle=row["subject_handle"] or "", external_id=row["subject_external_id"] or "", platform=row["platform"]
    )
    turns = [row["last_turn_id"]] if row["last_turn_id"] else []
    return provenance_pb2.Provenance(turn_ids=turns, subjects=[subject], writer="profiler")
