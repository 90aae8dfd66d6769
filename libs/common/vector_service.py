"""What the use cases of a seat's vector rows (diary notes, raw episodes) are built from, once: the
same dependencies (store, embedder, index, clock, config, events, the relevance floors), wired the
same way from the shared infrastructure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Self, TypeVar

from libs.common.clock import Clock
from libs.common.config import RelevanceConfig
from libs.common.embeddings import Embedder
from libs.common.events import EventSink
from libs.common.vectorindex import VectorIndex

if TYPE_CHECKING:
    from libs.common.infra import Infra

__all__ = ["VectorRowService"]

S = TypeVar("S")
C = TypeVar("C")


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
