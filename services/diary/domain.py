"""The diary's domain: notes, tiers, recall candidates, and the rules that are data."""

from __future__ import annotations

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
    "Candidate",
    "Note",
    "NoteSource",
    "NoteTier",
    "QueryVector",
    "Recall",
    "fused_scores",
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
