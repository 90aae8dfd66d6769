"""The skills' store ports (issue 13): what the use cases (``service``, ``proposals``, ``passes``)
need of a store, as ``typing.Protocol``s. ``store.PostgresSkillStore`` / ``PostgresProposalStore``
are the adapters the service runs on; ``tests/unit/fakes/skills.py`` holds the in-memory fakes the
unit tier runs the same use cases on.

Two operations are transactions the use case works inside: ``seat`` (the seat's lock, so the
catalogue cannot change under a gate) and ``skill_row`` (one skill's row lock, for a new version or
an operator edit). Their handle (``Tx``) is opaque to the use cases: they only pass it back to the
store that gave it (the Postgres adapter's is its connection, the fake's is nothing), which keeps
the version writes and a proposal's insert inside the same transaction as their checks.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import numpy as np

from agentlearn.common.v1.provenance_pb2 import Provenance
from services.skills.domain import (
    LearningHealth,
    ProposalDecision,
    ProposalState,
    Skill,
    SkillDraft,
    SkillEdit,
    SkillKey,
    SkillProposal,
    SkillState,
    SkillVersion,
)

__all__ = ["Moved", "ProposalStore", "SeatTx", "SkillStore", "Tx", "Used"]

Tx = Any
"""A store's transaction handle, passed back to the store that gave it and never looked into."""

Moved = tuple[uuid.UUID, str, SkillState, SkillState]
"""A stamp's effect on one skill: (id, name, state before, state after)."""


class Used(NamedTuple):
    """A use (:meth:`SkillStore.use`): the skill after it and its state before; ``counted`` false
    when the use's key was recorded before (a retry: nothing written, the skill as it is)."""

    skill: Skill
    prior: SkillState
    counted: bool = True


class SeatTx(Protocol):
    """A transaction holding one seat's lock."""

    @property
    def conn(self) -> Tx: ...

    async def name_taken(self, name: str) -> bool: ...

    async def live_skills(self) -> list[Skill]: ...

    async def all_skills(self) -> list[Skill]: ...

    async def count_live(self) -> int: ...

    async def insert(self, draft: SkillDraft, provenance: Provenance, now: datetime) -> Skill:
        """The draft as the seat's new active skill, created ``now``; ``provenance`` is where it
        came from (kept with the row and its first version, not part of ``Skill``)."""
        ...

    async def get_for_update(self, key: SkillKey) -> Skill | None: ...

    async def set_state(self, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool) -> Skill: ...


class SkillStore(Protocol):
    """The seats' skill catalogues and their kept versions."""

    def seat(self, company: str, seat: str) -> AbstractAsyncContextManager[SeatTx]: ...

    def skill_row(
        self, key: SkillKey, request_id: str | None = None
    ) -> AbstractAsyncContextManager[tuple[Tx, Skill | None, bool]]:
        """One skill's row lock (None: no such skill), and whether the call with idempotency key
        ``request_id`` made a kept version of it (False without one): a redelivery changes nothing."""
        ...

    async def get(self, key: SkillKey) -> Skill | None: ...

    async def live_skills(self, company: str, seat: str) -> list[Skill]: ...

    async def all_skills(self, company: str, seat: str) -> list[Skill]: ...

    async def page(
        self, company: str, seat: str, include_archived: bool, after_name: str | None, limit: int
    ) -> list[Skill]: ...

    async def count(self, company: str, seat: str, include_archived: bool) -> int: ...

    async def versions_page(self, skill_id: uuid.UUID, before: int | None, limit: int) -> list[SkillVersion]: ...

    async def versions_count(self, skill_id: uuid.UUID) -> int: ...

    async def health(self, company: str, seat: str, now: datetime) -> LearningHealth: ...

    async def use(self, key: SkillKey, now: datetime, timeout: float, request_id: str | None = None) -> Used | None:
        """Record a use: the skill after it and its state before, or None when the seat has no live
        skill under the key. With ``request_id``, the key is recorded with the use and a key used
        before records nothing (``Used.counted`` false: the skill as it is). Raises
        ``store.StampFailed`` when the stamp cannot be written."""
        ...

    async def offer(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], names: Sequence[str], now: datetime, timeout: float
    ) -> list[Moved]:
        """Move the clock of the named live skills: how each moved. Raises ``store.StampFailed``
        when the stamp cannot be written."""
        ...

    async def mark_used(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, request_id: str | None
    ) -> list[Moved] | None:
        """Record a use of each named live skill; None when ``request_id`` was applied before."""
        ...

    async def new_version(
        self, conn: Tx, skill: Skill, edit: SkillEdit, now: datetime, keep: int, bullet: str | None = None
    ) -> Skill:
        """The live body archived, ``edit``'s installed as the next version, the kept versions
        trimmed to ``keep`` (inside ``skill_row``'s transaction). ``bullet``: the practice bullet
        the edit appends, whose record (where it came from: ``edit``'s provenance) is written with
        it, so an erasure can take one person's bullets out of the body without a model."""
        ...

    async def keyed_version(self, conn: Tx, skill_id: uuid.UUID, request_id: str) -> SkillVersion | None:
        """The version (live or kept) the call with idempotency key ``request_id`` made, if kept."""
        ...

    async def archived_body(self, conn: Tx, skill_id: uuid.UUID, version: int) -> tuple[str, Provenance] | None:
        """A kept version's body and where it came from."""
        ...

    async def set_pinned(self, conn: Tx, skill_id: uuid.UUID, pinned: bool, now: datetime) -> Skill: ...

    async def set_state(
        self, conn: Tx, skill_id: uuid.UUID, state: SkillState, now: datetime, *, reset_clock: bool
    ) -> Skill: ...

    async def curate(
        self, from_state: SkillState, to_state: SkillState, event: str, cutoff: datetime, now: datetime, batch: int
    ) -> int: ...


class ProposalStore(Protocol):
    """The seats' skill proposals."""

    async def by_request(
        self, company: str, seat: str, request_id: str, conn: Tx | None = None
    ) -> SkillProposal | None:
        """The seat's proposal filed under ``request_id``; read in ``conn`` (the seat's transaction)
        when given."""
        ...

    async def get(self, company: str, seat: str, proposal_id: uuid.UUID) -> SkillProposal | None: ...

    async def comparable(
        self, company: str, seat: str, conn: Tx | None = None
    ) -> list[tuple[SkillProposal, np.ndarray | None, str | None]]:
        """The seat's pending and rejected proposals, each with its stored vector and its model."""
        ...

    async def insert(
        self, conn: Tx, proposal: SkillProposal, request_id: str | None, vector: np.ndarray | None, model: str | None
    ) -> SkillProposal | None:
        """The stored proposal, inside the skills store's seat transaction (``conn`` is its
        ``SeatTx.conn``); None when ``request_id`` was used before (see ``by_request``)."""
        ...

    async def decide(
        self, company: str, seat: str, proposal_id: uuid.UUID, decision: ProposalDecision, now: datetime
    ) -> SkillProposal | None:
        """The pending proposal moved to ``decision.state``; None when it was not pending."""
        ...

    async def page(
        self,
        company: str,
        seat: str,
        state: ProposalState | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[SkillProposal]: ...
