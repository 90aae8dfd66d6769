"""libs.common.field_copy: the one set of rules the servicers' domain↔proto copies follow."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from libs.common.field_copy import from_pb, to_pb


@dataclass(frozen=True)
class _Row:
    id: uuid.UUID
    company: str
    turn_id: str | None
    start_time: datetime | None
    end_time: datetime | None
    tools_called: tuple[str, ...]
    count: int


def test_to_pb_converts_each_named_field_and_leaves_none_unset() -> None:
    row = _Row(uuid.uuid4(), "acme", None, datetime(2026, 3, 1, 12, tzinfo=UTC), None, ("grep", "sed"), 3)
    msg = to_pb(pb.Episode, row, "id company turn_id start_time end_time tools_called count", label="given")
    assert msg.id == str(row.id)
    assert msg.company == "acme" and msg.count == 3 and msg.label == "given"
    assert msg.turn_id == ""  # None: unset
    assert msg.HasField("start_time") and msg.start_time.ToDatetime(tzinfo=UTC) == row.start_time
    assert not msg.HasField("end_time")
    assert list(msg.tools_called) == ["grep", "sed"]


def test_to_pb_copies_only_the_named_fields() -> None:
    row = _Row(uuid.uuid4(), "acme", "t-1", None, None, (), 3)
    msg = to_pb(pb.Episode, row, "company")
    assert msg.company == "acme" and msg.turn_id == "" and msg.count == 0 and msg.id == ""


def test_from_pb_reads_repeated_as_tuples_and_unset_timestamps_as_none() -> None:
    msg = pb.RecordEpisodeRequest(company="acme", turn_id="t-1", tools_called=["a", "b"])
    msg.start_time.FromDatetime(datetime(2026, 3, 1, 12, tzinfo=UTC))
    got = from_pb(_Row, msg, "company turn_id start_time end_time tools_called", id=uuid.UUID(int=1), count=7)
    assert got == _Row(uuid.UUID(int=1), "acme", "t-1", datetime(2026, 3, 1, 12, tzinfo=UTC), None, ("a", "b"), 7)
