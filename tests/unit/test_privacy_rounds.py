"""Unit tier (no Postgres, no model, no gRPC): an erasure's rounds fold into one receipt per owner,
and each round is recorded by an owner under its own id."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from libs.common.erasure import Kind, Report, round_id
from services.privacy.domain import Erasure, ErasureState, report_key


def _report(owner: str, table: str, ids: list[str], *, changed: bool = False) -> Report:
    report = Report(owner)
    report.add(table, ids, changed=changed)
    return report


def test_round_ids_are_the_erasure_id_first_then_distinct_and_stable() -> None:
    eid = uuid.uuid4()
    assert round_id(eid, 1) == eid
    assert round_id(eid, 2) == round_id(eid, 2) != eid
    assert len({round_id(eid, n) for n in range(1, 4)}) == 3
    assert report_key("diary", 1) == "diary" and report_key("diary", 2) == "diary#2"


def test_the_receipt_folds_every_round_into_one_report_per_owner() -> None:
    erasure = Erasure(
        id=uuid.uuid4(),
        company="acme",
        kind=Kind.SUBJECT,
        seat="",
        subject_digest="d",
        requested_by="local",
        state=ErasureState.RUNNING,
        create_time=datetime(2026, 1, 1, tzinfo=UTC),
    )
    erasure.reports = {
        "diary": _report("diary", "agent_diary", ["a", "b"]),
        "diary#2": _report("diary", "agent_diary", ["c"]),
        "episodes#2": _report("episodes", "episodes:rederived", ["e"], changed=True),
        "episodes": _report("episodes", "episodes", ["x"]),
    }
    receipt = erasure.receipt()
    assert sorted(receipt) == ["diary", "episodes"]
    diary = receipt["diary"].tables["agent_diary"]
    assert (diary.count, diary.ids) == (3, ["a", "b", "c"])
    episodes = receipt["episodes"].tables
    assert episodes["episodes"].count == 1 and episodes["episodes:rederived"].changed == 1
    # The stored round reports are not changed by folding them.
    assert erasure.reports["diary"].tables["agent_diary"].count == 2
