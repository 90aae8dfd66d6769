"""The episodes' domain: raw and compacted rows, outcomes, hits, and the rules that are data.

One text per raw row is what its vector is of (:func:`vector_text`): the label of the event that
woke the turn, what it was asked, and what it did — whole, one part per line, empty parts left
out. The row stores all three, so the vector is a function of the row alone and the fill can
compute it again later.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from libs.common.embeddings import Vector as QueryVector  # a query's vector and its model
from libs.common.outcomes import TurnOutcome  # a row holds done, failed, self_iterate or skipped
from libs.common.run_ids import label_names_run_id  # the one rule, shared with the episodist
from libs.common.vector_path import EmbeddingStatus, VectorSource

__all__ = [
    "COLLECTION_BASE",
    "DOMAIN",
    "Episode",
    "EpisodeFilter",
    "EpisodeKind",
    "Hit",
    "QueryVector",
    "Search",
    "Sender",
    "TurnOutcome",
    "label_names_run_id",
    "tool_set",
    "vector_text",
]

DOMAIN = "episodes.agentlearn.dev"
COLLECTION_BASE = "episodes"
WORK_ITEM_BACKENDS = ("native", "jira")
"""A work item is filed as ``<backend>:<id>`` with one of these backends (spec: "Which work a
turn is on"), or not at all."""
MAX_SEARCH_LIMIT = 100
MAX_IDS_PER_CALL = 500
LIST_PAGE_DEFAULT, LIST_PAGE_MAX = 20, 200
SEATS_PAGE_DEFAULT, SEATS_PAGE_MAX = 500, 5000


class EpisodeKind(StrEnum):
    RAW = "raw"
    COMPACTED = "compacted"


@dataclass(frozen=True)
class Sender:
    """One person a raw row's turn carried, each identifier in its own field (RecordEpisode's
    ``senders``): what the row's provenance answers. The row's ``subjects`` holds the same
    identifiers flat, as an erasure finds the row by."""

    handle: str = ""
    external_id: str = ""
    platform: str = ""


@dataclass(frozen=True)
class Episode:
    id: uuid.UUID
    company: str
    seat: str
    kind: EpisodeKind
    outcome: TurnOutcome
    start_time: datetime
    end_time: datetime
    turn_id: str | None = None
    role: str | None = None
    work_item: str | None = None
    label: str = ""
    ask: str = ""
    what_it_did: str = ""
    review_outcome: str = ""
    tool_sequence: tuple[str, ...] = ()
    tools_called: tuple[str, ...] = ()
    skills_used: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    conversation_id: str | None = None
    duration_ms: int = 0
    count: int = 1
    common_task_pattern: str = ""
    common_outcome: str = ""
    success_rate: float = 0.0
    done_count: int = 0
    subjects_involved: tuple[str, ...] = ()
    notable_patterns: tuple[str, ...] = ()
    exemplar_turn_ids: tuple[str, ...] = ()
    exemplar_of: uuid.UUID | None = None
    consolidated_into_skill_id: str | None = None
    embedding_model: str | None = None
    embedding_dims: int | None = None
    work_key: str | None = None
    """The unit of work a raw row records (one row per work key: a redelivery is collapsed into it)."""

    @property
    def text(self) -> str:
        return vector_text(self.label, self.ask, self.what_it_did)


def vector_text(label: str, ask: str, what_it_did: str) -> str:
    """The ONE text a raw row is embedded from: ``label``, ``ask`` and ``what_it_did`` joined by a
    newline, each whole and as stored, a part with nothing in it (a turn told nothing has no ask)
    left out."""
    return "\n".join(part for part in (label, ask, what_it_did) if part and part.strip())


def tool_set(tool_sequence: tuple[str, ...] | list[str], tools_called: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The tool names a turn used, as a set: what compaction's Jaccard compares (order and
    repetition do not matter). The final round's sequence and every call both count, since a
    final round is often the answer alone."""
    return frozenset(tool_sequence) | frozenset(tools_called)


@dataclass(frozen=True)
class EpisodeFilter:
    kind: EpisodeKind | None = None
    outcomes: tuple[TurnOutcome, ...] = ()
    min_tool_calls: int = 0
    conversation_id: str | None = None
    exclude_exemplars: bool = False
    """Leave out a summary's retained exemplars (raw rows with ``exemplar_of`` set)."""

    def scope(self) -> dict[str, object]:
        scope: dict[str, object] = {
            "kind": str(self.kind) if self.kind else None,
            "outcomes": sorted(str(o) for o in self.outcomes),
            "min_tool_calls": self.min_tool_calls,
            "conversation_id": self.conversation_id,
        }
        if self.exclude_exemplars:  # only when set, so a token issued without it stays valid
            scope["exclude_exemplars"] = True
        return scope


@dataclass
class Hit:
    episode: Episode
    found_by: set[str] = field(default_factory=set)  # {"vector", "lexical"}
    similarity: float = 0.0
    lexical_rank: float = 0.0


@dataclass(frozen=True)
class Search:
    hits: list[Hit]
    embedding_status: EmbeddingStatus
    vector_source: VectorSource | None  # None: no vector half ran
    unreachable_by_vector: int
    relevance_floor: float | None = None
    """The query model's floor the hits were held to (None: the model has none)."""
