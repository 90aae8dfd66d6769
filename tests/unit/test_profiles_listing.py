"""ListProfiles and GetProfileProvenance on the in-memory store (unit tier): a person whose rows
were written apart before an upsert found a row by either identifier is listed once, merged as
GetProfiles answers them, at the newer row's place; a folded row's id still reaches the person."""

from __future__ import annotations

import dataclasses

from libs.common.clock import ManualClock
from services.profiles.domain import Subject, empty
from services.profiles.service import ProfileService
from tests.unit.fakes.profiles import FakeProfileStore


class _Events:
    async def emit(self, kind: str, **payload: object) -> None:
        return None


async def test_a_person_with_two_rows_is_listed_once_and_a_folded_id_keeps_its_provenance() -> None:
    store, clock = FakeProfileStore(), ManualClock()
    service = ProfileService(store=store, clock=clock, events=_Events())
    first, _ = await service.upsert_profile("acme", "ana", ("", "U042", "slack"), "", [], [], ["latency"], "run-1")
    clock.advance(seconds=60)
    await service.upsert_profile("acme", "ana", ("cara", "", "slack"), "", [], [], ["pricing"], "run-2")
    clock.advance(seconds=60)
    # bob's second row, filed under the handle, as an upsert wrote it before it found rows by either id.
    second = dataclasses.replace(
        empty("acme", "ana", Subject("slack", "bob", "U042"), clock.now()), topics=("budgets",), observation_count=1
    )
    store.profiles[second.id] = second
    [merged] = await service.get_profiles("acme", "ana", [("bob", "", "slack")])
    for size in (1, 2, 50):
        listed, token = [], ""
        while True:
            page, token, total = await service.list_profiles("acme", "ana", size, token)
            assert total == 2 and len(page) <= size
            listed += page
            if not token:
                break
        assert listed == [merged, next(p for p in store.profiles.values() if p.subject.handle == "cara")], size
    assert merged.id == first.id and merged.topics == ("budgets", "latency")
    clock.advance(seconds=60)
    await service.upsert_profile("acme", "ana", ("bob", "", "slack"), "", [], [], ["hiring"], "run-3")
    assert second.id not in store.profiles
    profile, observations, _ = await service.provenance("acme", "ana", str(second.id))
    assert profile.id == first.id and [o.source.turn_ids for o in observations] == [("run-3",), ("run-1",)]
