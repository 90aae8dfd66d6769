"""An in-memory ``ProfileStore`` (services/profiles/ports.py) for the unit tier: the same contract
as the Postgres store — atomic merge, idempotency keys, the observation recorded only with a merge
that changed the row — with dicts instead of tables."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from services.profiles.domain import (
    ObservationRecord,
    Profile,
    Subject,
    empty,
    prunable,
)
from services.profiles.ports import ObservationWrite

__all__ = ["FakeProfileStore"]


class FakeProfileStore:
    def __init__(self) -> None:
        self.profiles: dict[tuple[str, str, str, str], Profile] = {}
        self.requests: set[tuple[str, str, str]] = set()
        self.records: list[ObservationRecord] = []

    async def observe(self, write: ObservationWrite) -> tuple[Profile, bool, bool]:
        current = self.profiles.get(write.key)
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
        self.profiles[write.key] = merged
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
        return next(
            (
                p
                for p in self.profiles.values()
                if p.id == profile_id and (p.company, p.observer) == (company, observer)
            ),
            None,
        )

    async def observations(
        self, company: str, observer: str, profile_id: uuid.UUID, limit: int
    ) -> list[ObservationRecord]:
        if await self.get(company, observer, profile_id) is None:
            return []
        mine = [r for r in self.records if r.profile_id == profile_id]
        return sorted(mine, key=lambda r: (r.observe_time, str(r.id)), reverse=True)[:limit]

    async def get_many(self, company: str, observer: str, subjects: Sequence[Subject]) -> list[Profile]:
        keys = {(company, observer, s.platform, s.key) for s in subjects}
        return [p for k, p in self.profiles.items() if k in keys]

    async def count(self, company: str, observer: str) -> int:
        return sum(1 for k in self.profiles if k[:2] == (company, observer))

    async def page(
        self, company: str, observer: str, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[Profile]:
        mine = sorted(
            (p for k, p in self.profiles.items() if k[:2] == (company, observer)),
            key=lambda p: (p.update_time, str(p.id)),
            reverse=True,
        )
        if after is not None:
            mine = [p for p in mine if (p.update_time, str(p.id)) < (after[0], str(after[1]))]
        return mine[:limit]
