"""Wiring of the skills: migrations, the service from shared infrastructure, the servicer, the
offline rule of the clustered draft, and the passes (curator, clustered synthesis)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from libs.common.component import Component
from libs.common.db import Migrations
from libs.common.grpcserver import Registration
from libs.common.infra import Infra
from libs.common.passrunner import PassSpec
from services.skills import drafting, passes
from services.skills.episodes import GrpcEpisodeReader
from services.skills.proposals import ProposalService
from services.skills.service import SkillService
from services.skills.servicer import SkillServicer
from services.skills.store import PostgresProposalStore, PostgresSkillStore

NAME = "skills"
MIGRATIONS = Migrations("skills", Path(__file__).parent / "migrations")


def build(infra: Infra) -> SkillService:
    learning = infra.settings.learning
    return SkillService(
        store=PostgresSkillStore(infra.pool),
        clock=infra.clock,
        synthesis=learning.skill_synthesis,
        refinement=learning.skill_refinement,
        curator=learning.skill_curator,
        events=infra.events,
    )


def build_proposals(service: SkillService, infra: Infra) -> ProposalService:
    """Skill proposals (session learning checks, distill_skill): the duplicate checks use the
    deployment's embedder where one is configured."""
    config = infra.settings.learning.skill_proposals
    return ProposalService(service, PostgresProposalStore(infra.pool), infra.embedder, config, infra.events)


def registration(service: SkillService, proposals: ProposalService | None, pool: asyncpg.Pool) -> Registration:
    return Registration.of(SkillServicer(service, proposals, pool))


def pass_specs(service: SkillService, infra: Infra) -> list[PassSpec]:
    learning = infra.settings.learning
    synthesis = learning.skill_synthesis
    episodes = GrpcEpisodeReader(lambda: infra.channels.channel("episodes"))
    drafter = drafting.ClusterDrafter(infra.aux, learning.episodes.summary_input_bytes)
    return [
        PassSpec("skill-curator", lambda: passes.curate(service), learning.skill_curator.interval_hours * 3600),
        PassSpec(
            "skill-synthesis",
            lambda: passes.synthesize_clustered(service, episodes, drafter, synthesis),
            synthesis.scheduler_interval_seconds,
            enabled=synthesis.scheduler_enabled,
        ),
    ]


def component(infra: Infra) -> Component:
    # The clustered draft answers with no model at all: the offline provider reads this rule.
    infra.rules.register(drafting.PURPOSE, drafting.offline_rule)
    service = build(infra)
    return Component(
        name=NAME,
        registrations=[registration(service, build_proposals(service, infra), infra.pool)],
        service=service,
        passes=pass_specs(service, infra),
    )
