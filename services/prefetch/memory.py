"""Personal memory: the diary's candidate pool, the one auxiliary relevance filter, the digest.

Both read paths run through :func:`select_notes`: the turn-start ``## Personal memory`` block (the
turn's ask) and ``refresh_memory`` (the model's own hint). The filter is told who triggered the
turn, chooses note ids from the pool, and an id it invents is ignored. A use is a selection, never
a candidate: only the notes the filter chose (and the seat was shown) are marked used.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable, NoAuxiliaryModel, Prompt
from services.prefetch import hints
from services.prefetch.domain import HEADINGS, BlockKind, Sender
from services.prefetch.text import InvalidOutput, content_words, parse_object, prompt

__all__ = [
    "FILTER_PURPOSE",
    "FilterFailed",
    "MemoryNote",
    "memory_filter_rule",
    "render_block",
    "render_notes",
    "select_notes",
]

_log = logging.getLogger(__name__)

FILTER_PURPOSE = "memory_filter"
_SYSTEM = prompt("memory_filter.system.md")
_USER = prompt("memory_filter.user.md")


@dataclass(frozen=True)
class MemoryNote:
    """A diary note as the prefetch renders and the ledger caches it."""

    id: str
    content: str
    tier: str  # "long" | "short"
    create_time: str  # ISO date-time
    expire_time: str = ""  # ISO date-time; empty for a LONG note

    @classmethod
    def from_pb(cls, note: diary_pb.Note) -> MemoryNote:
        return cls(
            id=note.id,
            content=note.content,
            tier="short" if note.tier == diary_pb.NOTE_TIER_SHORT else "long",
            create_time=note.create_time.ToDatetime().isoformat() if note.HasField("create_time") else "",
            expire_time=note.expire_time.ToDatetime().isoformat() if note.HasField("expire_time") else "",
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MemoryNote:
        return cls(**{k: str(row.get(k, "")) for k in ("id", "content", "tier", "create_time", "expire_time")})

    def row(self) -> dict[str, str]:
        return asdict(self)


class FilterFailed(Exception):
    """The relevance filter did not answer usably; ``kind`` says why."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def _describe(notes: Sequence[MemoryNote]) -> tuple[str, dict[str, MemoryNote]]:
    by_short: dict[str, MemoryNote] = {}
    lines = []
    for i, note in enumerate(notes, 1):
        short = f"n{i}"
        by_short[short] = note
        when = note.create_time[:10]
        tier = f"situational, until {note.expire_time[:10]}" if note.tier == "short" else "durable"
        lines.append(f"[{short}] ({tier}; written {when}) {' '.join(note.content.split())}")
    return "\n".join(lines), by_short


async def select_notes(
    aux: AuxiliaryModel,
    attribution: Any,
    query: str,
    senders: Sequence[Sender],
    notes: Sequence[MemoryNote],
    max_selected: int,
    timeout: float,
) -> list[MemoryNote]:
    """The filter's choice from ``notes`` for ``query`` (in the filter's order, at most
    ``max_selected``). An empty pool asks nothing. Raises :class:`FilterFailed`."""
    if not notes:
        return []
    listing, by_short = _describe(notes)
    who = ", ".join(f"{s.name} ({s.platform})" if s.platform else s.name for s in senders) or "(no sender named)"
    request = Prompt(
        purpose=FILTER_PURPOSE,
        system=_SYSTEM.substitute(max_selected=max_selected),
        user=_USER.substitute(query=query.strip(), senders=who, candidates=listing),
        data={
            "query": query,
            "senders": [s.words() for s in senders],
            "candidates": [{"id": k, "content": n.content} for k, n in by_short.items()],
            "max_selected": max_selected,
        },
        max_tokens=16 + 8 * max_selected,
        json_output=True,
    )
    try:
        completion = await aux.complete(attribution, request, timeout=timeout)
    except AuxiliaryUnavailable as err:
        raise FilterFailed(err.kind, str(err)) from err
    except NoAuxiliaryModel as err:
        raise FilterFailed("no_model", str(err)) from err
    except TimeoutError as err:
        raise FilterFailed("timeout", "the filter did not answer in time") from err
    try:
        answer = parse_object(completion.text)
    except InvalidOutput as err:
        raise FilterFailed("invalid_output", str(err)) from err
    chosen = answer.get("selected", [])
    if not isinstance(chosen, list):
        raise FilterFailed("invalid_output", "'selected' is not a list")
    out: list[MemoryNote] = []
    for value in chosen:
        note = by_short.get(str(value).strip())
        if note is None:
            _log.info("memory filter named an id it was not shown: %r", value)  # invented: ignored
            continue
        if note not in out:
            out.append(note)
    return out[:max_selected]


def render_notes(notes: Sequence[MemoryNote]) -> str:
    """The digest's bullets: each note verbatim (continuation lines indented), a situational note
    with the date it stops being true."""
    lines = []
    for note in notes:
        content = note.content.strip().replace("\n", "\n  ")
        suffix = f" (situational, until {note.expire_time[:10]})" if note.tier == "short" and note.expire_time else ""
        lines.append(f"- {content}{suffix}")
    return "\n".join(lines)


def render_block(notes: Sequence[MemoryNote], *, has_notes: bool) -> str:
    """The ``## Personal memory`` block: the digest, else the hint when the seat has notes at all
    (a seat with none has nothing to refresh), else nothing."""
    heading = HEADINGS[BlockKind.PERSONAL_MEMORY]
    if notes:
        return f"{heading}\n{hints.MEMORY_INTRO}\n{render_notes(notes)}"
    if has_notes:
        return f"{heading}\n{hints.EMPTY_MEMORY_HINT}"
    return ""


# ------------------------------------------------------------------------------------ offline


def memory_filter_rule(data: Mapping[str, Any]) -> str:
    """The offline filter: a note that shares a content word with the query, or whose words name a
    sender (a note about a party to the task bears on it whatever its topic). Most shared words
    first, then pool order."""
    query = set(content_words(str(data.get("query", ""))))
    names: set[str] = set()
    for words in data.get("senders", []):
        for w in words:
            names.update(content_words(str(w)))
            names.add(str(w).casefold())
    scored = []
    for i, cand in enumerate(data.get("candidates", [])):
        words = set(content_words(str(cand.get("content", ""))))
        score = len(words & query) + (2 if words & names else 0)
        if score:
            scored.append((-score, i, cand["id"]))
    limit = int(data.get("max_selected", 10))
    return json.dumps({"selected": [cid for _, _, cid in sorted(scored)[:limit]]})
