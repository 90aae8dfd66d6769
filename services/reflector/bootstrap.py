"""Wiring of the reflector: the queue, the record store, the workers the config turns on, the
background worker loop, and the offline rules of every worker's purpose."""

from __future__ import annotations

from pathlib import Path

from libs.common.clients import Clients
from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.jobs import JobQueue
from libs.common.passrunner import PassSpec, holder_identity
from services.reflector import erasure
from services.reflector.harness import Harness
from services.reflector.service import ReflectorService
from services.reflector.servicer import ReflectorServicer
from services.reflector.store import PostgresReflectionStore
from services.reflector.workers import persist_decider, profiler, refiner, synthesizer
from services.reflector.workers.base import Worker, WorkerContext
from services.reflector.workers.episodist import Episodist
from services.reflector.workers.ports import grpc_ports
from services.reflector.workers.skill_use import SkillUse

NAME = "reflector"
MIGRATIONS = Migrations("reflector", Path(__file__).parent / "migrations")


def build_workers(infra: Infra) -> list[Worker]:
    """The workers ``learning.reflection.workers`` names, in its order. The refiner is left unbuilt
    when refinement is off, or both auto flags are (refinement-off spelled the long way)."""
    learning = infra.settings.learning
    refine = learning.skill_refinement
    available: dict[str, Worker] = {
        "persist_decider": persist_decider.PersistDecider(),
        "episodist": Episodist(),
        "profiler": profiler.Profiler(),
        "skill_use": SkillUse(),
        "synthesizer": synthesizer.Synthesizer(learning.skill_synthesis.min_tool_calls),
    }
    if refine.enabled and (refine.auto_refine_on_success or refine.auto_refine_on_failure):
        available["refiner"] = refiner.Refiner(refine.auto_refine_on_success, refine.auto_refine_on_failure)
    unknown = [n for n in learning.reflection.workers if n not in available and n != "refiner"]
    if unknown:
        raise ValueError(f"learning.reflection.workers names unknown workers: {unknown}")
    return [available[n] for n in learning.reflection.workers if n in available]


def component(infra: Infra) -> Component:
    for module in (persist_decider, profiler, synthesizer, refiner):
        module.register(infra.rules)
    queue = JobQueue(infra.pool)
    store = PostgresReflectionStore(infra.pool)
    clients = Clients(infra.channels, infra.settings.learning.reflection.rpc_timeout_seconds)
    ctx = WorkerContext(
        settings=infra.settings,
        aux=infra.aux,
        clients=clients,
        events=infra.events,
        clock=infra.clock,
        ports=grpc_ports(clients),
    )
    harness = Harness(
        infra.settings, queue, store, build_workers(infra), ctx, infra.budget, infra.events, holder_identity()
    )
    service = ReflectorService(store, infra.clock, infra.events, harness)
    return Component(
        name=NAME,
        registrations=[Registration.of(ReflectorServicer(service))],
        service=service,
        background=[lambda: harness.run_forever(infra.listen_dsn)],
        passes=[
            # Issue 17: reflection records and finished turns past their company's retention.
            PassSpec(
                "reflection-prune",
                lambda: erasure.prune_retention(infra.pool, infra.settings.privacy, infra.clock.now()),
                infra.settings.privacy.prune_interval_seconds,
            )
        ],
    )
