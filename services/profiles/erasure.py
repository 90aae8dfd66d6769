"""The profiles' part of an erasure (issue 17, ``libs.common.erasure``): every observer's profile
of the person is deleted (on the named platform, or every platform), with its observations. Another
person's profile loses what rests on the erased person, found through the recorded provenance of
its observations (exact: an observation derived from their messages names them), and what names
them in text: the observations resting on or naming them are deleted, and an entry goes when one
of those observations stated it and no remaining observation does, or when it names them. A
profile of theirs pairs their handle with their external id: the other one is theirs too, and the
collection pass is told it (``Report.aliases``) so every owner matches it. A seat's erasure deletes
the profiles it observed and the profiles of it; a company's, all of them."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.erasure import Kind, Report, Target, delete_keyed, delete_scope, platform_key, run_once
from libs.common.senders import key_part, parse_subject_part
from services.profiles.domain import LIST_FIELDS, item_key

__all__ = ["OWNER", "erase", "find", "remaining_entries"]

OWNER = "profiles"

_TEXT = (
    "(communication_style || ' ' || array_to_string(past_decisions, ' ') || ' ' || array_to_string(sensitivities, ' ')"
    " || ' ' || array_to_string(topics, ' '))"
)
_ENTRIES = "communication_style, past_decisions, sensitivities, topics"
SQL = {
    # $3 is the target's platform, casefolded (``platform_key``), as the column is filed (rows
    # filed before any platform was taken hold ASCII names lowercased: the same fold). Handles and
    # external ids are filed as given, so they are compared exactly.
    "subject": """
        SELECT id, subject_handle, subject_external_id FROM counterparty_profiles
        WHERE company = $1 AND ($3 = '' OR platform = $3)
          AND (subject_handle = ANY($2::text[]) OR subject_external_id = ANY($2::text[])
               OR subject_key = ANY($2::text[]))""",
    "naming": f"""
        SELECT id FROM counterparty_profiles
        WHERE company = $1 AND {_TEXT} ~* $2 AND NOT (id = ANY($3::uuid[]))""",
    # Observations of the others' profiles derived from the person's messages (their provenance
    # names them), or naming them in text.
    "resting": f"""
        SELECT id, profile_id FROM profile_observations
        WHERE company = $1 AND NOT (profile_id = ANY($4::uuid[]))
          AND (subjects && $2::text[] OR {_TEXT} ~* $3)""",
    "profile": f"SELECT id, {_ENTRIES} FROM counterparty_profiles WHERE id = $1 FOR UPDATE",
    "observations": f"SELECT id, {_ENTRIES} FROM profile_observations WHERE profile_id = $1",
    "delete_observations": "DELETE FROM profile_observations WHERE id = ANY($1::uuid[])",
    Kind.SEAT: """
        SELECT id FROM counterparty_profiles WHERE company = $1 AND (observer = $2 OR subject_handle = $2)""",
    Kind.COMPANY: "SELECT id FROM counterparty_profiles WHERE company = $1",
    # Their observations go with them (ON DELETE CASCADE).
    "delete": "DELETE FROM counterparty_profiles WHERE id = ANY($1::uuid[])",
    # An applied observation's key names its sender: the profiler's ends in ``:profiler:`` and the
    # sender's ``subject_part``, so the keys ending in one of her identifiers ($2: each as a key part
    # and as given, after a "/") are read, and :func:`_names_her` parses the rest exactly; another
    # writer's key is matched as text ($3, as before: an identifier of two characters or more).
    "requests_subject": """
        SELECT request_id, observer, request_id ~* $3 AS named FROM profile_requests
        WHERE company = $1
          AND (EXISTS (SELECT 1 FROM unnest($2::text[]) AS t(tail) WHERE right(request_id, length(t.tail)) = t.tail)
               OR request_id ~* $3)""",
    "scrub": """
        UPDATE counterparty_profiles SET communication_style = $2, past_decisions = $3, sensitivities = $4, topics = $5
        WHERE id = $1""",
}


class _Plan:
    def __init__(self) -> None:
        self.gone: list[Any] = []
        """Profiles deleted (with their observations)."""
        self.changed: set[Any] = set()
        """Other profiles that lose entries: naming the person, or resting on them alone."""
        self.observations: dict[Any, list[Any]] = defaultdict(list)
        """Observations deleted, by the profile they were merged into."""
        self.keys: list[tuple[str, str]] = []
        """Idempotency keys naming the person: (request id, observer)."""
        self.aliases: set[str] = set()
        """Her identifiers her profiles pair with the ones the target names (collection pass)."""


def _digests(keys: list[tuple[str, str]]) -> list[str]:
    """The keys name the sender: the receipt keeps a digest of each, never the key."""
    return [hashlib.sha256(f"{o}/{k}".encode()).hexdigest()[:16] for k, o in keys]


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Plan:
    plan = _Plan()
    if target.kind is Kind.SEAT:
        plan.gone = [r["id"] for r in await conn.fetch(SQL[Kind.SEAT], target.company, target.seat)]
        return plan
    if target.kind is Kind.COMPANY:
        plan.gone = [r["id"] for r in await conn.fetch(SQL[Kind.COMPANY], target.company)]
        return plan
    pattern = target.sql_pattern()
    hers = list(await conn.fetch(SQL["subject"], target.company, target.identifiers, target.platform))
    plan.gone = [r["id"] for r in hers]
    # Her profile pairs her identifiers (filed under the handle, it remembers the external id): the
    # one the request did not name is hers too, never "another person". Her observations elsewhere
    # and the idempotency keys (``...:profiler:<platform>/<handle or external id>``) are matched by
    # every identifier of hers, so a request naming her external id alone still takes the keys
    # filed under her handle.
    paired = sorted({x for r in hers for x in (r["subject_handle"], r["subject_external_id"]) if x})
    plan.aliases = set(paired) - set(target.identifiers)
    ids = sorted({*target.identifiers, *paired})
    keys = dataclasses.replace(target, names=(*target.names, *paired)).sql_pattern()
    plan.changed = {r["id"] for r in await conn.fetch(SQL["naming"], target.company, pattern, plan.gone)}
    for r in await conn.fetch(SQL["resting"], target.company, ids, pattern, plan.gone):
        plan.observations[r["profile_id"]].append(r["id"])
        plan.changed.add(r["profile_id"])
    tails = sorted({f"/{x}" for i in ids for x in (key_part(i), i)})
    rows = await conn.fetch(SQL["requests_subject"], target.company, tails, keys)
    plan.keys = [
        (r["request_id"], r["observer"])
        for r in rows
        if r["named"] or _names_her(r["request_id"], ids, target.platform)
    ]
    return plan


# A key the profiler wrote before platforms were free and identifiers escaped in it: the platform
# was letters, digits and ``._-``, the identifier as given.
_LEGACY_PROFILER_KEY = re.compile(r":profiler:([A-Za-z0-9][A-Za-z0-9._-]*)$")


def _names_her(request_id: str, ids: Sequence[str], platform: str) -> bool:
    """Whether a profiler key (``<work>:profiler:<subject_part>``) names one of ``ids`` on
    ``platform`` (folded; empty: any), by its structure rather than as a word in text, so a
    one-letter identifier is found as surely as a long one and "q" never finds "MS Teams/qa"."""

    def on_platform(p: str) -> bool:
        return not platform or platform_key(p) == platform

    head, _, part = request_id.rpartition(":")
    parsed = parse_subject_part(part) if head.endswith(":profiler") else None
    if parsed is not None and parsed[1] in ids and on_platform(parsed[0]):
        return True
    for ident in ids:  # a key written before the escape, naming an identifier with one of % / :
        if request_id.endswith(f"/{ident}"):
            legacy = _LEGACY_PROFILER_KEY.search(request_id[: -len(ident) - 1])
            if legacy and on_platform(legacy.group(1)):
                return True
    return False


def _report(plan: _Plan, *, finding: bool) -> Report:
    report = Report(OWNER)
    if plan.gone or not finding:  # the receipt always names the table; a finding only what it found
        report.add("counterparty_profiles", plan.gone)
    if plan.changed:
        report.add("counterparty_profiles", sorted(plan.changed, key=str), changed=True)
    observations = [o for ids in plan.observations.values() for o in ids]
    if observations:
        report.add("profile_observations", sorted(observations, key=str))
    if plan.keys:
        report.add("profile_requests", _digests(plan.keys))
    report.aliases.update(plan.aliases)
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(await _plan(pool, target), finding=True)


def remaining_entries(
    row: Mapping[str, Any], target: Target, dropped: Sequence[Mapping[str, Any]], kept: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The profile's entries once the person is removed: an entry goes when it names them, or when
    a dropped observation stated it and no kept one does (what only their messages taught)."""

    def stated(rows: Sequence[Mapping[str, Any]], field: str) -> set[str]:
        if field == "communication_style":
            return {item_key(r[field]) for r in rows if r[field]}
        return {item_key(x) for r in rows for x in r[field]}

    def stays(field: str, item: str) -> bool:
        key = item_key(item)
        only_theirs = key in stated(dropped, field) and key not in stated(kept, field)
        return not only_theirs and not target.names_text(item)

    style = row["communication_style"]
    out: dict[str, Any] = {"communication_style": style if style and stays("communication_style", style) else ""}
    for field in LIST_FIELDS:
        out[field] = [x for x in row[field] if stays(field, x)]
    return out


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        plan = await _plan(conn, target)
        await conn.execute(SQL["delete"], plan.gone)
        await delete_keyed(conn, "profile_requests", target.company, plan.keys, ("request_id", "observer"))
        if target.kind is not Kind.SUBJECT:  # the seat's own requests (it observed), or the company's
            await delete_scope(conn, target, "profile_requests", seat_column="observer")
        for profile_id in sorted(plan.changed, key=str):
            row = await conn.fetchrow(SQL["profile"], profile_id)
            if row is None:
                continue
            dropping = plan.observations.get(profile_id, [])
            rows = list(await conn.fetch(SQL["observations"], profile_id))
            dropped = [r for r in rows if r["id"] in set(dropping)]
            kept = [r for r in rows if r["id"] not in set(dropping)]
            entries = remaining_entries(row, target, dropped, kept)
            await conn.execute(
                SQL["scrub"],
                profile_id,
                entries["communication_style"],
                entries["past_decisions"],
                entries["sensitivities"],
                entries["topics"],
            )
            await conn.execute(SQL["delete_observations"], dropping)
        return _report(plan, finding=False)

    return await run_once(pool, OWNER, target, now, work)
