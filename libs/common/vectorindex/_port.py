from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# A LONG note never expires; the payload still carries a number so one range condition filters
# every row (year ~33,000 in epoch seconds).
NO_EXPIRY = 1.0e12


class IndexUnavailable(Exception):
    """The index could not answer; the caller degrades to an exact scan and says so."""


@dataclass(frozen=True)
class IndexPoint:
    id: uuid.UUID
    vector: np.ndarray
    company: str
    seat: str
    model: str
    expire_at: float = NO_EXPIRY
    labels: Mapping[str, str] = field(default_factory=dict)
    """Further exact-match payload (e.g. ``kind: raw`` for episodes)."""


@dataclass(frozen=True)
class IndexHit:
    id: uuid.UUID
    score: float
    """Cosine similarity."""


def collection_name(base: str, dimensions: int) -> str:
    """One collection per row family and width: Qdrant fixes a collection's vector size."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", base):
        raise ValueError(f"bad collection base {base!r}")
    return f"{base}_{dimensions}"


class VectorIndex(Protocol):
    name: str
    """``qdrant`` or ``qdrant-edge``, for logs and responses."""

    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None: ...

    async def delete(self, collection: str, ids: Sequence[uuid.UUID]) -> None: ...

    async def search(
        self,
        collection: str,
        vector: np.ndarray,
        *,
        company: str,
        seat: str,
        model: str,
        now: float,
        limit: int,
        labels: Mapping[str, str] | None = None,
    ) -> list[IndexHit]:
        """Top ``limit`` by cosine among this seat's unexpired points of ``model``."""
        ...

    async def reset(self, collection: str) -> None:
        """Remove every point of ``collection`` (before a rebuild)."""
        ...

    async def count(self, collection: str) -> int: ...

    async def collections(self) -> list[str]:
        """Every collection the index holds (the orphan sweep walks them)."""
        ...

    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        """Up to ``limit`` point ids of ``collection`` in id order, after ``after`` (a page of the
        orphan sweep: a point whose row is gone from Postgres is removed)."""
        ...

    async def close(self) -> None: ...
