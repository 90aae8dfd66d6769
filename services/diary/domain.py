"""The diary's domain: notes, tiers, recall candidates, and the rules that are data."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from libs.common.embeddings import Vector as QueryVector  # a query's vector and its model
from libs.common.memory_tiers import MAX_TTL_DAYS
from libs.common.vector_path import EmbeddingStatus, VectorSource

__all__ = [
    "COLLECTION_BASE",
    "DOMAIN",
    "MAX_TTL_DAYS",
    "WORK_KEYED_SOURCES",
    "Candidate",
    "Note",
    "NoteSource",
    "NoteTier",
    "QueryVector",
    "Recall",
    "fused_scores",
    "request_digest",
]

DOMAIN = "diary.agentlearn.dev"
COLLECTION_BASE = "diary_notes"


class NoteTier(StrEnum):
    LONG = "long"
    SHORT = "short"


class NoteSource(StrEnum):
    UNSPECIFIED = "unspecified"
    REFLECT_AND_PERSIST = "reflect_and_persist"
    PERSIST_DECIDER = "persist_decider"
    OPERATOR = "operator"


@dataclass(frozen=True)
class NoteProvenance:
    """Where a note came from, as ``note_provenance`` keeps it (issue 17): the identifiers of the
    people it names (what an erasure by subject matches) and the whole provenance as JSON."""

    subjects: list[str]
    json: str


@dataclass(frozen=True)
class Note:
    id: uuid.UUID
    company: str
    seat: str
    content: str
    tier: NoteTier
    source: NoteSource
    turn_id: str | None
    create_time: datetime
    expire_time: datetime | None
    use_count: int = 0
    last_used_time: datetime | None = None
    embedding_model: str | None = None
    embedding_dims: int | None = None


WORK_KEYED_SOURCES = frozenset({NoteSource.PERSIST_DECIDER})
"""Writers whose ``request_id`` names a unit of work or a fact, not one request: the reflector's
persist decider keys its write by the turn's work (a redelivery asks the model again, and counts a
SHORT note's days from the turn, so its body may differ), the sessions' writer by the fact's
normalized text (two checks may word or tier it differently). For them a key used before answers
with the note it wrote, whatever the body; for every other writer the key is a retry's (AIP-155)
and a different request under it is refused."""


def request_digest(
    company: str, seat: str, content: str, tier: NoteTier, ttl_days: int, source: NoteSource, turn_id: str | None
) -> bytes:
    """What identifies a WriteNote, as ``diary_requests.request_digest`` keeps it: a SHA-256 of
    every field the stored note is made from (the provenance is not: a retry fills in a missing
    one), so a retry matches and a different note under the same key does not. A digest, never
    the text: the key table holds no note's content."""
    fields = [company, seat, content, str(tier), ttl_days, str(source), turn_id or ""]
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()).digest()


@dataclass
class Candidate:
    note: Note
    found_by: set[str] = field(default_factory=set)  # {"vector", "recency", "lexical", "neighbour"}
    similarity: float = 0.0
    lexical_rank: float = 0.0


@dataclass(frozen=True)
class Recall:
    candidates: list[Candidate]
    embedding_status: EmbeddingStatus
    vector_source: VectorSource | None  # None: no vector half ran
    unreachable_by_vector: int
    relevance_floor: float | None = None
    """The query model's floor the vector half was held to (None: the model has none)."""


def fused_scores(candidates: list[Candidate]) -> list[float]:
    """What the pool knows of each candidate, in 0..1: the mean of its similarity min-max scaled
    over the vector hits (a lone hit, or hits all alike, 1) and its lexical rank over the pool's
    best. Equal weights, nothing fitted (the prefetch's offline filter ranks by the same score)."""
    sims = [c.similarity for c in candidates if "vector" in c.found_by]
    lo, hi = (min(sims), max(sims)) if sims else (0.0, 0.0)
    lex_max = max((c.lexical_rank for c in candidates), default=0.0)
    out = []
    for c in candidates:
        vec = ((c.similarity - lo) / (hi - lo) if hi > lo else 1.0) if "vector" in c.found_by else 0.0
        out.append(0.5 * vec + 0.5 * (c.lexical_rank / lex_max if lex_max > 0 else 0.0))
    return out
