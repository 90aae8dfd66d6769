"""The refresh tool's use case (``Builtins.refresh_memory``) on the in-memory prefetch store and
the diary faked at its client boundary, the filter answered by the offline rule: a run's refreshes
are capped, a repeated hint is answered from the run's ledger at no cost (a larger limit shows more,
and only the newly shown notes count as uses), a failed diary read spends its slot and is not
cached. No Postgres, no model, no gRPC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.auxmodel import AuxiliaryModel, OfflineRules, build_providers
from libs.common.clock import ManualClock
from libs.common.config import Settings
from libs.common.errors import ResourceExhausted
from services.prefetch.bootstrap import register_rules
from services.prefetch.builtins import Builtins
from services.prefetch.deps import Deps
from services.prefetch.past_turns import PastTurns
from tests.unit.fakes.prefetch import FakeClients, FakeDiaryClient, FakePrefetchStore
from tests.unit.fakes.reflector import FakeEvents

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HALVES = [diary_pb.RECALL_HALF_VECTOR, diary_pb.RECALL_HALF_LEXICAL]


def _candidate(i: int) -> diary_pb.RecallCandidate:
    note = diary_pb.Note(id=f"n{i}", company="acme", seat="agent-1", content=f"invoice detail number {i}")
    return diary_pb.RecallCandidate(note=note, similarity=0.9, lexical_rank=1.0, found_by=HALVES)


def _builtins(cap: int = 2) -> tuple[Builtins, FakePrefetchStore, FakeDiaryClient]:
    settings = Settings.model_validate({"learning": {"personal_memory": {"max_refreshes_per_turn": cap}}})
    clock = ManualClock(T0)
    rules = OfflineRules()
    register_rules(rules)
    aux = AuxiliaryModel(settings, build_providers(settings, rules), None, None, clock)
    store, diary = FakePrefetchStore(), FakeDiaryClient([_candidate(i) for i in range(4)])
    clients: Any = FakeClients(diary)
    deps = Deps(settings, aux, None, clients, store, None, FakeEvents(), clock)  # type: ignore[arg-type]
    return Builtins(deps, PastTurns(aux, settings.learning)), store, diary


async def _refresh(builtins: Builtins, hint: str, limit: int = 2) -> Any:
    return await builtins.refresh_memory("acme", "agent-1", "run-1", hint, limit, (), "support")


async def test_a_repeated_hint_is_answered_from_the_ledger_and_counts_only_new_uses() -> None:
    builtins, _, diary = _builtins()
    first = await _refresh(builtins, "the invoice", limit=2)
    assert (first.spent, first.from_ledger, len(first.note_ids)) == (1, False, 2)
    assert diary.used == first.note_ids and diary.recalls == 1

    # The same hint (normalised), a larger limit: from the ledger, nothing spent, no diary read;
    # only the notes shown for the first time now count as uses.
    again = await _refresh(builtins, "  The   INVOICE ", limit=3)
    assert (again.spent, again.from_ledger, diary.recalls) == (1, True, 1)
    assert again.note_ids[:2] == first.note_ids and len(again.note_ids) == 3
    assert diary.used == again.note_ids  # the third note's use added, the first two not again
    # A repeat showing no more records no use.
    await _refresh(builtins, "the invoice", limit=1)
    assert diary.used == again.note_ids


async def test_the_cap_refuses_a_new_hint_but_still_answers_a_cached_one() -> None:
    builtins, _, _ = _builtins(cap=2)
    await _refresh(builtins, "hint one")
    await _refresh(builtins, "hint two")
    with pytest.raises(ResourceExhausted) as refused:
        await _refresh(builtins, "hint three")
    assert refused.value.reason == "REFRESH_LIMIT_REACHED"
    cached = await _refresh(builtins, "hint one")
    assert cached.from_ledger and cached.spent == 2


async def test_a_failed_diary_read_spends_its_slot_and_is_not_cached() -> None:
    builtins, store, diary = _builtins(cap=2)
    diary.down = True
    failed = await _refresh(builtins, "the invoice")
    assert (failed.spent, failed.note_ids, failed.from_ledger) == (1, [], False)
    assert "could not be read (UNAVAILABLE)" in failed.text
    diary.down = False
    retried = await _refresh(builtins, "the invoice")  # read again, another slot
    assert (retried.spent, retried.from_ledger, diary.recalls) == (2, False, 2) and retried.note_ids
    assert await store.runs("acme") == 1
