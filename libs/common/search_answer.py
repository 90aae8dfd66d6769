"""How a vector-and-lexical search went, as every searching response reports it.

The diary's RecallNotes and the episodes' SearchEpisodes answer each hit with how it was found, and
the whole with the same four fields (whether the query was embedded, where the vector half read,
how many rows it could not reach, the relevance floor it held hits to); read here once from the
use case's result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from libs.common.vector_path import EmbeddingStatus, VectorSource, embedding_status_to_pb, vector_source_to_pb

__all__ = ["FoundHit", "hit_fields", "search_path_fields"]


class FoundHit(Protocol):
    """One hit of such a search: which halves found it, its similarity, its lexical rank."""

    @property
    def found_by(self) -> set[str]: ...
    @property
    def similarity(self) -> float: ...
    @property
    def lexical_rank(self) -> float: ...


def hit_fields(hit: FoundHit, halves: Mapping[str, int]) -> dict[str, Any]:
    """A hit message's fields of how it was found (``halves``: each half's proto value, sorted)."""
    return {
        "found_by": sorted(halves[h] for h in hit.found_by),
        "similarity": hit.similarity,
        "lexical_rank": hit.lexical_rank,
    }


class SearchPath(Protocol):
    """What a search result says of how it searched (the diary's Recall, the episodes' Search)."""

    @property
    def embedding_status(self) -> EmbeddingStatus: ...
    @property
    def vector_source(self) -> VectorSource | None: ...
    @property
    def unreachable_by_vector(self) -> int: ...
    @property
    def relevance_floor(self) -> float | None: ...


def search_path_fields(result: SearchPath) -> dict[str, Any]:
    """The response's fields naming how ``result`` searched (a floor of None is 0: the model has none)."""
    return {
        "embedding_status": embedding_status_to_pb(result.embedding_status),
        "vector_source": vector_source_to_pb(result.vector_source),
        "unreachable_by_vector_count": result.unreachable_by_vector,
        "relevance_floor": result.relevance_floor or 0.0,
    }
