"""The knowledge's part of an erasure (issue 17, ``libs.common.erasure``): the native pages written
from a person's sessions (their lessons, named by the sessions owner) and every page that names
them (lessons, promotion drafts) are deleted with their vectors; a company's erasure deletes all of
its pages. A seat has no pages of its own (pages are the company's).

Promotion drafts are found through their recorded provenance too (``draft_provenance``), which is
exact where text matching is not: a draft distilled from runs that include one of the person's
turns (or, for a seat, one of the seat's runs) may quote what was asked without naming anyone, so
a native draft resting on them is deleted with its record (deleting is always correct: the pass
drafts it again if the team converges again). A draft whose record names the person among the
people its runs answered (``provenance.subjects``), or in its title, is theirs the same way, even
when none of its runs was collected as theirs (their reflection and episodes past retention).
Confluence pages are the customer's own system and are not touched: the record of such a draft
loses the person's (or seat's) runs and its list of people; a record resting on them alone, or
whose title names them, is deleted."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from libs.common.embeddings import Embedder
from libs.common.erasure import Kind, Report, Target, run_once, verify_index
from libs.common.vectorindex import VectorIndex
from services.knowledge.domain import COLLECTION_BASE

__all__ = ["OWNER", "erase", "find"]

OWNER = "knowledge"

SQL = {
    "subject": """
        SELECT id, embedding_dims FROM knowledge_pages
        WHERE company = $1
          AND (id = ANY($2::uuid[]) OR (title || ' ' || body || ' ' || array_to_string(parent_titles, ' ')) ~* $3)""",
    "company": "SELECT id, embedding_dims FROM knowledge_pages WHERE company = $1",
    "delete": "DELETE FROM knowledge_pages WHERE id = ANY($1::uuid[])",
    "pieces": "DELETE FROM fill_pieces WHERE row_id = ANY($1::uuid[])",
    # Drafts resting on the person's runs (or the seat's), naming them among the people the runs
    # answered ($5: their identifiers, an entry's handle or external id) or in the title ($6: their
    # whole-word pattern), and the records of pages going anyway.
    "drafts": """
        SELECT page_id, backend, sources, provenance, title ~* $6 AS named FROM draft_provenance
        WHERE company = $1 AND (turn_ids && $2::text[] OR seats && $3::text[] OR page_id = ANY($4::text[])
               OR title ~* $6
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(provenance->'subjects', '[]'::jsonb)) s
                          WHERE s->>'handle' = ANY($5::text[]) OR s->>'external_id' = ANY($5::text[])))""",
    "drafts_company": "SELECT page_id, backend, sources, provenance FROM draft_provenance WHERE company = $1",
    "delete_drafts": "DELETE FROM draft_provenance WHERE company = $1 AND page_id = ANY($2::text[])",
    "scrub_draft": """
        UPDATE draft_provenance SET seats = $3, turn_ids = $4, sources = $5::jsonb, provenance = $6::jsonb
        WHERE company = $1 AND page_id = $2""",
    "draft_pages": "SELECT id, embedding_dims FROM knowledge_pages WHERE company = $1 AND id = ANY($2::uuid[])",
}


def _uuids(values: tuple[str, ...] | list[str]) -> list[uuid.UUID]:
    out = []
    for v in values:
        try:
            out.append(uuid.UUID(v))
        except ValueError:
            continue  # a page of another backend: not ours
    return out


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class _Plan:
    def __init__(self, pages: list[asyncpg.Record]) -> None:
        self.pages = pages
        """Native pages deleted (id, embedding_dims)."""
        self.drafts_gone: list[str] = []
        """Draft records deleted (their native page goes too)."""
        self.drafts_scrubbed: list[tuple[str, list[dict[str, str]], dict[str, Any]]] = []
        """Records of drafts kept elsewhere (Confluence): (page id, remaining sources, provenance)."""


async def _plan(conn: asyncpg.Connection | asyncpg.Pool, target: Target) -> _Plan:
    if target.kind is Kind.COMPANY:
        plan = _Plan(list(await conn.fetch(SQL["company"], target.company)))
        plan.drafts_gone = [r["page_id"] for r in await conn.fetch(SQL["drafts_company"], target.company)]
        return plan
    pattern = target.sql_pattern()  # "a^" (nothing) for a seat
    if target.kind is Kind.SUBJECT:
        pages = list(await conn.fetch(SQL["subject"], target.company, _uuids(target.page_ids), pattern))
        turns, seats = list(target.turn_ids), []
    else:  # a seat: the lessons its sessions taught alone (named by the sessions owner), its drafts
        pages = list(await conn.fetch(SQL["subject"], target.company, _uuids(target.page_ids), pattern))
        turns, seats = [], [target.seat]
    plan = _Plan(pages)
    going = [str(r["id"]) for r in pages]
    native: list[str] = []
    drafts = await conn.fetch(SQL["drafts"], target.company, turns, seats, going, target.identifiers, pattern)
    for row in drafts:
        if row["backend"] == "native" or row["page_id"] in going:
            plan.drafts_gone.append(row["page_id"])
            native.append(row["page_id"])
            continue
        sources = [
            s for s in _json(row["sources"]) if s.get("turn_id") not in set(turns) and s.get("seat") not in set(seats)
        ]
        if row["named"] or not sources:
            # A record whose title names them, or resting on them (their runs, the seat's) alone: the
            # record goes (the page is the customer's and stays).
            plan.drafts_gone.append(row["page_id"])
            continue
        provenance = dict(_json(row["provenance"]))
        provenance["turn_ids"] = [s["turn_id"] for s in sources]
        # The people the runs answered are kept as the episodes name them: bare handles and external
        # ids, a person's two side by side and unpaired, so which of them were theirs cannot be told
        # from the record. The list goes whole; the remaining runs still lead to their people
        # through their episodes (GetEpisodeProvenance).
        provenance.pop("subjects", None)
        plan.drafts_scrubbed.append((row["page_id"], sources, provenance))
    extra = [u for u in _uuids(native) if str(u) not in going]
    if extra:
        plan.pages += list(await conn.fetch(SQL["draft_pages"], target.company, extra))
    return plan


def _report(plan: _Plan, *, finding: bool) -> Report:
    report = Report(OWNER)
    if plan.pages or not finding:
        report.add("knowledge_pages", [r["id"] for r in plan.pages])
    if plan.drafts_gone:
        report.add("draft_provenance", plan.drafts_gone)
    if plan.drafts_scrubbed:
        report.add("draft_provenance", [p for p, _, _ in plan.drafts_scrubbed], changed=True)
    return report


async def find(
    pool: asyncpg.Pool, target: Target, index: VectorIndex | None = None, embedder: Embedder | None = None
) -> Report:
    """What the knowledge store still holds of the target: pages and drafts, and (given the index)
    points of erased pages or near the person's names whose pages name them (``verify_index``; the
    index payload's seat is the page's container)."""
    report = _report(await _plan(pool, target), finding=True)
    await verify_index(
        pool, index, embedder, OWNER, COLLECTION_BASE, "knowledge_pages", "title || ' ' || body", target, report,
        scope="container",
    )  # fmt: skip
    return report


async def erase(pool: asyncpg.Pool, index: VectorIndex | None, target: Target, now: datetime) -> Report:
    async def work(conn: asyncpg.Connection) -> Report:
        plan = await _plan(conn, target)
        ids = [r["id"] for r in plan.pages]
        await conn.execute(SQL["delete"], ids)
        await conn.execute(SQL["pieces"], ids)
        await conn.execute(SQL["delete_drafts"], target.company, plan.drafts_gone)
        for page_id, sources, provenance in plan.drafts_scrubbed:
            await conn.execute(
                SQL["scrub_draft"],
                target.company,
                page_id,
                sorted({s["seat"] for s in sources}),
                [s["turn_id"] for s in sources],
                json.dumps(sources),
                json.dumps(provenance),
            )
        report = _report(plan, finding=False)
        report.add_points(COLLECTION_BASE, [(r["id"], r["embedding_dims"]) for r in plan.pages])
        return report

    return await run_once(pool, OWNER, target, now, work, index=index)
