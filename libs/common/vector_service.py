"""What the use cases of a seat's vector rows (diary notes, raw episodes) are built from, once: the
same dependencies (store, embedder, index, clock, config, events, the relevance floors), wired the
same way from the shared infrastructure, and the same two request rules (a bounded id list, a
newest-first page with its resume token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from libs.common.clock import Clock
from libs.common.config import RelevanceConfig
from libs.common.embeddings import Embedder
from libs.common.errors import InvalidArgument
from libs.common.events import EventSink
from libs.common.validation import encode_time_cursor
from libs.common.vectorindex import VectorIndex

if TYPE_CHECKING:
    from libs.common.infra import Infra

__all__ = ["VectorRowService", "at_most", "time_page"]

S = TypeVar("S")
C = TypeVar("C")
R = TypeVar("R")


class VectorRowService(Generic[S, C]):
    """The dependencies of a vector-row service, as arguments (no patching)."""

    def __init__(
        self,
        store: S,
        embedder: Embedder | None,
        index: VectorIndex,
        clock: Clock,
        config: C,
        events: EventSink,
        relevance: RelevanceConfig | None = None,
    ):
        self.relevance = relevance or RelevanceConfig()
        """The floor per embedding model below which a vector hit is not related (``learning.relevance``)."""
        self.store = store
        self.embedder = embedder
        self.index = index
        self.clock = clock
        self.config = config
        self.events = events

    @classmethod
    def wired(cls, infra: Infra, store: S, config: C) -> Self:
        """The service over ``store`` with its ``config``; the rest from the shared infrastructure."""
        return cls(
            store=store,
            embedder=infra.embedder,
            index=infra.index,
            clock=infra.clock,
            config=config,
            events=infra.events,
            relevance=infra.settings.learning.relevance,
        )


def at_most(values: Sequence[object], limit: int, field: str, *, domain: str) -> None:
    """Refuse a list of ids longer than one call takes (``TOO_MANY_IDS`` on ``field``)."""
    if len(values) > limit:
        raise InvalidArgument(
            f"at most {limit} {field} per call, got {len(values)}",
            reason="TOO_MANY_IDS",
            domain=domain,
            field=field,
            metadata={"limit": limit, "count": len(values)},
        )


def time_page(
    rows: Sequence[R], size: int, scope: dict[str, Any], time: Callable[[R], datetime], ident: Callable[[R], object]
) -> tuple[list[R], str]:
    """A newest-first page from up to ``size + 1`` rows read after the cursor: the first ``size``,
    and the token resuming after the last of them ("" when no row is left)."""
    page = list(rows[:size])
    if len(rows) <= size:
        return page, ""
    last = page[-1]
    return page, encode_time_cursor(time(last), ident(last), scope)
