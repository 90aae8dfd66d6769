"""The episodes' part of an erasure (issue 17, ``libs.common.erasure``).

- A raw row is one turn: the person's (they are among its subjects, its run id is one of theirs,
  or its text names them) is deleted, with its vector, its fill pieces and its collapsed run ids.
- A compacted row rests on many turns (its members, kept in ``compaction_members``). One whose
  members included the person's turns (a member carried them, or its text names them) is
  *re-derived*: the same summary that folded it (``EpisodeLifecycle.rederive``: the seat's
  auxiliary chain, the same prompt) is written again from the remaining members, the person's
  member records are deleted and the row's columns replaced in place (same id: its exemplars stay
  anchored). No member left, a final refusal of the chain, or a new text that still names them: the
  row is deleted. A chain only briefly down raises (``rederive``: ``UNAVAILABLE``) before anything
  is erased, and the privacy worker retries the erasure. A compacted row has no vector (it is
  never a search hit), so there is none to replace. The model calls run before the owner's
  transaction; a plan that changed meanwhile deletes the row instead.
- A compacted row folded before members were kept (no ``compaction_members``): its text is kept
  only when it does not name them; their identifiers leave ``subjects_involved`` and ``subjects``
  (the union of its members' senders: such a row is found by either) and their run ids
  ``exemplar_turn_ids`` (the row is *changed*); otherwise it is deleted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.config import PrivacyConfig
from libs.common.embeddings import Embedder
from libs.common.erasure import Kind, Report, Target, provenance_row, prune_indexed, run_once, scope_rows, verify_index
from libs.common.vectorindex import VectorIndex
from services.episodes.domain import COLLECTION_BASE, DOMAIN, Episode

__all__ = ["OWNER", "Rederive", "erase", "find", "provenance", "prune_retention"]

OWNER = "episodes"

Rederive = Callable[
    [str, str, "str | None", Sequence[Mapping[str, Any]], Sequence[str]], Awaitable["tuple[Episode, str] | None"]
]
"""``EpisodeLifecycle.rederive``: (company, seat, role, remaining member records, exemplar run ids)
-> the re-derived row's columns and the model, or None."""

_TEXT = "(label || ' ' || ask || ' ' || what_it_did || ' ' || review_outcome)"
_COMPACTED_TEXT = (
    "(label || ' ' || ask || ' ' || what_it_did || ' ' || common_task_pattern || ' ' || common_outcome"
    " || ' ' || array_to_string(notable_patterns, ' '))"
)
SQL = {
    "raw_subject": f"""
        SELECT id, turn_id, embedding_dims, carried FROM (
            SELECT id, turn_id, embedding_dims, {_TEXT} ~* $4 AS names,
                   (subjects && $2::text[] OR turn_id = ANY($3::text[])
                    OR EXISTS (SELECT 1 FROM episode_runs r
                               WHERE r.episode_id = e.id AND r.turn_id = ANY($3::text[]))) AS carried
            FROM episodes e WHERE company = $1 AND kind = 'raw') raw
        WHERE carried OR names""",
    "runs_of": "SELECT turn_id FROM episode_runs WHERE episode_id = ANY($1::uuid[])",
    "compacted_subject": f"""
        SELECT id, seat, role, subjects, subjects_involved, exemplar_turn_ids, {_COMPACTED_TEXT} ~* $4 AS names
        FROM episodes e
        WHERE company = $1 AND kind = 'compacted'
          AND (subjects_involved && $2::text[] OR subjects && $2::text[] OR exemplar_turn_ids && $3::text[]
               OR {_COMPACTED_TEXT} ~* $4
               OR EXISTS (SELECT 1 FROM compaction_members m
                          WHERE m.compacted_id = e.id
                            AND (m.runs && $3::text[] OR m.subjects && $2::text[] OR m.record::text ~* $4)))""",
    "members_of": """
        SELECT compacted_id, position, runs, subjects, record FROM compaction_members
        WHERE compacted_id = ANY($1::uuid[]) ORDER BY compacted_id, position""",
    "delete": "DELETE FROM episodes WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
    "past_retention": """
        DELETE FROM episodes WHERE company = $1 AND end_time < $2 RETURNING id, embedding_dims""",
    "provenance": """
        SELECT kind, turn_id, work_key, subjects, senders, subjects_involved, exemplar_turn_ids, compaction_model,
               compaction_prompt_version,
               (SELECT coalesce(jsonb_agg(DISTINCT s), '[]')
                FROM compaction_members m, jsonb_array_elements(m.senders) s
                WHERE m.compacted_id = e.id) AS member_senders,
               ARRAY(SELECT r.turn_id FROM episode_runs r WHERE r.episode_id = e.id ORDER BY r.turn_id) AS runs,
               ARRAY(SELECT DISTINCT t FROM compaction_members m, unnest(m.runs) t
                     WHERE m.compacted_id = e.id ORDER BY t) AS member_runs,
               ARRAY(SELECT DISTINCT p FROM compaction_members m, unnest(m.subjects) p
                     WHERE m.compacted_id = e.id ORDER BY p) AS member_subjects
        FROM episodes e WHERE id = $1 AND company = $2 AND seat = $3""",
    "unanchor": "UPDATE episodes SET exemplar_of = NULL WHERE exemplar_of = ANY($1::uuid[])",
    "strip": """
        UPDATE episodes
        SET subjects_involved = ARRAY(SELECT s FROM unnest(subjects_involved) s WHERE s <> ALL($2::text[])),
            subjects = ARRAY(SELECT s FROM unnest(subjects) s WHERE s <> ALL($2::text[])),
            exemplar_turn_ids = ARRAY(SELECT t FROM unnest(exemplar_turn_ids) t WHERE t <> ALL($3::text[]))
        WHERE id = $1""",
    "drop_members": "DELETE FROM compaction_members WHERE compacted_id = $1 AND NOT (position = ANY($2::int[]))",
    "rederived": """
        UPDATE episodes
        SET label = $2, what_it_did = $3, outcome = $4, review_outcome = $5, tool_sequence = $6, tools_called = $7,
            skills_used = $8, subjects = $9, start_time = $10, end_time = $11, duration_ms = $12, count = $13,
            common_task_pattern = $14, common_outcome = $15, success_rate = $16, done_count = $17,
            subjects_involved = $18, notable_patterns = $19, exemplar_turn_ids = $20, conversation_id = $21,
            compaction_model = $22, compaction_prompt_version = $23
        WHERE id = $1 AND kind = 'compacted'""",
}


@dataclass
class _Redo:
    """A compacted row to re-derive: from the members at ``keep`` (positions), with ``exemplars``."""

    id: uuid.UUID
    seat: str
    role: str | None
    keep: tuple[int, ...]
    records: list[Mapping[str, Any]]
    exemplars: tuple[str, ...]


@dataclass
class _Plan:
    gone: list[Any] = field(default_factory=list)
    """Rows to delete (``id``, ``turn_id``, ``embedding_dims``)."""
    stripped: list[uuid.UUID] = field(default_factory=list)
    """Compacted rows without member records: the person's ids leave them."""
    redo: list[_Redo] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    """Run ids of the person's deleted raw rows."""


def _record(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value)


def _hers(member: asyncpg.Record, target: Target, turns: set[str]) -> bool:
    """A member that carried the person (a run of theirs, a sender) or whose text names them."""
    if set(member["runs"]) & turns or set(member["subjects"]) & set(target.identifiers):
        return True
    return target.names_text(json.dumps(_record(member["record"]), ensure_ascii=False))


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Plan:
    if target.kind is not Kind.SUBJECT:  # a seat's or a company's: every one of the seat (the company)
        rows = await scope_rows(conn, target, "episodes", "id, turn_id, embedding_dims")
        return _Plan(gone=rows, runs=[r["turn_id"] for r in rows if r["turn_id"]])
    ident, turns, pattern = target.identifiers, list(target.turn_ids), target.sql_pattern()
    raw = list(await conn.fetch(SQL["raw_subject"], target.company, ident, turns, pattern))
    # Her turns are the rows that carried her messages; a row that only names her (someone else's
    # turn mentioning her) is deleted too, but its run id is not hers: what else it taught stays.
    carried = [r for r in raw if r["carried"]]
    runs = [r["turn_id"] for r in carried]
    runs += [r["turn_id"] for r in await conn.fetch(SQL["runs_of"], [r["id"] for r in carried])]
    plan = _Plan(gone=list(raw))
    gone_turns = set(turns) | set(runs)
    compacted = list(await conn.fetch(SQL["compacted_subject"], target.company, ident, sorted(gone_turns), pattern))
    members: dict[uuid.UUID, list[asyncpg.Record]] = {}
    for m in await conn.fetch(SQL["members_of"], [r["id"] for r in compacted]):
        members.setdefault(m["compacted_id"], []).append(m)
    for row in compacted:
        kept = members.get(row["id"])
        if kept is None:  # folded before members were kept: strip or delete
            others = [s for s in [*row["subjects_involved"], *row["subjects"]] if s not in ident]
            if row["names"] or not others:
                plan.gone.append({"id": row["id"], "turn_id": None, "embedding_dims": None})
            else:
                plan.stripped.append(row["id"])
            continue
        remaining = [m for m in kept if not _hers(m, target, gone_turns)]
        if not remaining:
            plan.gone.append({"id": row["id"], "turn_id": None, "embedding_dims": None})
            continue
        plan.redo.append(
            _Redo(
                id=row["id"],
                seat=row["seat"],
                role=row["role"],
                keep=tuple(m["position"] for m in remaining),
                records=[_record(m["record"]) for m in remaining],
                exemplars=tuple(t for t in row["exemplar_turn_ids"] if t and t not in gone_turns),
            )
        )
    plan.runs = sorted(gone_turns)
    return plan


def _report(plan: _Plan, target: Target, rederived: Sequence[uuid.UUID] = ()) -> Report:
    report = Report(OWNER)
    if plan.gone:
        report.add("episodes", [r["id"] for r in plan.gone])
    if plan.stripped:
        report.add("episodes", plan.stripped, changed=True)
    if rederived:
        report.add("episodes:rederived", rederived, changed=True)
    if target.kind is Kind.SUBJECT:
        report.turn_ids.update(plan.runs)
    return report


async def find(
    pool: asyncpg.Pool, target: Target, index: VectorIndex | None = None, embedder: Embedder | None = None
) -> Report:
    """What the episodes still hold of the target: rows (and compacted rows to re-derive), and
    (given the index) points of erased raw rows or near the person's names whose rows name them."""
    plan = await _plan(pool, target)
    report = _report(plan, target, [r.id for r in plan.redo])
    await verify_index(pool, index, embedder, OWNER, COLLECTION_BASE, "episodes", _TEXT, target, report)
    return report


def _row_args(episode_id: uuid.UUID, row: Episode, model: str, version: str) -> list[Any]:
    return [
        episode_id, row.label, row.what_it_did, str(row.outcome), row.review_outcome, list(row.tool_sequence),
        list(row.tools_called), list(row.skills_used), list(row.subjects), row.start_time, row.end_time,
        row.duration_ms, row.count, row.common_task_pattern, row.common_outcome, row.success_rate, row.done_count,
        list(row.subjects_involved), list(row.notable_patterns), list(row.exemplar_turn_ids), row.conversation_id,
        model, version,
    ]  # fmt: skip


def _text_of(row: Episode) -> str:
    return " ".join([row.label, row.what_it_did, row.common_task_pattern, row.common_outcome, *row.notable_patterns])


async def erase(
    pool: asyncpg.Pool,
    index: VectorIndex | None,
    target: Target,
    now: datetime,
    rederive: Rederive | None = None,
    prompt_version: str = "",
) -> Report:
    # The model calls run before the owner's transaction (never a model call holding it open);
    # the transaction re-plans and uses a re-derivation only for the very members it was made from.
    ready: dict[tuple[uuid.UUID, tuple[int, ...]], tuple[Episode, str]] = {}
    if target.kind is Kind.SUBJECT and rederive is not None and not await _recorded(pool, target):
        for redo in (await _plan(pool, target)).redo:
            done = await rederive(target.company, redo.seat, redo.role, redo.records, redo.exemplars)
            if done is not None and not target.names_text(_text_of(done[0])):
                ready[redo.id, redo.keep] = done

    async def work(conn: asyncpg.Connection) -> Report:
        plan = await _plan(conn, target)
        rederived: list[uuid.UUID] = []
        for redo in plan.redo:
            done = ready.get((redo.id, redo.keep))
            if done is None:  # no model, a final refusal, or the members changed since: deleted
                plan.gone.append({"id": redo.id, "turn_id": None, "embedding_dims": None})
                continue
            row, model = done
            await conn.execute(SQL["drop_members"], redo.id, list(redo.keep))
            await conn.execute(SQL["rederived"], *_row_args(redo.id, row, model, prompt_version))
            rederived.append(redo.id)
        ids = [r["id"] for r in plan.gone]
        await conn.execute(SQL["unanchor"], ids)
        await conn.execute(SQL["delete"], ids)
        await conn.execute(SQL["pieces"], ids)
        for episode_id in plan.stripped:
            await conn.execute(SQL["strip"], episode_id, target.identifiers, list(target.turn_ids))
        report = _report(plan, target, rederived)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in plan.gone])
        report.turn_ids.update(r["turn_id"] for r in plan.gone if r["turn_id"])
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)


async def _recorded(pool: asyncpg.Pool, target: Target) -> bool:
    found = await pool.fetchval("SELECT 1 FROM episodes_erasures WHERE erasure_id = $1", target.erasure_id)
    return found is not None


def _people(senders: list[dict[str, str]], identifiers: list[str]) -> list[erasure_pb2.ErasureSubject]:
    """The row's people: each sender recorded with it (one person, each identifier in its own field),
    then each identifier no sender names, as a handle (recorded flat, before senders were kept or
    by a caller that named only ``subjects``: its kind is not known). Every identifier used to be
    answered as a handle, an external id as a second person."""
    people = [erasure_pb2.ErasureSubject(**s) for s in senders]
    named = {x for s in senders for x in (s["handle"], s["external_id"]) if x}
    return people + [erasure_pb2.ErasureSubject(handle=p) for p in identifiers if p not in named]


async def provenance(pool: asyncpg.Pool, company: str, seat: str, episode_id: str) -> provenance_pb2.Provenance:
    """A raw row: its run id, the redeliveries collapsed into it, its work key and the people its
    turn carried (:func:`_people`). A compacted row: the union of its members' (their run ids with
    redeliveries, the people they carried, and the people its summary named) and the model and
    prompt version of the compaction; a row folded before members were kept names its exemplars'
    run ids."""
    row = await provenance_row(pool, SQL["provenance"], "episode", episode_id, company, seat, domain=DOMAIN)
    raw = row["kind"] == "raw"
    if raw:
        turns, people, senders = [row["turn_id"], *row["runs"]], list(row["subjects"]), row["senders"]
    elif row["member_runs"]:  # the union of its members' provenance
        turns, senders = list(row["member_runs"]), row["member_senders"]
        people = sorted(set(row["member_subjects"]) | set(row["subjects_involved"]))
    else:  # folded before members were kept: its exemplars
        turns, people, senders = list(row["exemplar_turn_ids"]), list(row["subjects_involved"]), "[]"
    return provenance_pb2.Provenance(
        turn_ids=[t for t in turns if t],
        work_key=(row["work_key"] or "") if raw else "",
        subjects=_people(json.loads(senders), people),
        model="" if raw else row["compaction_model"],
        prompt_version="" if raw else row["compaction_prompt_version"],
        writer="episodist" if raw else "episode_lifecycle",
    )


async def prune_retention(pool: asyncpg.Pool, index: VectorIndex | None, privacy: PrivacyConfig, now: datetime) -> int:
    """Delete episodes (raw and compacted) that ended before their company's
    ``episode_max_age_days`` (with their vectors); how many."""
    return await prune_indexed(
        pool,
        index,
        privacy,
        now,
        table="episodes",
        knob="episode_max_age_days",
        base=COLLECTION_BASE,
        past=SQL["past_retention"],
        also=[SQL["unanchor"]],
    )
