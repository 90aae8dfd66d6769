"""What the profile use cases need of a store (issue 13): the Postgres store implements it, the
unit tier's in-memory fake (tests/unit/fakes/profiles.py) too, so the rules are tested without a
database."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, Protocol

from services.profiles.domain import Limits, Observation, ObservationRecord, ObservationSource, Profile, Subject

__all__ = ["Merge", "ObservationWrite", "ProfilePage", "ProfileStore"]

Merge = Callable[[Profile], Profile | None]
"""The rule the service applies to the locked row: the merged profile, or None to leave it."""


@dataclass(frozen=True)
class ObservationWrite:
    """One observation to merge into a subject's profile: the one argument the port, the Postgres
    store and the unit tier's fake take, rather than each restating nine parameters."""

    company: str
    observer: str
    subject: Subject
    now: datetime
    merge: Merge
    request_id: str | None = None
    """An idempotency key: a key seen before changes nothing."""
    observation: Observation | None = None
    """With ``source``: recorded when the merge changes the profile."""
    source: ObservationSource | None = None
    keep_observations: int | None = None
    """Prune the recorded observations past this many newest (None: keep all)."""
    limits: Limits = field(default_factory=Limits)
    """The bounds the rows of one person are combined within (``domain.combine``)."""


class ProfilePage(NamedTuple):
    """A page of the observer's people and how many it has."""

    people: list[list[Profile]]
    """Each person's rows (``domain.linked``; several for a person whose rows were written before
    an upsert found a row by either identifier, one otherwise), most recently updated first by
    their newest row (``domain.newest``)."""
    total: int | None
    """The observer's people: its rows, a person with several counted once (None: not asked)."""


class ProfileStore(Protocol):
    async def observe(self, write: ObservationWrite) -> tuple[Profile, bool, bool]:
        """Apply ``write.merge`` to the subject's profile atomically, creating it on the first
        observation; returns (profile, created, changed). The profile is the row named by either of
        the subject's identifiers (``domain.linked``); several such rows (written before that rule)
        are first folded into the oldest (``domain.combine``), which keeps the folded rows' ids
        (``get`` finds it by them). A ``request_id`` seen before changes nothing: it is recorded in
        the same step as the merge, so a retry after a crash either finds it (the merge committed)
        or applies the merge (it did not). When the merge changes the
        profile and an ``observation`` with its ``source`` is given, it is recorded in the same step
        (never for a replay: a ``request_id`` seen before, or a merge that returns None); with
        ``keep_observations``, the observations past that many newest are pruned
        (:func:`services.profiles.domain.prunable`) in that step too."""
        ...

    async def get(self, company: str, observer: str, profile_id: uuid.UUID) -> Profile | None:
        """The observer's profile by id, or the row a row of that id was folded into by an upsert
        (``observe``); None for another observer's or company's."""
        ...

    async def observations(
        self, company: str, observer: str, profile_ids: Sequence[uuid.UUID], limit: int
    ) -> list[ObservationRecord]:
        """The recorded observations of the profiles (one person's rows), newest first, at most
        ``limit``."""
        ...

    async def get_many(self, company: str, observer: str, subjects: Sequence[Subject]) -> list[Profile]:
        """At least every row of the observer linked to one of ``subjects`` (``domain.linked``: by
        either identifier, and through the identifiers the rows learned); the service keeps and
        combines each subject's."""
        ...

    async def page(
        self,
        company: str,
        observer: str,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        *,
        count: bool = True,
    ) -> ProfilePage:
        """At most ``limit`` of the observer's people after the (update_time, id) cursor of a
        person's newest row, and, when ``count``, the count of all its people."""
        ...
