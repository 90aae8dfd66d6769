"""What every prefetch use case runs with: its dependencies (one object, built once in bootstrap,
so a test can wire another searcher without patching), and who a model call is made for.

``searcher`` is the knowledge service's seam (``services.knowledge.client.Searcher``): in every
deployment the gRPC client of ``agentlearn.knowledge.v1``, so the prefetch reads pages from their
owner like it reads every other row."""

from __future__ import annotations

from dataclasses import dataclass

from libs.common.auxmodel import Attribution, AuxiliaryModel, Stage
from libs.common.clients import Clients
from libs.common.clock import Clock
from libs.common.config import Settings
from libs.common.embeddings import Embedder
from libs.common.events import EventSink
from services.knowledge.client import Searcher
from services.prefetch.ports import PrefetchStore

__all__ = ["Deps", "Searcher", "Who"]


@dataclass(frozen=True)
class Who:
    """The seat a call serves: every auxiliary call of the prefetch is the turn's (Stage.TURN)."""

    company: str
    seat: str
    role: str
    turn_id: str

    def attribution(self, purpose: str) -> Attribution:
        return Attribution(self.company, self.seat, Stage.TURN, purpose, self.turn_id or None, self.role or None)


@dataclass
class Deps:
    settings: Settings
    aux: AuxiliaryModel
    embedder: Embedder | None
    clients: Clients
    store: PrefetchStore
    searcher: Searcher
    events: EventSink
    clock: Clock
