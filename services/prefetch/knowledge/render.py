"""The ``search_knowledge`` tool's answer in words (spec: "The executor asks instead").

A tool is cheap to be honest about: a backend that is unreachable, unconfigured or scoped to
nothing answers with a sentence saying which, and a search that ran and found nothing says that —
four different sentences, because "nothing surfaced" is a claim about what the company has
written down and only a search that ran can make it.
"""

from __future__ import annotations

import re

from services.prefetch.knowledge.domain import SearchOutcome

__all__ = ["FULL_BODY_CHARS", "render_search_result"]

FULL_BODY_CHARS = 8000
"""The most of a page's body one answer shows (the rest is named by its size)."""

_WS = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def _quoted(query: str) -> str:
    flat = _WS.sub(" ", query).strip()
    return f'"{flat[:200]}…"' if len(flat) > 200 else f'"{flat}"'


def render_search_result(outcome: SearchOutcome, query: str) -> str:
    """The tool result: the pages as bullets (title, container, snippet), a page whose title is the
    query shown whole, or one sentence saying why there is nothing."""
    q = _quoted(query)
    if outcome.status == "unreachable":
        return (
            f"The knowledge base could not be searched for {q} just now: the backend did not answer, so "
            "the search did not run. This says nothing about whether such a page exists — do not conclude "
            "it is undocumented or write a duplicate; try again shortly."
        )
    if outcome.status == "unconfigured":
        return f"No knowledge base is configured for this deployment, so there are no team pages to search for {q}."
    if outcome.status == "scoped_to_nothing":
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
