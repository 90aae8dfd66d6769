"""Personal memory: the diary's candidate pool, the one auxiliary relevance filter, the digest.

Both read paths run through :func:`select_notes`: the turn-start ``## Personal memory`` block (the
turn's ask) and ``refresh_memory`` (the model's own hint). The filter is told who triggered the
turn (:func:`party_senders`, applied by :func:`select_notes` itself so both paths tell it the same),
chooses note ids from the pool, and an id it invents is ignored. A use is a selection, never
a candidate: only the notes the filter chose (and the seat was shown) are marked used.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable, NoAuxiliaryModel, Prompt
from services.prefetch import hints
from services.prefetch.domain import HEADINGS, MAX_SENDERS, BlockKind, Sender
from services.prefetch.text import InvalidOutput, content_words, parse_object, prompt

__all__ = [
    "FILTER_PURPOSE",
    "FilterFailed",
    "MemoryNote",
    "memory_filter_rule",
    "party_senders",
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
    # How the pool found it (RecallCandidate): what the offline filter ranks by. Not part of the
    # ledger's row: a cached answer is already a selection.
    similarity: float = 0.0
    lexical_rank: float = 0.0
    found_by: frozenset[str] = frozenset()  # {"vector", "lexical", "recency", "neighbour"}

    @classmethod
    def from_pb(cls, note: diary_pb.Note) -> MemoryNote:
        return cls(**_note_fields(note))

    @classmethod
    def from_candidate(cls, cand: diary_pb.RecallCandidate) -> MemoryNote:
        """A note of RecallNotes' pool with what the pool knows of it (its similarity to the query,
        its lexical rank, the halves that found it). Built in one go: a turn start converts the
        whole pool (~150 candidates): the note's fields are read straight into the constructor, not
        gathered in a dict first (what :func:`_note_fields` gives, spelt out)."""
        note = cand.note
        return cls(
            id=note.id,
            content=note.content,
            tier="short" if note.tier == diary_pb.NOTE_TIER_SHORT else "long",
            create_time=_iso(note.create_time.seconds, note.create_time.nanos) if note.HasField("create_time") else "",
            expire_time=_iso(note.expire_time.seconds, note.expire_time.nanos) if note.HasField("expire_time") else "",
            similarity=float(cand.similarity),
            lexical_rank=float(cand.lexical_rank),
            found_by=_found_by(tuple(cand.found_by)),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MemoryNote:
        return cls(
            id=str(row.get("id", "")),
            content=str(row.get("content", "")),
            tier=str(row.get("tier", "")),
            create_time=str(row.get("create_time", "")),
            expire_time=str(row.get("expire_time", "")),
        )

    def row(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in _ROW}


_ROW = ("id", "content", "tier", "create_time", "expire_time")
_HALVES = {
    diary_pb.RECALL_HALF_VECTOR: "vector",
    diary_pb.RECALL_HALF_LEXICAL: "lexical",
    diary_pb.RECALL_HALF_RECENCY: "recency",
    diary_pb.RECALL_HALF_NEIGHBOUR: "neighbour",
}


_EPOCH = datetime(1970, 1, 1)


class _NoteFields(TypedDict):
    """A diary note's own fields as a :class:`MemoryNote` holds them (what the ledger caches)."""

    id: str
    content: str
    tier: str
    create_time: str
    expire_time: str


def _note_fields(note: diary_pb.Note) -> _NoteFields:
    return {
        "id": note.id,
        "content": note.content,
        "tier": "short" if note.tier == diary_pb.NOTE_TIER_SHORT else "long",
        "create_time": _iso(note.create_time.seconds, note.create_time.nanos) if note.HasField("create_time") else "",
        "expire_time": _iso(note.expire_time.seconds, note.expire_time.nanos) if note.HasField("expire_time") else "",
    }


@functools.lru_cache(maxsize=16384)
def _iso(seconds: int, nanos: int) -> str:
    """A Timestamp as ``Timestamp.ToDatetime().isoformat()`` writes it (naive UTC, microseconds),
    remembered: a seat's notes come back turn after turn, and formatting them was the costliest
    part of converting a pool (analysis §2.1)."""
    return (_EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)).isoformat()


@functools.lru_cache(maxsize=64)
def _found_by(halves: tuple[Any, ...]) -> frozenset[str]:  # RecallHalf values
    return frozenset(_HALVES[h] for h in halves if h in _HALVES)


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


def party_senders(senders: Iterable[Sender]) -> list[Sender]:
    """Who the filter is told triggered the turn: every distinct sender that names someone, in the
    order given, at most :data:`MAX_SENDERS`. A handle alone is a sender (the contract takes one):
    with no platform it has no counterparty profile, but it is still a party to the task, and the
    filter's per-subject rule has nothing else to judge that by. Distinct by platform and identity
    as a profile is filed (:attr:`Sender.key`; a sender with neither handle nor external id by its
    display name), so one person sent twice is told once; a sender naming no one is dropped."""
    seen: dict[tuple[str, str], Sender] = {}
    for s in senders:
        platform, ident = s.key
        ident = ident or s.display_name.strip()
        if ident:
            seen.setdefault((platform, ident), s)
    return list(seen.values())[:MAX_SENDERS]


async def select_notes(
    aux: AuxiliaryModel,
    attribution: Any,
    query: str,
    senders: Sequence[Sender],
    notes: Sequence[MemoryNote],
    max_selected: int,
    timeout: float,
    *,
    model: bool = True,
) -> list[MemoryNote]:
    """The filter's choice from ``notes`` for ``query`` (in the filter's order, at most
    ``max_selected``), told of ``senders`` as the engine sent them (:func:`party_senders` picks
    whom). An empty pool asks nothing. ``model`` False: no model is asked, the offline rule ranks
    the pool (:func:`memory_filter_rule`; the turn's budget is spent). Raises :class:`FilterFailed`."""
    if not notes:
        return []
    senders = party_senders(senders)
    listing, by_short = _describe(notes)
    who = ", ".join(f"{s.name} ({s.platform})" if s.platform else s.name for s in senders) or "(no sender named)"
    request = Prompt(
        purpose=FILTER_PURPOSE,
        system=_SYSTEM.substitute(max_selected=max_selected),
        user=_USER.substitute(query=query.strip(), senders=who, candidates=listing),
        data={
            "query": query,
            "senders": [s.words() for s in senders],
            # What the pool already knows of each note, for the offline rule (a model reads the
            # listing above; these never reach it).
            "candidates": [
                {
                    "id": k,
                    "content": n.content,
                    "similarity": n.similarity,
                    "lexical_rank": n.lexical_rank,
                    "found_by": sorted(n.found_by),
                    "create_time": n.create_time,
                }
                for k, n in by_short.items()
            ],
            "max_selected": max_selected,
        },
        max_tokens=16 + 8 * max_selected,
        json_output=True,
    )
    if not model:
        text = memory_filter_rule(request.data)
    else:
        try:
            text = (await aux.complete(attribution, request, timeout=timeout)).text
        except AuxiliaryUnavailable as err:
            raise FilterFailed(err.kind, str(err)) from err
        except NoAuxiliaryModel as err:
            raise FilterFailed("no_model", str(err)) from err
        except TimeoutError as err:
            raise FilterFailed("timeout", "the filter did not answer in time") from err
    try:
        answer = parse_object(text)
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


# The fused score a note must reach to be shown offline (0..1, relative to the pool's best; see
# docs/services/prefetch.md, "The offline memory filter"). A fifth of the best: a note neither half
# ranks in the upper part of its range is not shown.
FUSED_FLOOR = 0.2
# What naming a party to the task adds: as much as being the pool's best match on one signal.
SENDER_LIFT = 0.5


def fused_scores(candidates: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each candidate's fused score in 0..1: the mean of its vector similarity, min-max scaled over
    the pool's vector hits (the best hit 1, the weakest 0; a lone hit, or hits all alike, 1), and
    its lexical rank over the pool's highest (a note the lexical half did not find: 0). Equal
    weights: neither signal is known to be the better one for an arbitrary seat, and both are
    already scaled to the same range by what this pool holds, so nothing is fitted to a data set."""
    sims = [float(c.get("similarity", 0.0)) for c in candidates if "vector" in c.get("found_by", ())]
    lo, hi = (min(sims), max(sims)) if sims else (0.0, 0.0)
    lex_max = max((float(c.get("lexical_rank", 0.0)) for c in candidates), default=0.0)
    out = []
    for c in candidates:
        vec = 0.0
        if "vector" in c.get("found_by", ()):
            vec = (float(c.get("similarity", 0.0)) - lo) / (hi - lo) if hi > lo else 1.0
        lex = float(c.get("lexical_rank", 0.0)) / lex_max if lex_max > 0 else 0.0
        out.append(0.5 * vec + 0.5 * lex)
    return out


def memory_filter_rule(data: Mapping[str, Any]) -> str:
    """The offline filter: rank the pool by what it already knows — the fused vector similarity and
    lexical rank (:func:`fused_scores`) — plus :data:`SENDER_LIFT` for a note whose words name a
    sender (a note about a party to the task bears on it whatever its topic); newest first among
    equals; a note below :data:`FUSED_FLOOR` is not shown (so a recency-only note that names no
    sender never is: offline there is nothing to judge its bearing by)."""
    candidates = list(data.get("candidates", []))
    names: set[str] = set()
    for words in data.get("senders", []):
        for w in words:
            names.update(content_words(str(w)))
            names.add(str(w).casefold())
    scores = fused_scores(candidates)
    ranked = []
    for i, (cand, score) in enumerate(zip(candidates, scores, strict=True)):
        if names and names & set(content_words(str(cand.get("content", "")))):
            score += SENDER_LIFT
        if score >= FUSED_FLOOR:
            ranked.append((-score, -_timestamp(str(cand.get("create_time", ""))), i, cand["id"]))
    ranked.sort()
    limit = int(data.get("max_selected", 10))
    return json.dumps({"selected": [cid for *_, cid in ranked[:limit]]})


def _timestamp(iso: str) -> float:
    """A note's ``create_time`` as seconds (the recency tie-break); an unknown time is oldest."""
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else 0.0
    except ValueError:
        return 0.0
