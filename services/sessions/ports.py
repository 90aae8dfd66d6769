"""The ports the session use cases (``service.SessionService``) depend on: the session store and
the job queue a check is queued on. ``store.PostgresSessionStore`` and ``libs.common.jobs.JobQueue``
are the adapters; tests/unit/fakes/sessions.py holds in-memory ones, so the unit tier runs the use
cases (ownership, triggers, plan revisions, paging) with no Postgres.

A check's receipt and its job commit together: the store's transaction (``SessionTx``) hands its
``conn`` to the queue, which the adapters read as the asyncpg connection and a fake as an opaque
token of the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

from libs.common.jobs import EnqueueQueue
from services.sessions.domain import (
    Event,
    LearningCheck,
    NewCheck,
    PlanStep,
    Session,
    SessionFilter,
    SessionSummary,
    TurnWindow,
)

__all__ = ["CheckQueue", "SessionStore", "SessionTx"]


class SessionTx(Protocol):
    """One session's row lock, held for a transaction: everything written through it commits together."""

    @property
    def session(self) -> Session: ...

    @property
    def conn(self) -> Any:
        """The transaction, for a queue to enqueue into (opaque here)."""
        ...

    async def seen(self, event_ids: Sequence[str]) -> set[str]:
        """Which of ``event_ids`` the session already has."""
        ...

    async def insert_events(self, events: Sequence[Event], now: datetime) -> list[Event]:
        """Record ``events`` after the session's last one; returns them with their sequence."""
        ...

    async def plan(self, revision: int) -> list[PlanStep] | None:
        """The steps of ``revision`` ([] for revision 0; None when it was never saved)."""
        ...

    async def insert_plan(self, revision: int, steps: Sequence[PlanStep], now: datetime) -> None: ...

    async def turn_window(self, turn_id: str, end: Event) -> TurnWindow:
        """The turn's work no check covered yet, up to its end."""
        ...

    async def active_check(self) -> LearningCheck | None:
        """The session's queued or running check, if any."""
        ...

    async def insert_check(self, new: NewCheck, now: datetime) -> LearningCheck | None:
        """The receipt of a new check, queued; None when the job key was queued before."""
        ...

    async def drop_leftover_job(self, key: str, receipt: uuid.UUID) -> None:
        """Delete the learning job of ``key`` unless a receipt other than ``receipt`` holds the key."""
        ...


class SessionStore(Protocol):
    def open_session(
        self, company: str, session_id: str, create: Session | None, now: datetime
    ) -> AbstractAsyncContextManager[SessionTx | None]:
        """A transaction holding the session's lock; ``create`` makes it when it does not exist.
        Yields None for a session that does not exist (and is not created)."""
        ...

    async def get_session(self, company: str, session_id: str) -> Session | None: ...

    async def sessions_page(
        self, where: SessionFilter, after: tuple[datetime, str] | None, limit: int
    ) -> list[SessionSummary]:
        """Most recently active first, after the cursor ``after`` (update time, session id)."""
        ...

    async def checks_page(
        self, company: str, session_id: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[LearningCheck]: ...

    async def away_page(
        self,
        company: str,
        owner: str,
        since: datetime,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        *,
        seat: str | None = None,
    ) -> list[LearningCheck]:
        """The owner's checks finished since ``since``, newest first (of ``seat`` only, when named)."""
        ...

    async def lesson_by_page(self, company: str, page_id: str) -> tuple[str, str, Any] | None:
        """(workspace, title, kept sources) of the workspace lesson filed as the page (issue 17)."""
        ...

    async def away_counts(
        self, company: str, owner: str, since: datetime, *, seat: str | None = None
    ) -> dict[str, int]:
        """Finished checks since ``since`` by state (of ``seat`` only, when named)."""
        ...


class CheckQueue(EnqueueQueue, Protocol):
    """Where a check's job goes (``libs.common.jobs.JobQueue``: kind ``learning``), in the caller's
    transaction ``conn``; its id, or None when ``key`` was queued before."""
