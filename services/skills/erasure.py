"""The skills' part of an erasure (issue 17, ``libs.common.erasure``), and their provenance.

Every skill, kept version and practice bullet records where it came from (its ``provenance``:
turn ids, subjects, a learning check's session and events, model, prompt version, writer). For one
person (a SUBJECT erasure) each of them is judged on its own:

- it **rests only on them** when its text names them, or when what it was derived from is theirs
  alone (every turn id is one of their runs, or every subject it names is them, or it was learned
  in one of their sessions): it goes;
- it **also rests on others** when it mentions them beside other sources: it stays and loses their
  part (their run ids and their subject entries);
- otherwise it is not theirs and is left alone.

A bullet that goes leaves the body (and every kept version's body) it was appended to: the skill is
re-rendered from its remaining bullets, with no model (``domain.remove_practice_bullets``). A kept
version that goes is deleted; a live version that goes (their observation or refinement) gives way,
its whole record (number, change, reason, key, time, provenance) with it, to the newest kept version
that stays. A version's reason and its call's idempotency key are judged as its body is: one that
names them, or a key of one of their runs (``<run id>:...``), drops the version (a reason is the
teacher's words, and a redacted one would still say a version came from somewhere). A provenance
that loses one of their turns loses its work key too (which turn's it is, is not recorded). A skill
goes when its draft rests only on them, when its text still names them after the bullets are out, or
when none of its versions stays; it is changed when any part of it lost their contribution. A skill
is a procedure (tools in order), so what the person contributed to a shared one is evidence, not
words. A skill proposal from their turns or sessions, or naming them, is deleted, and so are
MarkSkillsUsed's idempotency keys of their turns (``<run id>:skill_use``, as the diary's keys go) or
naming them; the receipt counts the keys (a digest of each, never the key).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.common.v1.provenance_pb2 import Provenance
from agentlearn.skills.v1 import skill_service_pb2 as pb
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure import (
    Kind,
    Report,
    Target,
    delete_keyed,
    delete_scope,
    provenance_from_json,
    provenance_json,
    provenance_row,
    run_once,
    scope_rows,
)
from services.skills.domain import DOMAIN, SkillChange, remove_practice_bullets

__all__ = ["OWNER", "erase", "find", "provenance"]

OWNER = "skills"

# A version's why and its call's key are words of whoever taught it as much as its body is: the live
# version's, a kept version's and a proposal's decision are matched with the rest of the text.
_SKILL_TEXT = (
    "(name || ' ' || summary || ' ' || body || ' ' || array_to_string(tool_sequence, ' ')"
    " || ' ' || change_reason || ' ' || coalesce(request_id, ''))"
)
_PROPOSAL_TEXT = (
    "(name || ' ' || summary || ' ' || body || ' ' || array_to_string(tool_sequence, ' ')"
    " || ' ' || decision_reason || ' ' || coalesce(request_id, ''))"
)
# An idempotency key ``<run id>:...`` of one of their runs ($2).
_THEIR_KEY = "EXISTS (SELECT 1 FROM unnest($2::text[]) AS t(run) WHERE starts_with({col}, t.run || ':'))"
# $2: the person's run ids; $3: the pattern of their identifiers and names (whole words); $4: their
# sessions; $5: their identifiers, compared exactly with the provenance's subjects (as proposals are):
# the pattern drops a term too short to match as a word, so a one-letter handle is found only here.
_MENTIONS = (
    "({col}->'turn_ids' ?| $2::text[] OR {col}->>'session_id' = ANY($4::text[]) OR {col}::text ~* $3"
    " OR EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce({col}->'subjects', '[]')) p"
    " WHERE p->>'handle' = ANY($5::text[]) OR p->>'external_id' = ANY($5::text[])))"
)
SQL = {
    "skills_subject": f"""
        SELECT s.id FROM synthesized_skills s
        WHERE company = $1 AND (source_turn_ids && $2::text[] OR {_SKILL_TEXT} ~* $3
               OR {_THEIR_KEY.format(col="s.request_id")}
               OR {_MENTIONS.format(col="s.provenance")} OR {_MENTIONS.format(col="s.version_provenance")}
               OR EXISTS (SELECT 1 FROM synthesized_skill_versions v WHERE v.skill_id = s.id
                          AND ((v.body || ' ' || v.reason || ' ' || coalesce(v.request_id, '')) ~* $3
                               OR {_THEIR_KEY.format(col="v.request_id")} OR {_MENTIONS.format(col="v.provenance")}))
               OR EXISTS (SELECT 1 FROM skill_practice_bullets b WHERE b.skill_id = s.id
                          AND (b.bullet ~* $3 OR {_MENTIONS.format(col="b.provenance")})))""",
    "skill": """
        SELECT id, name, summary, body, tool_sequence, source_turn_ids, version, change, change_reason,
               restored_from_version, request_id, version_time, provenance, version_provenance
        FROM synthesized_skills WHERE id = $1 FOR UPDATE""",
    "versions": """
        SELECT version, body, change, reason, restored_from_version, request_id, create_time, provenance
        FROM synthesized_skill_versions WHERE skill_id = $1 ORDER BY version DESC""",
    "bullets": """
        SELECT id, version, bullet, provenance FROM skill_practice_bullets WHERE skill_id = $1
        ORDER BY version, create_time, id""",
    "proposals_subject": f"""
        SELECT id FROM skill_proposals
        WHERE company = $1 AND ((turn_id <> '' AND turn_id = ANY($2::text[])) OR {_PROPOSAL_TEXT} ~* $3
               OR {_THEIR_KEY.format(col="request_id")}
               OR (session_id <> '' AND session_id = ANY($4::text[]))
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(provenance->'subjects', '[]')) s
                          WHERE s->>'handle' = ANY($5::text[]) OR s->>'external_id' = ANY($5::text[])))""",
    "delete_skills": "DELETE FROM synthesized_skills WHERE id = ANY($1::uuid[])",
    "delete_proposals": "DELETE FROM skill_proposals WHERE id = ANY($1::uuid[])",
    "update_skill": """
        UPDATE synthesized_skills SET body = $2, source_turn_ids = $3, provenance = $4, version_provenance = $5,
               version = $6, change = $7, change_reason = $8, restored_from_version = $9, request_id = $10,
               version_time = $11
        WHERE id = $1""",
    "delete_version": "DELETE FROM synthesized_skill_versions WHERE skill_id = $1 AND version = $2",
    "update_version": """
        UPDATE synthesized_skill_versions SET body = $3, provenance = $4 WHERE skill_id = $1 AND version = $2""",
    "delete_bullet": "DELETE FROM skill_practice_bullets WHERE id = $1",
    "update_bullet": "UPDATE skill_practice_bullets SET provenance = $2 WHERE id = $1",
    # MarkSkillsUsed's and UseSkill's idempotency keys (``<run id>:skill_use``,
    # ``<run id>:use_skill:<request id>:<skill digest>``) of a turn of theirs ($2), or naming them ($3): a key
    # outlives the uses it counted, never its erasure (as the diary's keys).
    "requests_of": """
        SELECT seat, request_id FROM skill_use_requests
        WHERE company = $1 AND (request_id ~* $3
               OR EXISTS (SELECT 1 FROM unnest($2::text[]) AS t(run) WHERE starts_with(request_id, t.run || ':')))""",
    "provenance": """
        SELECT source_turn_ids, trigger, version, change, provenance, version_provenance
        FROM synthesized_skills WHERE id = $1 AND company = $2 AND seat = $3""",
}


# ------------------------------------------------------------------------------ judging one part


@dataclass(frozen=True)
class _Verdict:
    gone: bool
    changed: bool
    rest: Provenance  # the provenance without the person's part (when changed)


def _judge(target: Target, prov: Provenance, *texts: str) -> _Verdict:
    """Whether a part rests only on the person (gone), also on others (changed), or not at all."""
    theirs_turns = set(target.turn_ids)
    ids = set(target.identifiers)
    rest = Provenance()
    rest.CopyFrom(prov)
    del rest.turn_ids[:]
    rest.turn_ids.extend(t for t in prov.turn_ids if t not in theirs_turns)
    del rest.subjects[:]
    rest.subjects.extend(s for s in prov.subjects if s.handle not in ids and s.external_id not in ids)
    touched = len(rest.turn_ids) != len(prov.turn_ids) or len(rest.subjects) != len(prov.subjects)
    # The work key is a turn's: with one of their turns out it may be theirs (which turn's, when
    # several, is not recorded), so it goes with their run ids; so does one that names them.
    if prov.work_key and (
        len(rest.turn_ids) != len(prov.turn_ids)
        or any(t in prov.work_key for t in theirs_turns)
        or target.names_text(prov.work_key)
    ):
        rest.work_key = ""
        touched = True
    only_theirs = touched and (
        (len(prov.turn_ids) > 0 and len(rest.turn_ids) == 0) or (len(prov.subjects) > 0 and len(rest.subjects) == 0)
    )
    # A learning check over one of their sessions learned from their conversation (as a proposal
    # from their session goes, so does what it became).
    their_session = bool(prov.session_id) and prov.session_id in target.session_ids
    gone = target.names_text(*texts) or only_theirs or their_session
    return _Verdict(gone, touched and not gone, rest)


def _their_key(target: Target, request_id: str | None) -> bool:
    """Whether a version's idempotency key is of one of their runs (``<run id>:...``) or names them."""
    if not request_id:
        return False
    return any(request_id.startswith(f"{run}:") for run in target.turn_ids) or target.names_text(request_id)


@dataclass(frozen=True)
class _Version:
    """A version as it reads after the erasure: what the live row takes back when its own goes."""

    version: int
    body: str
    change: str
    reason: str
    restored_from_version: int | None
    request_id: str | None
    time: datetime
    provenance: Provenance


@dataclass
class _SkillPlan:
    """What the erasure does to one skill."""

    skill_id: uuid.UUID
    gone: bool = False
    changed: bool = False
    body: str = ""
    source_turn_ids: list[str] = field(default_factory=list)
    provenance: Provenance = field(default_factory=Provenance)
    version_provenance: Provenance = field(default_factory=Provenance)
    # The live version's own record (its number, how and why it became live, its call's key, when).
    version: int = 0
    change: str = ""
    change_reason: str = ""
    restored_from_version: int | None = None
    request_id: str | None = None
    version_time: datetime | None = None
    bullets_gone: list[uuid.UUID] = field(default_factory=list)
    bullets_changed: list[tuple[uuid.UUID, Provenance]] = field(default_factory=list)
    versions_gone: list[int] = field(default_factory=list)
    versions_changed: list[tuple[int, str, Provenance]] = field(default_factory=list)


async def _plan_skill(conn: asyncpg.Connection | asyncpg.Pool, target: Target, skill_id: uuid.UUID) -> _SkillPlan:
    row = await conn.fetchrow(SQL["skill"], skill_id)
    plan = _SkillPlan(skill_id)
    if row is None:
        return plan
    bullets = await conn.fetch(SQL["bullets"], skill_id)
    versions = await conn.fetch(SQL["versions"], skill_id)

    # Bullets first: one that goes leaves every body it is in.
    out: list[str] = []
    for b in bullets:
        v = _judge(target, provenance_from_json(b["provenance"]), b["bullet"])
        if v.gone:
            plan.bullets_gone.append(b["id"])
            out.append(b["bullet"])
        elif v.changed:
            plan.bullets_changed.append((b["id"], v.rest))

    # Kept versions: rendered without the gone bullets, then judged on their own provenance.
    # A version whose reason or key is theirs goes as one whose body names them does.
    kept: list[_Version] = []
    for ver in versions:
        body = remove_practice_bullets(ver["body"], out) if out else ver["body"]
        v = _judge(target, provenance_from_json(ver["provenance"]), body, ver["reason"])
        if v.gone or _their_key(target, ver["request_id"]):
            plan.versions_gone.append(ver["version"])
            continue
        prov = v.rest if v.changed else provenance_from_json(ver["provenance"])
        if v.changed or body != ver["body"]:
            plan.versions_changed.append((ver["version"], body, prov))
        kept.append(
            _Version(
                ver["version"], body, ver["change"], ver["reason"], ver["restored_from_version"],
                ver["request_id"], ver["create_time"], prov,
            )
        )  # fmt: skip

    # The live version: a bullet of theirs is already out of its body; a version that rests on
    # them (their observation or refinement, or a reason or key of theirs) gives way, record and
    # all, to the newest kept version that stays: the live row says nothing of what was theirs.
    body = remove_practice_bullets(row["body"], out) if out else row["body"]
    live = _judge(target, provenance_from_json(row["version_provenance"]), row["change_reason"])
    live_gone = live.gone or _their_key(target, row["request_id"])
    version_prov = live.rest if live.changed else provenance_from_json(row["version_provenance"])
    plan.version, plan.change, plan.change_reason = row["version"], row["change"], row["change_reason"]
    plan.restored_from_version, plan.request_id = row["restored_from_version"], row["request_id"]
    plan.version_time = row["version_time"]
    if live_gone and kept:
        back = kept.pop(0)
        body, version_prov = back.body, back.provenance
        plan.version, plan.change, plan.change_reason = back.version, back.change, back.reason
        plan.restored_from_version, plan.request_id = back.restored_from_version, back.request_id
        plan.version_time = back.time
        plan.versions_gone.append(back.version)  # it is live again: not also a kept version
        plan.versions_changed = [c for c in plan.versions_changed if c[0] != back.version]
        # Bullets the dropped version appended are no longer in any body.
        for b in bullets:
            if b["version"] > back.version and b["id"] not in plan.bullets_gone:
                plan.bullets_gone.append(b["id"])
                plan.bullets_changed = [c for c in plan.bullets_changed if c[0] != b["id"]]
    elif live_gone and SkillChange(row["change"]) is SkillChange.OBSERVATION_APPENDED:
        # No kept version to go back to (the history is bounded): its bullet is out of the body;
        # the version keeps its number but neither their words nor their call's key.
        version_prov = live.rest
        plan.change_reason, plan.request_id = "", None
    elif live_gone:
        plan.gone = True
        return plan

    # The skill's draft: its source turns and its own provenance, and its text as it now reads.
    theirs = set(target.turn_ids)
    turns = [t for t in row["source_turn_ids"] if t not in theirs]
    draft = _judge(target, provenance_from_json(row["provenance"]))
    text = " ".join([row["name"], row["summary"], body, " ".join(row["tool_sequence"])])
    if target.names_text(text, *(k.body for k in kept)) or (row["source_turn_ids"] and not turns) or draft.gone:
        plan.gone = True
        return plan
    plan.body = body
    plan.source_turn_ids = turns
    plan.provenance = draft.rest if draft.changed else provenance_from_json(row["provenance"])
    plan.version_provenance = version_prov
    plan.changed = bool(
        len(turns) != len(row["source_turn_ids"])
        or draft.changed
        or live.changed
        or live_gone
        or body != row["body"]
        or plan.bullets_gone
        or plan.bullets_changed
        or plan.versions_gone
        or plan.versions_changed
    )
    return plan


# ------------------------------------------------------------------------------ the owner's erasure


@dataclass
class _Plan:
    skills: list[_SkillPlan]
    gone: list[uuid.UUID]
    proposals: list[uuid.UUID]
    keys: list[tuple[str, str]]
    """``skill_use_requests`` (seat, request id) the erasure takes."""


def _digests(keys: list[tuple[str, str]]) -> list[str]:
    """A key may name someone: the receipt keeps a digest of each, never the key."""
    return [hashlib.sha256(f"{seat}/{key}".encode()).hexdigest()[:16] for seat, key in keys]


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Plan:
    if target.kind is not Kind.SUBJECT:  # a seat's or a company's: every one of the seat (the company)
        skills = await scope_rows(conn, target, "synthesized_skills", "id")
        proposals = await scope_rows(conn, target, "skill_proposals", "id")
        keys = await scope_rows(conn, target, "skill_use_requests", "seat, request_id")
        return _Plan([], [r["id"] for r in skills], [r["id"] for r in proposals], _sorted_keys(keys))
    turns, pattern = list(target.turn_ids), target.sql_pattern()
    plans = [
        await _plan_skill(conn, target, r["id"])
        for r in await conn.fetch(
            SQL["skills_subject"], target.company, turns, pattern, list(target.session_ids), list(target.identifiers)
        )
    ]
    proposals = await conn.fetch(
        SQL["proposals_subject"], target.company, turns, pattern, list(target.session_ids), list(target.identifiers)
    )
    keys = await conn.fetch(SQL["requests_of"], target.company, turns, pattern)
    return _Plan(
        [p for p in plans if p.changed],
        [p.skill_id for p in plans if p.gone],
        [r["id"] for r in proposals],
        _sorted_keys(keys),
    )


def _sorted_keys(rows: list[asyncpg.Record]) -> list[tuple[str, str]]:
    return sorted((r["seat"], r["request_id"]) for r in rows)


def _report(plan: _Plan) -> Report:
    report = Report(OWNER)
    if plan.gone or plan.skills:
        report.add("synthesized_skills", plan.gone)
        report.add("synthesized_skills", [p.skill_id for p in plan.skills], changed=True)
    versions_gone = [f"{p.skill_id}/{v}" for p in plan.skills for v in p.versions_gone]
    versions_changed = [f"{p.skill_id}/{v}" for p in plan.skills for v, _, _ in p.versions_changed]
    if versions_gone or versions_changed:
        report.add("synthesized_skill_versions", versions_gone)
        report.add("synthesized_skill_versions", versions_changed, changed=True)
    bullets_gone = [b for p in plan.skills for b in p.bullets_gone]
    bullets_changed = [b for p in plan.skills for b, _ in p.bullets_changed]
    if bullets_gone or bullets_changed:
        report.add("skill_practice_bullets", bullets_gone)
        report.add("skill_practice_bullets", bullets_changed, changed=True)
    if plan.proposals:
        report.add("skill_proposals", plan.proposals)
    if plan.keys:
        report.add("skill_use_requests", _digests(plan.keys))
    return report


async def find(pool: asyncpg.Pool, target: Target) -> Report:
    return _report(await _plan(pool, target))


async def erase(pool: asyncpg.Pool, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        plan = await _plan(conn, target)
        await conn.execute(SQL["delete_skills"], plan.gone)
        await conn.execute(SQL["delete_proposals"], plan.proposals)
        for p in plan.skills:
            for bullet_id in p.bullets_gone:
                await conn.execute(SQL["delete_bullet"], bullet_id)
            for bullet_id, rest in p.bullets_changed:
                await conn.execute(SQL["update_bullet"], bullet_id, provenance_json(rest))
            for version in p.versions_gone:
                await conn.execute(SQL["delete_version"], p.skill_id, version)
            for version, body, rest in p.versions_changed:
                await conn.execute(SQL["update_version"], p.skill_id, version, body, provenance_json(rest))
            await conn.execute(
                SQL["update_skill"],
                p.skill_id,
                p.body,
                p.source_turn_ids,
                provenance_json(p.provenance),
                provenance_json(p.version_provenance),
                p.version,
                p.change,
                p.change_reason,
                p.restored_from_version,
                p.request_id,
                p.version_time,
            )
        if target.kind is Kind.SUBJECT:
            await delete_keyed(conn, "skill_use_requests", target.company, plan.keys, ("seat", "request_id"))
        else:
            await delete_scope(conn, target, "skill_use_requests")
        return _report(plan)

    return await run_once(pool, OWNER, target, now, work)


# ------------------------------------------------------------------------------ provenance


def _loaded(value: Any) -> Provenance:
    return provenance_from_json(json.loads(value) if isinstance(value, str) else value)


async def provenance(pool: asyncpg.Pool, company: str, seat: str, skill_id: str) -> pb.GetSkillProvenanceResponse:
    """Where the skill was drafted from (its turns, the draft's subjects, model, prompt version and
    writer), where each kept version and each practice bullet came from."""
    sid = uuid.UUID(skill_id)
    row = await provenance_row(pool, SQL["provenance"], "skill", skill_id, company, seat, domain=DOMAIN)
    draft = _loaded(row["provenance"])
    # The source turns are the skill's current ones (an erasure may have taken some away); a
    # skill from before provenance was kept says only how it was drafted.
    del draft.turn_ids[:]
    draft.turn_ids.extend(row["source_turn_ids"])
    if not draft.writer:
        draft.writer = f"synthesis:{row['trigger']}"
    versions = [
        pb.SkillVersionProvenance(
            version=row["version"], change=_CHANGE[SkillChange(row["change"])], current=True,
            provenance=_loaded(row["version_provenance"]),
        )
    ]  # fmt: skip
    versions += [
        pb.SkillVersionProvenance(
            version=v["version"], change=_CHANGE[SkillChange(v["change"])], provenance=_loaded(v["provenance"])
        )
        for v in await pool.fetch(SQL["versions"], sid)
    ]
    bullets = [
        pb.PracticeBulletProvenance(
            id=str(b["id"]), version=b["version"], text=b["bullet"], provenance=_loaded(b["provenance"])
        )
        for b in await pool.fetch(SQL["bullets"], sid)
    ]
    return pb.GetSkillProvenanceResponse(provenance=draft, versions=versions, bullets=bullets)


_CHANGE = enum_to_pb(SkillChange, pb.SkillChange, "SKILL_CHANGE")
