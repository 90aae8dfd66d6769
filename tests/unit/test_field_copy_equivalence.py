"""The compiled conversions (``field_copy.to_pb``/``from_pb``, ``protoconv`` timestamps, ``RowReader``)
give what the plain ones they replaced gave: the plain ones are copied here as the reference, and
both are run over ~50,000 seeded random values (None, empty, unicode, naive/aware/odd datetimes,
enums, UUIDs, repeated fields as tuples, lists and frozensets). A message must serialise to the same
bytes and compare equal, a domain object compare equal with the same types (a datetime's tzinfo
too), and a value either refuses must be refused by both with the same kind of error."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum, StrEnum
from operator import itemgetter
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as episodes_pb
from agentlearn.skills.v1 import skill_service_pb2 as skills_pb
from libs.common import field_copy, protoconv
from libs.common.rows import RowReader

# ------------------------------------------------------------------ the reference: the old code, as it was


def _old_timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _old_when(msg: Message, field: str) -> datetime | None:
    if not msg.HasField(field):
        return None
    ts: Timestamp = getattr(msg, field)
    return ts.ToDatetime(tzinfo=UTC)


_OLD_AS_IS = frozenset({str, int, float, bool, bytes})


def _old_pb_value(value: Any) -> Any:
    if type(value) in _OLD_AS_IS:
        return value
    if isinstance(value, datetime):
        return _old_timestamp(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple | list | frozenset):
        return list(value)
    return value


def old_to_pb(cls: type[Message], source: object, names: str, /, **given: Any) -> Message:
    fields_ = {name: _old_pb_value(value) for name in names.split() if (value := getattr(source, name)) is not None}
    fields_.update((name, _old_pb_value(value)) for name, value in given.items() if value is not None)
    return cls(**fields_)


def _old_domain_value(msg: Message, name: str) -> Any:
    field = msg.DESCRIPTOR.fields_by_name[name]
    value = getattr(msg, name)
    if field.is_repeated:
        return tuple(value)
    if field.message_type is not None and field.message_type.full_name == "google.protobuf.Timestamp":
        return _old_when(msg, name)
    return value


def old_from_pb(cls: Callable[..., Any], msg: Message, names: str, /, **given: Any) -> Any:
    values = {name: _old_domain_value(msg, name) for name in names.split()}
    values.update(given)
    return cls(**values)


class OldRowReader:
    def __init__(
        self,
        cls: type[Any],
        convert: Mapping[str, Callable[[Any], Any]] | None = None,
        computed: Mapping[str, Callable[[Mapping[str, Any]], Any]] | None = None,
    ):
        convert, computed = convert or {}, computed or {}
        self._cls = cls
        self._getters = tuple(
            _old_getter(f.name, convert.get(f.name), computed.get(f.name)) for f in fields(cls) if f.init
        )

    def __call__(self, row: Mapping[str, Any]) -> Any:
        return self._cls(*[get(row) for get in self._getters])


def _old_getter(
    name: str, convert: Callable[[Any], Any] | None, computed: Callable[[Mapping[str, Any]], Any] | None
) -> Callable[[Mapping[str, Any]], Any]:
    if computed is not None:
        return computed
    if convert is not None:
        return lambda row: convert(row[name])
    return itemgetter(name)


# ------------------------------------------------------------------ random values


class _Subclassed(datetime):
    pass


def _zones() -> list[Any]:
    zones: list[Any] = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    for name in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        try:
            zones.append(ZoneInfo(name))
        except Exception:  # no tz database here: the fixed offsets still cover aware datetimes
            pass
    return zones


_ZONES = _zones()
_TEXT = ["", "a", "acme", "ünïcødé ✓", "日本語のメモ", "emoji 🧠🔥", "x" * 300, "tab\tnew\nline", "\x00nul"]


def _datetime(rnd: random.Random) -> Any:
    kind = rnd.random()
    if kind < 0.02:  # at the range's edges, where an offset can spill past it
        base = rnd.choice([datetime.min, datetime.max, datetime(1, 1, 1, 0, 30), datetime(9999, 12, 31, 23, 30)])
        return base.replace(tzinfo=rnd.choice(_ZONES))
    if kind < 0.04:  # an offset with seconds or microseconds
        odd = timedelta(seconds=rnd.randint(0, 59), microseconds=rnd.choice([0, 1, 999_999]))
        tz = timezone(timedelta(minutes=rnd.randint(-1439, 1438)) + odd)
        return datetime(rnd.randint(1, 9999), 6, 15, 12, tzinfo=tz)
    if kind < 0.06:
        return _Subclassed(2026, rnd.randint(1, 12), 1, rnd.randint(0, 23), tzinfo=UTC)
    year = rnd.choice([1, 2, 1969, 1970, 1971, 2000, 2026, 2038, 9998, 9999, rnd.randint(1, 9999)])
    value = datetime(
        year,
        rnd.randint(1, 12),
        rnd.randint(1, 28),
        rnd.randint(0, 23),
        rnd.randint(0, 59),
        rnd.randint(0, 59),
        rnd.choice([0, 1, 999_999, rnd.randint(0, 999_999)]),
        fold=rnd.randint(0, 1),
    )
    if kind < 0.2:
        return value  # naive
    return value.replace(tzinfo=rnd.choice(_ZONES))


class _Tier(IntEnum):
    A = 1
    B = 2


class _Label(StrEnum):
    X = "x"


def _value(rnd: random.Random, field: Any) -> Any:
    """A value for ``field`` (a FieldDescriptor) as a domain record might hold it, or an odd one."""
    if rnd.random() < 0.15:
        return None
    if field.is_repeated:
        items: list[Any] = [rnd.choice(_TEXT) for _ in range(rnd.randint(0, 4))] if field.message_type is None else []
        if field.enum_type is not None:
            items = [rnd.choice(field.enum_type.values).number for _ in range(rnd.randint(0, 3))]
        elif field.cpp_type != field.CPPTYPE_STRING and field.message_type is None:
            items = [rnd.randint(0, 9) for _ in range(rnd.randint(0, 3))]
        kinds: list[Callable[[list[Any]], Any]] = [tuple, list] if field.enum_type else [tuple, list, frozenset]
        return rnd.choice(kinds)(items)
    if field.message_type is not None:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return _datetime(rnd) if rnd.random() < 0.95 else _old_timestamp(datetime(2026, 1, 1, tzinfo=UTC))
        return field.message_type._concrete_class() if hasattr(field.message_type, "_concrete_class") else None
    if field.enum_type is not None:
        return rnd.choice([rnd.choice(field.enum_type.values).number, _Tier.A, 0])
    if field.cpp_type == field.CPPTYPE_STRING:
        return rnd.choice([rnd.choice(_TEXT), uuid.UUID(int=rnd.getrandbits(128)), _Label.X, ""])
    if field.cpp_type == field.CPPTYPE_BOOL:
        return rnd.choice([True, False])
    if field.cpp_type in (field.CPPTYPE_DOUBLE, field.CPPTYPE_FLOAT):
        return rnd.choice([0.0, -0.0, 1.5, rnd.random(), 3, float("inf")])
    if rnd.random() < 0.02:  # an IntEnum passes; a bool is refused (by both)
        return rnd.choice([_Tier.B, True])
    if field.cpp_type in (field.CPPTYPE_UINT32, field.CPPTYPE_UINT64):
        return rnd.choice([0, 1, rnd.randint(0, 2**31 - 1)])
    return rnd.choice([0, -1, 1, rnd.randint(-(2**31), 2**31 - 1)])


def _outcome(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", call(*args, **kwargs)
    except Exception as e:
        return "raised", type(e)


def _same_message(old: tuple[str, Any], new: tuple[str, Any]) -> None:
    assert old[0] == new[0], (old, new)
    if old[0] == "raised":
        assert old[1] is new[1]
        return
    a, b = old[1], new[1]
    assert type(a) is type(b)
    assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
    assert a == b
    for f in a.DESCRIPTOR.fields:
        if f.has_presence:
            assert a.HasField(f.name) == b.HasField(f.name), f.name


_SHAPES: list[tuple[type[Message], str, tuple[str, ...]]] = [
    (
        diary_pb.Note,
        "id company seat content turn_id create_time expire_time use_count last_used_time embedding_model",
        ("tier", "source", "embedding_dimensions"),
    ),
    (
        episodes_pb.Episode,
        "id company seat turn_id work_item label ask what_it_did review_outcome tool_sequence tools_called"
        " skills_used conversation_id start_time end_time duration_ms count common_task_pattern common_outcome"
        " success_rate done_count subjects_involved notable_patterns exemplar_turn_ids consolidated_into_skill_id"
        " embedding_model subjects role work_key",
        ("kind", "outcome", "embedding_dimensions"),
    ),
    (
        skills_pb.Skill,
        "id company seat name summary tool_sequence cluster_size source_turn_ids pinned version use_count"
        " last_used_time last_offered_time state_change_time create_time update_time",
        ("body", "body_chars", "trigger", "state", "unused_since_time", "days_unused"),
    ),
    (
        skills_pb.SkillVersion,
        "skill_id version body reason restored_from_version create_time supersede_time current",
        ("change",),
    ),
    (skills_pb.ProposalSource, "session_id check_id evidence_ids turn_id", ()),
    (diary_pb.Note, "id id company", ()),  # a field named twice
    (diary_pb.Note, "id company create_time", ("create_time", "tier")),  # a given field also named
]


def test_timestamp_fields_are_from_datetime() -> None:
    rnd = random.Random(20261203)
    for _ in range(15_000):
        value = _datetime(rnd)
        old = _outcome(_old_timestamp, value)
        new = _outcome(protoconv.timestamp, value)
        _same_message(old, new)
        fields_ = _outcome(lambda v: Timestamp(**protoconv.timestamp_fields(v)), value)
        _same_message(old, fields_)


def _timestamps(rnd: random.Random) -> Iterator[Timestamp]:
    for _ in range(10_000):
        ts = Timestamp()
        kind = rnd.random()
        if kind < 0.05:  # not valid: out of range, or nanos outside [0, 1e9)
            ts.seconds = rnd.choice([-62135596801, 253402300800, 2**40])
            ts.nanos = rnd.choice([0, -1, 1_000_000_000, 5])
        else:
            ts.seconds = rnd.choice([-62135596800, 253402300799, 0, -1, 1, rnd.randint(-62135596800, 253402300799)])
            ts.nanos = rnd.choice([0, 1, 999, 1000, 999_999_999, rnd.randint(0, 999_999_999)])
        yield ts


def test_timestamp_values_are_to_datetime() -> None:
    for ts in _timestamps(random.Random(7)):
        old = _outcome(ts.ToDatetime, tzinfo=UTC)
        new = _outcome(protoconv.timestamp_value, ts)
        assert old[0] == new[0] and (old[1] is new[1] if old[0] == "raised" else old[1] == new[1]), (ts, old, new)
        if old[0] == "ok":
            assert type(new[1]) is datetime and new[1].tzinfo is old[1].tzinfo


def test_to_pb_is_the_old_to_pb() -> None:
    rnd = random.Random(1203)
    for _ in range(2_500):
        for cls, names, given_names in _SHAPES:
            by_name = cls.DESCRIPTOR.fields_by_name
            source = SimpleNamespace(**{n: _value(rnd, by_name[n]) for n in names.split()})
            given = {n: _value(rnd, by_name[n]) for n in given_names}
            old = _outcome(old_to_pb, cls, source, names, **given)
            new = _outcome(field_copy.to_pb, cls, source, names, **given)
            _same_message(old, new)
            as_fields = _outcome(lambda: cls(**field_copy.pb_fields(cls, source, names, **given)))  # noqa: B023
            _same_message(old, as_fields)
            if cls is diary_pb.Note and old[0] == "ok":  # built in place, nested in another message
                nested = field_copy.pb_fields(cls, source, names, **given)
                candidate = _outcome(diary_pb.RecallCandidate, note=nested, similarity=0.5)
                _same_message(("ok", diary_pb.RecallCandidate(note=old[1], similarity=0.5)), candidate)
                listed = _outcome(diary_pb.ListNotesResponse, notes=[nested, nested])
                _same_message(("ok", diary_pb.ListNotesResponse(notes=[old[1], old[1]])), listed)


@dataclass(frozen=True)
class _Record:
    company: str
    seat: str
    turn_id: str
    outcome: Any
    start_time: datetime | None
    end_time: datetime | None
    tool_sequence: tuple[str, ...] = ()
    tools_called: tuple[str, ...] = ()
    label: str = ""


def _same_object(old: tuple[str, Any], new: tuple[str, Any]) -> None:
    assert old[0] == new[0], (old, new)
    if old[0] == "raised":
        assert old[1] is new[1]
        return
    assert old[1] == new[1]
    for f in fields(old[1]):
        a, b = getattr(old[1], f.name), getattr(new[1], f.name)
        assert type(a) is type(b), f.name
        if isinstance(a, datetime):
            assert a.tzinfo is b.tzinfo


def test_from_pb_is_the_old_from_pb() -> None:
    rnd = random.Random(31)
    stamps = _timestamps(rnd)
    names = "company seat turn_id start_time end_time tool_sequence tools_called label"
    for _ in range(5_000):
        msg = episodes_pb.RecordEpisodeRequest(
            company=rnd.choice(_TEXT),
            seat=rnd.choice(_TEXT),
            turn_id=rnd.choice(_TEXT),
            tool_sequence=[rnd.choice(_TEXT) for _ in range(rnd.randint(0, 3))],
            label=rnd.choice(_TEXT),
        )
        for field in ("start_time", "end_time"):
            if rnd.random() < 0.7:
                getattr(msg, field).CopyFrom(next(stamps))
        given: dict[str, Any] = {"outcome": rnd.choice([None, 1, "done"])}
        if rnd.random() < 0.2:
            given["label"] = "given"  # a given field also named: the given wins
        old = _outcome(old_from_pb, _Record, msg, names, **given)
        new = _outcome(field_copy.from_pb, _Record, msg, names, **given)
        _same_object(old, new)
    with pytest.raises(KeyError):  # a field the message lacks
        field_copy.from_pb(_Record, msg, "company nonesuch")


class _Color(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass
class _Row:
    name: str
    color: _Color
    tags: tuple[str, ...]
    size: int
    origin: str = "db"


def test_row_reader_is_the_old_row_reader() -> None:
    rnd = random.Random(5)
    shapes: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = [
        ({}, {}),
        ({"color": _Color, "tags": tuple}, {}),
        ({"color": _Color, "tags": tuple}, {"size": lambda row: len(row["name"])}),
    ]
    readers = [(OldRowReader(_Row, c, k), RowReader(_Row, c, k)) for c, k in shapes]
    for _ in range(5_000):
        row = {
            "name": rnd.choice(_TEXT),
            "color": rnd.choice(["red", "blue", "green"]),  # green: the enum refuses it
            "tags": rnd.choice([[], ["a"], ("b", "c")]),
            "size": rnd.choice([0, None, 7]),
            "origin": rnd.choice(_TEXT),
        }
        for key in list(row):
            if rnd.random() < 0.02:
                del row[key]  # a missing column
        for old_read, new_read in readers:
            old = _outcome(old_read, row)
            new = _outcome(new_read, row)
            _same_object(old, new)
