"""An in-memory ``ProfileStore`` (services/profiles/ports.py) for the unit tier: the same contract
as the Postgres store — atomic merge, idempotency keys, the observation recorded only with a merge
that changed the row — with dicts instead of tables."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from services.profiles.domain import (
    ObservationRecord,
    Profile,
    Subject,
    combine,
    empty,
    linked,
    newest,
    prunable,
)
from services.profiles.ports import ObservationWrite, ProfilePage

__all__ = ["FakeProfileStore"]


class FakeProfileStore:
    def __init__(self) -> None:
        self.profiles: dict[uuid.UUID, Profile] = {}
        self.requests: set[tuple[str, str, str]] = set()
        self.records: list[ObservationRecord] = []
        self.folded: dict[uuid.UUID, uuid.UUID] = {}
        """A folded row's id -> the row it went into."""

    async def observe(self, write: ObservationWrite) -> tuple[Profile, bool, bool]:
        # The subject's rows by either identifier, folded into the oldest (as the store does).
        rows = linked(
            write.subject,
            (p for p in self.profiles.values() if (p.company, p.observer) == (write.company, write.observer)),
        )
        current = combine(rows, write.limits) if rows else None
        if current is not None:
            for p in rows:
                self.profiles.pop(p.id)
            gone = {p.id for p in rows if p.id != current.id}
            self.folded = {k: current.id if v in gone else v for k, v in self.folded.items()}
            self.folded.update((g, current.id) for g in gone)
            self.profiles[current.id] = current
            self.records = [
                replace(r, profile_id=current.id) if r.profile_id in {p.id for p in rows} else r for r in self.records
            ]
        if write.request_id is not None:
            request = (write.company, write.observer, write.request_id)
            if request in self.requests and current is not None:
                return current, False, False
            self.requests.add(request)
        created = current is None
        if current is None:
            current = empty(write.company, write.observer, write.subject, write.now)
        merged = write.merge(current)
        if merged is None:
            assert not created
            return current, False, False
        self.profiles[merged.id] = merged
        observation, source = write.observation, write.source
        if observation is not None and source is not None:
            self.records.append(
                ObservationRecord(
                    id=uuid.uuid4(),
                    profile_id=merged.id,
                    source=source,
                    communication_style=observation.communication_style or "",
                    past_decisions=observation.past_decisions,
                    sensitivities=observation.sensitivities,
                    topics=observation.topics,
                    observe_time=write.now,
                )
            )
            if write.keep_observations is not None:
                mine = sorted(
                    (r for r in self.records if r.profile_id == merged.id),
                    key=lambda r: (r.observe_time, str(r.id)),
                    reverse=True,
                )
                gone = set(prunable(merged, mine[write.keep_observations :]))
                self.records = [r for r in self.records if r.id not in gone]
        return merged, created, True

    async def get(self, company: str, observer: str, profile_id: uuid.UUID) -> Profile | None:
        profile_id = self.folded.get(profile_id, profile_id)
        return next(
            (
                p
                for p in self.profiles.values()
                if p.id == profile_id and (p.company, p.observer) == (company, observer)
            ),
            None,
        )

    async def observations(
        self, company: str, observer: str, profile_ids: Sequence[uuid.UUID], limit: int
    ) -> list[ObservationRecord]:
        ids = {
            p.id for i in profile_ids if (p := self.profiles.get(i)) and (p.company, p.observer) == (company, observer)
        }
        mine = [r for r in self.records if r.profile_id in ids]
        return sorted(mine, key=lambda r: (r.observe_time, str(r.id)), reverse=True)[:limit]

    async def get_many(self, company: str, observer: str, subjects: Sequence[Subject]) -> list[Profile]:
        mine = [p for p in self.profiles.values() if (p.company, p.observer) == (company, observer)]
        return [p for p in mine if any(p in linked(s, mine) for s in subjects)]

    async def page(
        self,
        company: str,
        observer: str,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        *,
        count: bool = True,
    ) -> ProfilePage:
        mine = [p for p in self.profiles.values() if (p.company, p.observer) == (company, observer)]
        people: list[list[Profile]] = []
        for p in mine:  # each person once: its rows (``linked``)
            if not any(p in rows for rows in people):
                people.append(linked(p.subject, mine))
        people.sort(key=lambda rows: (newest(rows).update_time, newest(rows).id), reverse=True)
        listed = [rows for rows in people if after is None or (newest(rows).update_time, newest(rows).id) < after]
        return ProfilePage(listed[:limit], len(people) if count else None)
