from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class SearchScope:
    """Which points a search may return: one seat's points of one model unexpired at ``now``, and
    with every one of ``labels``. Every adapter filters by this one description."""

    company: str
    seat: str
    model: str
    now: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self) -> list[tuple[str, str]]:
        """The exact-match payload conditions; the one range condition is ``expire_at > now``."""
        return [("company", self.company), ("seat", self.seat), ("model", self.model), *self.labels.items()]

    def admits(self, point: IndexPoint) -> bool:
        """Whether ``point`` is in scope (the exact scan's filter; Qdrant evaluates the same
        conditions itself)."""
        payload = point_payload(point)
        return point.expire_at > self.now and all(payload.get(k) == v for k, v in self.matches())


def point_payload(point: IndexPoint) -> dict[str, Any]:
    """The payload a point is stored with: what :class:`SearchScope` filters on."""
    return {
        "company": point.company,
        "seat": point.seat,
        "model": point.model,
        "expire_at": point.expire_at,
        **dict(point.labels),
    }


def collection_name(base: str, dimensions: int) -> str:
    """One collection per row family and width: Qdrant fixes a collection's vector size."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", base):
        raise ValueError(f"bad collection base {base!r}")
    return f"{base}_{dimensions}"


class VectorIndex(ABC):
    """The port every adapter implements. :meth:`search` is written once here: its arguments
    become a :class:`SearchScope` and a float32 query, a non-positive ``limit`` answers nothing, and
    the adapter's :meth:`_nearest` does the rest."""

    name: str
    """``qdrant`` or ``qdrant-edge``, for logs and responses."""

    @abstractmethod
    async def upsert(self, collection: str, points: Sequence[IndexPoint]) -> None: ...

    @abstractmethod
    async def prepare(self, collection: str, dimensions: int) -> None:
        """Open ``collection`` now, creating it (vectors of ``dimensions``) if it does not exist, so
        that a server's first writes and searches do not pay for it (an embedded collection is
        created on its first write and loaded from disk on its first use otherwise)."""

    @abstractmethod
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
        if limit <= 0:
            return []
        scope = SearchScope(company, seat, model, now, dict(labels or {}))
        return await self._nearest(collection, np.asarray(vector, dtype=np.float32), scope, limit)

    @abstractmethod
    async def _nearest(self, collection: str, query: np.ndarray, scope: SearchScope, limit: int) -> list[IndexHit]:
        """Top ``limit`` (> 0) by cosine among the points of ``collection`` in ``scope``."""

    @abstractmethod
    async def reset(self, collection: str) -> None:
        """Remove every point of ``collection`` (before a rebuild)."""

    @abstractmethod
    async def count(self, collection: str) -> int: ...

    @abstractmethod
    async def collections(self) -> list[str]:
        """Every collection the index holds (the orphan sweep walks them)."""

    @abstractmethod
    async def point_ids(self, collection: str, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
        """Up to ``limit`` point ids of ``collection`` in id order, after ``after`` (a page of the
        orphan sweep: a point whose row is gone from Postgres is removed)."""

    @abstractmethod
    async def close(self) -> None: ...
