"""The knowledge the prefetch shows, read from the knowledge service through its ``Searcher`` seam.

``## Relevant knowledge`` (spec: "Relevant-knowledge prefetch"): the auxiliary model writes a short
keyword query from the turn's ask, the knowledge service runs it scoped to the seat (its role's
containers, the company's ``knowledge.scope``, its own permission), and the block renders title +
snippet bullets with a sentence on how to open full bodies (no tool is named: the role's own
knowledge tools do it).

- ``can_search`` says no: nothing is asked and nothing rendered.
- Thin trigger: no query, no search; ``EmptyKnowledgeHint``.
- Query generation failed: nothing to search with, so the block renders nothing.
- The search ran and found nothing: ``EmptyKnowledgeHint``.
- The search did not run (unreachable, a refused credential, rate limited — the outcome served no
  mode): the could-not-be-searched hint, never the empty one, and ``source_error`` says why.

``## First-turn onboarding`` lists the Onboarding pages of the seat's unit chain until it calls
``mark_onboarded`` for that chain. ``render_search_result`` is ``search_knowledge``'s answer in
words. Every read records ``knowledge_read`` on the knowledge service's side, naming the pages.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentlearn.common.v1 import embedding_pb2
from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable, NoAuxiliaryModel, Prompt
from services.knowledge.domain import (
    KnowledgeHit,
    ReadContext,
    Reader,
    ReadSource,
    SearchOutcome,
    UnsearchedReason,
)
from services.prefetch import hints
from services.prefetch.deps import Deps, Who
from services.prefetch.domain import HEADINGS, Block, BlockKind, TurnStart, chain_hash, one_line
from services.prefetch.text import content_words, prompt

__all__ = [
    "FULL_BODY_CHARS",
    "QUERY_PURPOSE",
    "knowledge_query_rule",
    "onboarding_block",
    "relevant_knowledge",
    "render_block",
    "render_hits",
    "render_search_result",
    "search",
    "write_query",
]

_log = logging.getLogger(__name__)

QUERY_PURPOSE = "knowledge_query"
_SYSTEM = prompt("knowledge_query.system.md")
_USER = prompt("knowledge_query.user.md")
SNIPPET_CHARS = 300
FULL_BODY_CHARS = 8000
"""The most of a page's body one search_knowledge answer shows (the rest is named by its size)."""

_SOURCE_ERROR = {
    UnsearchedReason.UNREACHABLE: "knowledge: unreachable",
    UnsearchedReason.CREDENTIAL_REFUSED: "knowledge: credential refused",
    UnsearchedReason.RATE_LIMITED: "knowledge: rate limited",
}
"""A search that did not run, as the block's ``source_error`` (the summary's account)."""


async def write_query(aux: AuxiliaryModel, who: Who, ask: str, timeout: float) -> str | None:
    """A short keyword query from the ask, or None when no model answered usably."""
    request = Prompt(
        purpose=QUERY_PURPOSE,
        system=_SYSTEM.template,
        user=_USER.substitute(ask=ask.strip()),
        data={"ask": ask},
        max_tokens=48,
    )
    try:
        completion = await asyncio.wait_for(
            aux.complete(who.attribution(QUERY_PURPOSE), request, timeout=timeout), timeout
        )
    except (AuxiliaryUnavailable, NoAuxiliaryModel, TimeoutError) as err:
        _log.info("knowledge query not written: %s", err)
        return None
    lines = [ln for ln in completion.text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    query = lines[0].strip().strip("\"'`").strip()
    if query.lower().startswith("knowledge-base search query:"):
        query = query.split(":", 1)[1].strip()
    return query or None


async def search(
    deps: Deps,
    reader: Reader,
    query: str,
    limit: int,
    context: ReadContext,
    *,
    vector: embedding_pb2.Embedding | None = None,
) -> SearchOutcome:
    """The seam's outcome, trimmed to ``limit``. The seam never raises by contract; a searcher that
    does anyway (a bug) is a search that did not run, never a failed turn."""
    try:
        outcome = await deps.searcher.search(reader, query, limit, context, vector=vector)
    except Exception:
        _log.exception("knowledge search for %s raised", reader)
        return SearchOutcome.did_not_run(UnsearchedReason.UNREACHABLE, "the search raised")
    if outcome.ran and len(outcome.hits) > limit:
        return SearchOutcome(outcome.served, None, outcome.hits[:limit])
    return outcome


def render_hits(hits: Sequence[KnowledgeHit]) -> str:
    lines = []
    for hit in hits:
        snippet = one_line(hit.snippet)
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " …"
        lines.append(f"- **{one_line(hit.title)}** ({hit.container})" + (f": {snippet}" if snippet else ""))
    return "\n".join(lines)


def render_block(outcome: SearchOutcome | None, *, gated: bool) -> str:
    """The block's markdown: the gate's hint, the could-not-be-searched hint for a search that did
    not run, the empty hint for one that ran and matched nothing, else the pages."""
    heading = HEADINGS[BlockKind.RELEVANT_KNOWLEDGE]
    if gated or outcome is None:
        return f"{heading}\n{hints.EMPTY_KNOWLEDGE_HINT}"
    if not outcome.ran:
        return f"{heading}\n{hints.UNSEARCHED_KNOWLEDGE_HINT}"
    if not outcome.hits:
        return f"{heading}\n{hints.EMPTY_KNOWLEDGE_HINT}"
    return f"{heading}\n{hints.KNOWLEDGE_INTRO}\n{render_hits(outcome.hits)}"


async def relevant_knowledge(
    deps: Deps,
    start: TurnStart,
    who: Who,
    turn_vector: Callable[[], Awaitable[embedding_pb2.Embedding | None]] | None = None,
) -> Block:
    """``## Relevant knowledge`` of one turn: query, search, render; degrades, never fails the turn.

    ``turn_vector``: the turn's ask vector (embedded once a turn, shared with the memory and episode
    searches), handed to the search so that its vector half ranks by it and the turn start runs the
    model once; None (no embedder, or the embed failed) lets the knowledge service embed the query."""
    block = Block(BlockKind.RELEVANT_KNOWLEDGE)
    reader = Reader(start.company, start.seat, start.role)
    if not await deps.searcher.can_search(reader):
        return block
    if start.gated:
        block.markdown = render_block(None, gated=True)
        return block
    prefetch = deps.settings.learning.prefetch
    query = await write_query(deps.aux, who, start.ask, prefetch.aux_timeout_seconds)
    if query is None:
        return block  # nothing to search with: show nothing rather than a guess
    context = ReadContext(ReadSource.RELEVANT_KNOWLEDGE, start.turn_id)
    vector = None if turn_vector is None else await turn_vector()
    outcome = await search(deps, reader, query, prefetch.knowledge_results, context, vector=vector)
    if not outcome.ran:
        if outcome.unsearched in _SOURCE_ERROR:
            block.source_error = _SOURCE_ERROR[outcome.unsearched]
            block.markdown = render_block(outcome, gated=False)
        return block  # scoped to nothing or unconfigured since can_search: nothing to show
    block.markdown = render_block(outcome, gated=False)
    if outcome.hits:
        block.selection_count = len(outcome.hits)
        block.ids = [h.page_id for h in outcome.hits]
    return block


async def onboarding_block(deps: Deps, start: TurnStart, marker: tuple[str | None] | None = None) -> Block:
    """``## First-turn onboarding``: the unit chain's Onboarding pages until the seat marks this
    chain onboarded. ``marker``: the seat's marker already read with the run's claim (one-tuple of
    the value), else it is read here."""
    block = Block(BlockKind.ONBOARDING)
    seen = (await deps.store.marker(start.company, start.seat),) if marker is None else marker
    if seen[0] == chain_hash(start.unit_chain):
        return block
    reader = Reader(start.company, start.seat, start.role)
    outcome = await deps.searcher.onboarding_pages(
        reader, list(start.unit_chain), ReadContext(ReadSource.ONBOARDING, start.turn_id)
    )
    if not outcome.ran:
        if outcome.unsearched in _SOURCE_ERROR:
            block.source_error = _SOURCE_ERROR[outcome.unsearched]
        return block
    if not outcome.hits:
        return block
    chain = " › ".join(start.unit_chain) or "no unit"
    block.markdown = "\n".join(
        [HEADINGS[BlockKind.ONBOARDING], hints.ONBOARDING_INTRO.format(chain=chain), render_hits(outcome.hits)]
    )
    block.selection_count = len(outcome.hits)
    block.ids = [h.page_id for h in outcome.hits]
    return block


def knowledge_query_rule(data: Mapping[str, Any]) -> str:
    """The offline query: the ask's first eight content words."""
    return " ".join(content_words(str(data.get("ask", "")), stem=False)[:8])


# ------------------------------------------------------------------------------ search_knowledge

_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def _quoted(query: str) -> str:
    flat = _WS.sub(" ", query).strip()
    return f'"{flat[:200]}…"' if len(flat) > 200 else f'"{flat}"'


def render_search_result(outcome: SearchOutcome, query: str) -> str:
    """search_knowledge's answer (spec: "The executor asks instead"): the pages as bullets, a page
    whose title is the query shown whole, or one sentence saying which case it is — a backend that
    is unreachable, refused the seat's credential, is rate-limiting, is not configured, a scope of
    nothing, or a search that ran and matched nothing. Only the last says anything about what the
    company has written down."""
    q = _quoted(query)
    reason = outcome.unsearched
    detail = f" ({outcome.detail})" if outcome.detail else ""
    if reason is UnsearchedReason.UNREACHABLE:
        return (
            f"The knowledge base could not be searched for {q} just now: the backend did not answer{detail}, "
            "so the search did not run. This says nothing about whether such a page exists — do not conclude "
            "it is undocumented or write a duplicate; try again shortly."
        )
    if reason is UnsearchedReason.CREDENTIAL_REFUSED:
        return (
            f"The knowledge base refused the credential your search runs as{detail}, so the search for {q} "
            "did not run. This says nothing about whether such a page exists; an operator must fix the "
            "credential (knowledge.seat_credentials or knowledge.confluence.token)."
        )
    if reason is UnsearchedReason.RATE_LIMITED:
        return (
            f"The knowledge base is rate-limiting searches{detail}, so the search for {q} did not run. This "
            "says nothing about whether such a page exists; try again in a minute."
        )
    if reason is UnsearchedReason.UNCONFIGURED:
        return f"No knowledge base is configured for this deployment, so there are no team pages to search for {q}."
    if reason is UnsearchedReason.SCOPED_TO_NOTHING:
        return (
            f"Your role cannot read any knowledge-base container, so a search for {q} is scoped to nothing "
            "and can find no page. An operator grants access by giving the role knowledge containers."
        )
    if not outcome.hits:
        return (
            f"The knowledge base was searched for {q} in the containers your role can read, and no page "
            "matched. Try other words — a system, service, team or ticket name your recon turned up."
        )
    lines = [f"Knowledge-base pages for {q}, best match first:"]
    for hit in outcome.hits:
        snippet = f": {hit.snippet}" if hit.snippet else ""
        lines.append(f"- **{hit.title}** (container {hit.container}, page {hit.page_id}){snippet}")
    whole = next((h for h in outcome.hits if h.body and _norm(h.title) == _norm(query)), None)
    if whole is None:
        lines.append("")
        lines.append("To read a page whole, search for its exact title.")
        return "\n".join(lines)
    body = whole.body
    if len(body) > FULL_BODY_CHARS:
        cut = body[:FULL_BODY_CHARS].rsplit(" ", 1)[0]
        body = f"{cut}\n\n[… {len(whole.body) - len(cut):,} more characters not shown]"
    lines += ["", f"### {whole.title}", "", body]
    return "\n".join(lines)
