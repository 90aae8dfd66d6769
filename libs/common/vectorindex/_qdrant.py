"""What both Qdrant adapters (``qdrant-client`` and the embedded ``qdrant-edge``) say alike: the
payload indexes a new collection gets, a point on the wire, a scored point as a hit, a scroll page
of ids, and a failure as :class:`IndexUnavailable`. The two SDKs spell each in their own types; the
decisions live here once."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Literal, Protocol

import numpy as np

from libs.common.vectorindex._port import IndexHit, IndexPoint, IndexUnavailable, point_payload

__all__ = ["PAYLOAD_INDEXES", "hits", "page_request", "scroll_page", "unavailable", "wire_point"]

PayloadIndex = Literal["tenant", "keyword", "float"]

PAYLOAD_INDEXES: tuple[tuple[str, PayloadIndex], ...] = (
    ("company", "tenant"),
    ("seat", "tenant"),
    ("model", "keyword"),
    ("expire_at", "float"),
)
"""The payload a search filters on, indexed when a collection is created. Company and seat are
tenant keywords (Qdrant keeps each tenant's points together); ``expire_at`` is the range condition."""


class _HasId(Protocol):
    @property
    def id(self) -> Any: ...


class _Scored(_HasId, Protocol):
    @property
    def score(self) -> float: ...


def wire_point(point: IndexPoint) -> tuple[str, list[float], dict[str, Any]]:
    """A point as both SDKs take it: string id, float32 values, the payload a scope filters on."""
    return str(point.id), point.vector.astype(np.float32).tolist(), point_payload(point)


def hits(points: Iterable[_Scored]) -> list[IndexHit]:
    return [IndexHit(uuid.UUID(str(p.id)), float(p.score)) for p in points]


def page_request(after: uuid.UUID | None, limit: int) -> tuple[str | None, int]:
    """A scroll's (offset, limit) for a page after ``after``: scroll pages start at an id
    (inclusive), so ask for one more and :func:`scroll_page` drops ``after`` itself."""
    return (str(after) if after else None), limit + 1


def scroll_page(points: Iterable[_HasId], after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
    """The page of ``point_ids`` from a scroll asked for with :func:`page_request`."""
    return [i for i in (uuid.UUID(str(p.id)) for p in points) if i != after][:limit]


def unavailable(adapter: str, exc: Exception) -> IndexUnavailable:
    """An SDK failure as the port's one exception (the caller degrades to an exact scan)."""
    return IndexUnavailable(f"{adapter}: {type(exc).__name__}: {exc}")
