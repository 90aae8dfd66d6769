"""``## Relevant knowledge``: the auxiliary model writes a short keyword query from the turn's ask,
the ``Searcher`` runs it scoped to the role's containers, and the block renders title + snippet
bullets with a sentence on how to open full bodies (no tool is named: the role's own knowledge tools
do it).

- ``can_search`` says no: nothing is asked and nothing rendered.
- Thin trigger: no query, no search; ``EmptyKnowledgeHint``.
- Query generation failed: nothing to search with, so the block renders nothing.
- The search ran and found nothing: ``EmptyKnowledgeHint``.
- The search did not run (backend unreachable, or the seam answered no mode): the
  could-not-be-searched hint, never the empty one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable, NoAuxiliaryModel, Prompt
from services.prefetch import hints
from services.prefetch.deps import Who
from services.prefetch.domain import HEADINGS, BlockKind, one_line
from services.prefetch.text import content_words, prompt

__all__ = ["QUERY_PURPOSE", "hit_fields", "knowledge_query_rule", "render_hits", "write_query"]

_log = logging.getLogger(__name__)

QUERY_PURPOSE = "knowledge_query"
_SYSTEM = prompt("knowledge_query.system.md")
_USER = prompt("knowledge_query.user.md")
SNIPPET_CHARS = 300


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


def hit_fields(hit: Any) -> tuple[str, str, str, str]:
    """(page_id, title, container, snippet) of a searcher's hit (an object or a 4-tuple)."""
    if isinstance(hit, tuple | list):
        page_id, title, container, snippet = hit
        return str(page_id), str(title), str(container), str(snippet)
    return str(hit.page_id), str(hit.title), str(hit.container), str(getattr(hit, "snippet", ""))


def render_hits(hits: list[Any]) -> str:
    lines = []
    for hit in hits:
        _, title, container, snippet = hit_fields(hit)
        snippet = one_line(snippet)
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " …"
        lines.append(f"- **{one_line(title)}** ({container})" + (f": {snippet}" if snippet else ""))
    return "\n".join(lines)


def render_block(outcome_status: str | None, hits: list[Any], *, gated: bool) -> str:
    heading = HEADINGS[BlockKind.RELEVANT_KNOWLEDGE]
    if gated:
        return f"{heading}\n{hints.EMPTY_KNOWLEDGE_HINT}"
    if outcome_status != "searched":
        return f"{heading}\n{hints.UNSEARCHED_KNOWLEDGE_HINT}"
    if not hits:
        return f"{heading}\n{hints.EMPTY_KNOWLEDGE_HINT}"
    return f"{heading}\n{hints.KNOWLEDGE_INTRO}\n{render_hits(hits)}"


def knowledge_query_rule(data: Mapping[str, Any]) -> str:
    """The offline query: the ask's first eight content words."""
    return " ".join(content_words(str(data.get("ask", "")), stem=False)[:8])
