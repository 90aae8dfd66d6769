"""Wiring of the prefetch: its migrations (onboarding markers, the refresh ledger), the turn-start
builder and the builtins over the other services' channels — the knowledge service's among them,
through its ``Searcher`` client — and the offline rules of every purpose it asks a model. The
knowledge pages, their fill and promotion are the knowledge service's (``services/knowledge``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libs.common.auxmodel import OfflineRules
from libs.common.clients import Clients
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from services.knowledge.client import GrpcKnowledgeClient
from services.prefetch import knowledge_block, memory, past_turns
from services.prefetch.builtins import Builtins
from services.prefetch.deps import Deps
from services.prefetch.domain import RPC_TIMEOUT_SECONDS
from services.prefetch.servicer import BuiltinServicer, PrefetchServicer
from services.prefetch.store import PostgresPrefetchStore
from services.prefetch.turn_context import TurnContextBuilder

NAME = "prefetch"
MIGRATIONS = Migrations("prefetch", Path(__file__).parent / "migrations")


@dataclass
class Prefetch:
    """The prefetch's use cases and what they share (``deps.searcher`` is the one knowledge seam
    the turn-start block, ``search_knowledge``, onboarding and the guidance registry all read)."""

    deps: Deps
    turn_context: TurnContextBuilder
    builtins: Builtins


def register_rules(rules: OfflineRules) -> None:
    """The offline provider answers every purpose the prefetch asks, so it runs with no model."""
    rules.register(memory.FILTER_PURPOSE, memory.memory_filter_rule)
    rules.register(knowledge_block.QUERY_PURPOSE, knowledge_block.knowledge_query_rule)
    rules.register(past_turns.SUMMARY_PURPOSE, past_turns.summary_rule)
    rules.register(past_turns.REWRITE_PURPOSE, past_turns.rewrite_rule)


def build(infra: Infra) -> Prefetch:
    deps = Deps(
        settings=infra.settings,
        aux=infra.aux,
        embedder=infra.embedder,
        clients=Clients(infra.channels, RPC_TIMEOUT_SECONDS),
        store=PostgresPrefetchStore(infra.pool),
        # The knowledge service's own search deadline plus a margin, so a search that did not run
        # comes back saying why (rate limited, credential refused) rather than as our timeout.
        searcher=GrpcKnowledgeClient(
            lambda: infra.channels.channel("knowledge"),
            max(RPC_TIMEOUT_SECONDS, infra.settings.knowledge.search_timeout_seconds + 2.0),
        ),
        events=infra.events,
        clock=infra.clock,
    )
    renderer = past_turns.PastTurns(infra.aux, infra.settings.learning)
    return Prefetch(
        deps=deps,
        turn_context=TurnContextBuilder(deps, renderer),
        builtins=Builtins(deps, renderer),
    )


def registrations(prefetch: Prefetch) -> list[Registration]:
    return [
        Registration.of(PrefetchServicer(prefetch.deps, prefetch.turn_context)),
        Registration.of(BuiltinServicer(prefetch.builtins)),
    ]


def component(infra: Infra) -> Component:
    register_rules(infra.rules)
    prefetch = build(infra)
    return Component(
        name=NAME,
        registrations=registrations(prefetch),
        service=prefetch,
    )
