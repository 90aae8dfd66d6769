"""In-memory fakes of the skills' store ports (``services/skills/ports.py``) for the unit tier.

They keep the adapters' observable rules, not their SQL: one skill per (company, seat, name); a use,
an offer or a marked use moves the clock and revives a stale, unpinned skill; a new version archives
the live body (keeping at most ``keep`` archived ones) and remembers the idempotency key; a proposal
is decided only while pending. A transaction here is nothing (one event loop, no awaits between a
check and its write), so ``Tx`` is ``None``. The integration tier runs the same use cases on
Postgres; a rule only the SQL enforces is tested there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.clock import ManualClock
from libs.common.config import (
    SkillCuratorConfig,
    SkillProposalsConfig,
    SkillRefinementConfig,
    SkillSynthesisConfig,
)
from services.skills.domain import (
    LearningHealth,
    ProposalDecision,
    ProposalState,
    Skill,
    SkillChange,
    SkillDraft,
    SkillEdit,
    SkillKey,
    SkillProposal,
    SkillState,
    SkillVersion,
)
from services.skills.ports import Moved, Tx, Used
from services.skills.proposals import ProposalService
from services.skills.service import SkillService
from services.skills.store import StampFailed, name_taken_error
from tests.unit.fakes.events import RecordedEvents as FakeEvents

__all__ = ["TOOLS", "FakeEvents", "FakeProposalStore", "FakeSkillStore", "Skills", "make"]


@dataclass
class _Version:
    version: SkillVersion
    request_id: str | None
    provenance: Provenance


@dataclass
class _Row:
    skill: Skill
    version_time: datetime
    request_id: str | None = None
    provenance: Provenance = field(default_factory=Provenance)
    version_provenance: Provenance = field(default_factory=Provenance)
    versions: list[_Version] = field(default_factory=list)  # oldest first
    bullets: list[tuple[int, str, Provenance]] = field(default_factory=list)


class _SeatTx:
    def __init__(self, store: FakeSkillStore, company: str, seat: str) -> None:
        self._store, self.company, self.seat = store, company, seat

    @property
    def conn(self) -> Tx:
        return None

    async def name_taken(self, name: str) -> bool:
        return any(s.name == name for s in await self.all_skills())

    async def live_skills(self) -> list[Skill]:
        return await self._store.live_skills(self.company, self.seat)

    async def all_skills(self) -> list[Skill]:
        return await self._store.all_skills(self.company, self.seat)

    async def count_live(self) -> int:
        return len(await self.live_skills())

    async def insert(self, draft: SkillDraft, provenance: Provenance, now: datetime) -> Skill:
        if await self.name_taken(draft.name):
            raise name_taken_error(self.seat, draft.name)
        skill = Skill(
            **vars(draft),
            id=uuid.uuid4(),
            company=self.company,
            seat=self.seat,
            state=SkillState.ACTIVE,
            pinned=False,
            version=1,
            use_count=0,
            last_used_time=None,
            last_offered_time=None,
            unused_since=now,
            state_change_time=now,
            create_time=now,
            update_time=now,
            change=SkillChange.CREATED,
            change_reason="",
            restored_from_version=None,
        )
        self._store.rows[skill.id] = _Row(skill, now, provenance=provenance, version_provenance=provenance)
        return skill

    async def get_for_update(self, key: SkillKey) -> Skill | None:
        return await self._store.get(key)

    async def set_state(self, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool) -> Skill:
        return await self._store.set_state(None, skill_id, state, now, reset_clock=reset_clock)


class FakeSkillStore:
    """``ports.SkillStore`` in memory. ``fail_stamps``: every telemetry stamp raises StampFailed
    (the store unreachable for the stamp's timeout)."""

    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, _Row] = {}
        self.use_requests: set[tuple[str, str, str]] = set()
        self.fail_stamps = False

    def _put(self, skill: Skill) -> Skill:
        self.rows[skill.id].skill = skill
        return skill

    def _seat(self, company: str, seat: str) -> list[Skill]:
        found = [r.skill for r in self.rows.values() if (r.skill.company, r.skill.seat) == (company, seat)]
        return sorted(found, key=lambda s: (s.create_time, s.name))

    @contextlib.asynccontextmanager
    async def seat(self, company: str, seat: str) -> AsyncIterator[_SeatTx]:
        yield _SeatTx(self, company, seat)

    @contextlib.asynccontextmanager
    async def skill_row(
        self, key: SkillKey, request_id: str | None = None
    ) -> AsyncIterator[tuple[Tx, Skill | None, bool]]:
        skill = await self.get(key)
        yield None, skill, skill is not None and request_id is not None and self._request_seen(skill.id, request_id)

    async def get(self, key: SkillKey) -> Skill | None:
        for s in self._seat(key.company, key.seat):
            if (key.id is not None and s.id == key.id) or (key.name is not None and s.name == key.name):
                return s
        return None

    async def live_skills(self, company: str, seat: str) -> list[Skill]:
        return [s for s in self._seat(company, seat) if s.state is not SkillState.ARCHIVED]

    async def all_skills(self, company: str, seat: str) -> list[Skill]:
        return self._seat(company, seat)

    async def page(
        self, company: str, seat: str, include_archived: bool, after_name: str | None, limit: int
    ) -> list[Skill]:
        found = [
            s
            for s in self._seat(company, seat)
            if (include_archived or s.state is not SkillState.ARCHIVED) and (after_name is None or s.name > after_name)
        ]
        return sorted(found, key=lambda s: s.name)[:limit]

    async def count(self, company: str, seat: str, include_archived: bool) -> int:
        return len([s for s in self._seat(company, seat) if include_archived or s.state is not SkillState.ARCHIVED])

    def _all_versions(self, skill_id: uuid.UUID) -> list[SkillVersion]:
        row = self.rows[skill_id]
        s = row.skill
        live = SkillVersion(
            s.id, s.version, s.body, s.change, s.change_reason, s.restored_from_version, row.version_time, None, True
        )
        return [live, *(v.version for v in reversed(row.versions))]

    async def versions_page(self, skill_id: uuid.UUID, before: int | None, limit: int) -> list[SkillVersion]:
        return [v for v in self._all_versions(skill_id) if before is None or v.version < before][:limit]

    async def versions_count(self, skill_id: uuid.UUID) -> int:
        return len(self._all_versions(skill_id))

    async def health(self, company: str, seat: str, now: datetime) -> LearningHealth:
        skills = self._seat(company, seat)
        if not skills:
            return LearningHealth(company, seat)
        uses = sum(s.use_count for s in skills)
        last = [s.last_used_time for s in skills if s.last_used_time is not None]
        return LearningHealth(
            company=company,
            seat=seat,
            total_skills=len(skills),
            skills_used_at_least_once=len([s for s in skills if s.use_count > 0]),
            total_skill_uses=uses,
            most_recent_skill_use=max(last) if last else None,
            avg_uses_per_skill=uses / len(skills),
            avg_skill_age_days=sum((now - s.create_time).total_seconds() for s in skills) / len(skills) / 86400,
            active_skills=len([s for s in skills if s.state is SkillState.ACTIVE]),
            stale_skills=len([s for s in skills if s.state is SkillState.STALE]),
            archived_skills=len([s for s in skills if s.state is SkillState.ARCHIVED]),
        )

    def _stamp(self, skill: Skill, now: datetime, *, used: bool) -> tuple[Skill, SkillState]:
        revive = skill.state is SkillState.STALE and not skill.pinned
        stamped = dataclasses.replace(
            skill,
            use_count=skill.use_count + (1 if used else 0),
            last_used_time=now if used else skill.last_used_time,
            last_offered_time=skill.last_offered_time if used else now,
            unused_since=max(skill.unused_since, now),
            state=SkillState.ACTIVE if revive else skill.state,
            state_change_time=now if revive else skill.state_change_time,
        )
        return self._put(stamped), skill.state

    async def use(self, key: SkillKey, now: datetime, timeout: float, request_id: str | None = None) -> Used | None:
        if self.fail_stamps:
            raise StampFailed("TimeoutError: the fake store is unreachable")
        skill = await self.get(key)
        if skill is None or skill.state is SkillState.ARCHIVED:
            return None
        if request_id is not None:
            if (key.company, key.seat, request_id) in self.use_requests:
                return Used(skill, skill.state, counted=False)
            self.use_requests.add((key.company, key.seat, request_id))
        return Used(*self._stamp(skill, now, used=True))

    def _targets(self, company: str, seat: str, ids: Sequence[uuid.UUID], names: Sequence[str]) -> list[Skill]:
        return sorted(
            (
                s
                for s in self._seat(company, seat)
                if s.state is not SkillState.ARCHIVED and (s.id in ids or s.name in names)
            ),
            key=lambda s: s.id,
        )

    async def offer(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], names: Sequence[str], now: datetime, timeout: float
    ) -> list[Moved]:
        if self.fail_stamps:
            raise StampFailed("TimeoutError: the fake store is unreachable")
        moved = []
        for s in self._targets(company, seat, ids, names):
            after, before = self._stamp(s, now, used=False)
            moved.append((s.id, s.name, before, after.state))
        return moved

    async def mark_used(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, request_id: str | None
    ) -> list[Moved] | None:
        if request_id is not None:
            if (company, seat, request_id) in self.use_requests:
                return None
            self.use_requests.add((company, seat, request_id))
        moved = []
        for s in self._targets(company, seat, ids, ()):
            after, before = self._stamp(s, now, used=True)
            moved.append((s.id, s.name, before, after.state))
        return moved

    async def new_version(
        self, conn: Tx, skill: Skill, edit: SkillEdit, now: datetime, keep: int, bullet: str | None = None
    ) -> Skill:
        row = self.rows[skill.id]
        if bullet is not None:
            row.bullets.append((skill.version + 1, bullet, edit.provenance))
        s = row.skill
        archived = SkillVersion(
            s.id, s.version, s.body, s.change, s.change_reason, s.restored_from_version, row.version_time, now, False
        )
        row.versions.append(_Version(archived, row.request_id, row.version_provenance))
        del row.versions[: max(0, len(row.versions) - keep)]
        row.version_time, row.request_id = now, edit.request_id
        row.version_provenance = edit.provenance
        return self._put(
            dataclasses.replace(
                s,
                body=edit.body,
                version=s.version + 1,
                change=edit.change,
                change_reason=edit.reason,
                restored_from_version=edit.restored_from,
                update_time=now,
            )
        )

    def _request_seen(self, skill_id: uuid.UUID, request_id: str) -> bool:
        row = self.rows[skill_id]
        return row.request_id == request_id or any(v.request_id == request_id for v in row.versions)

    async def keyed_version(self, conn: Tx, skill_id: uuid.UUID, request_id: str) -> SkillVersion | None:
        row = self.rows[skill_id]
        if row.request_id == request_id:
            return self._all_versions(skill_id)[0]
        kept = [v.version for v in row.versions if v.request_id == request_id]
        return kept[-1] if kept else None

    async def archived_body(self, conn: Tx, skill_id: uuid.UUID, version: int) -> tuple[str, Provenance] | None:
        kept = (v for v in self.rows[skill_id].versions if v.version.version == version)
        return next(((v.version.body, v.provenance) for v in kept), None)

    async def set_pinned(self, conn: Tx, skill_id: uuid.UUID, pinned: bool, now: datetime) -> Skill:
        return self._put(dataclasses.replace(self.rows[skill_id].skill, pinned=pinned, update_time=now))

    async def set_state(
        self, conn: Tx, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool
    ) -> Skill:
        s = self.rows[skill_id].skill
        return self._put(
            dataclasses.replace(
                s,
                state=state,
                state_change_time=now,
                update_time=now,
                unused_since=max(s.unused_since, now) if reset_clock else s.unused_since,
            )
        )

    async def curate(
        self, from_state: SkillState, to_state: SkillState, event: str, cutoff: datetime, now: datetime, batch: int
    ) -> int:
        moved = 0
        for row in self.rows.values():
            s = row.skill
            if s.state is from_state and not s.pinned and s.unused_since <= cutoff:
                row.skill = dataclasses.replace(s, state=to_state, state_change_time=now, update_time=now)
                moved += 1
        return moved


class FakeProposalStore:
    """``ports.ProposalStore`` in memory."""

    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, tuple[SkillProposal, str | None, np.ndarray | None, str | None]] = {}

    async def by_request(
        self, company: str, seat: str, request_id: str, conn: object | None = None
    ) -> SkillProposal | None:
        return next(
            (p for p, rid, _, _ in self.rows.values() if (p.company, p.seat, rid) == (company, seat, request_id)),
            None,
        )

    async def get(self, company: str, seat: str, proposal_id: uuid.UUID) -> SkillProposal | None:
        found = self.rows.get(proposal_id)
        return found[0] if found and (found[0].company, found[0].seat) == (company, seat) else None

    async def comparable(
        self, company: str, seat: str, conn: Tx | None = None
    ) -> list[tuple[SkillProposal, np.ndarray | None, str | None]]:
        return [
            (p, vec, model)
            for p, _, vec, model in self.rows.values()
            if (p.company, p.seat) == (company, seat) and p.state is not ProposalState.APPROVED
        ]

    async def insert(
        self, conn: Tx, proposal: SkillProposal, request_id: str | None, vector: np.ndarray | None, model: str | None
    ) -> SkillProposal | None:
        if request_id is not None and await self.by_request(proposal.company, proposal.seat, request_id):
            return None
        self.rows[proposal.id] = (proposal, request_id, vector, model if vector is not None else None)
        return proposal

    async def decide(
        self, company: str, seat: str, proposal_id: uuid.UUID, decision: ProposalDecision, now: datetime
    ) -> SkillProposal | None:
        found = await self.get(company, seat, proposal_id)
        if found is None or found.state is not ProposalState.PENDING:
            return None
        decided = dataclasses.replace(
            found,
            state=decision.state,
            decide_time=now,
            decided_by=decision.reviewer,
            decision_reason=decision.reason,
            skill_id=decision.skill_id,
        )
        _, rid, vec, model = self.rows[proposal_id]
        self.rows[proposal_id] = (decided, rid, vec, model)
        return decided

    async def page(
        self,
        company: str,
        seat: str,
        state: ProposalState | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[SkillProposal]:
        found = [
            p
            for p, _, _, _ in self.rows.values()
            if (p.company, p.seat) == (company, seat)
            and (state is None or p.state is state)
            and (after is None or (p.create_time, p.id) < after)
        ]
        return sorted(found, key=lambda p: (p.create_time, p.id), reverse=True)[:limit]


# ------------------------------------------------------------------ the use cases on the fakes

TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "github_create_pr"]


@dataclass
class Skills:
    service: SkillService
    proposals: ProposalService
    store: FakeSkillStore
    proposal_store: FakeProposalStore
    events: FakeEvents
    clock: ManualClock

    def key(self, name: str = "open-pr", seat: str = "ana") -> SkillKey:
        return SkillKey("acme", seat, name=name)

    async def create(self, name: str = "open-pr", tools: list[str] | None = None, **kw: object) -> Skill:
        self.clock.advance(seconds=1)
        body = str(kw.pop("body", f"# {name}\n\n1. Do it.\n"))
        draft = SkillDraft.single(name, f"Use for {name}", body, tools if tools is not None else TOOLS, f"run-{name}")
        return await self.service.create(
            "acme",
            str(kw.pop("seat", "ana")),
            draft,
            archived_are_learned=bool(kw.pop("archived_are_learned", True)),
        )


def make(
    *,
    synthesis: SkillSynthesisConfig | None = None,
    refinement: SkillRefinementConfig | None = None,
) -> Skills:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    store, pstore, events = FakeSkillStore(), FakeProposalStore(), FakeEvents()
    service = SkillService(
        store=store,
        clock=clock,
        synthesis=synthesis or SkillSynthesisConfig(),
        refinement=refinement or SkillRefinementConfig(),
        curator=SkillCuratorConfig(),
        events=events,
    )
    proposals = ProposalService(service, pstore, None, SkillProposalsConfig(), events)
    return Skills(service, proposals, store, pstore, events, clock)
