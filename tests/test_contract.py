"""The request contract (libs.common.contract): the protos' buf.validate rules, checked natively.

No server here: these check the checker against the descriptors the services ship, and that every
request field of every service carries a rule (a new field or RPC without one fails here).
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor

from agentlearn.diary.v1 import diary_service_pb2 as diary
from agentlearn.episodes.v1 import episode_service_pb2 as episodes
from agentlearn.prefetch.v1 import prefetch_service_pb2 as prefetch
from agentlearn.profiles.v1 import profile_service_pb2 as profiles
from agentlearn.reflector.v1 import reflector_service_pb2 as reflector
from libs.common import contract
from libs.common.contract import ContractError, check_request, refusal, violations
from libs.common.errors import InvalidArgument

UUID = "00000000-0000-0000-0000-000000000001"


def _generated() -> list[str]:
    """Every generated module of every contract under protos/agentlearn: a new service is covered
    the day its proto lands."""
    import pkgutil

    import agentlearn

    return [i.name for i in pkgutil.walk_packages(agentlearn.__path__, "agentlearn.") if i.name.endswith("_pb2")]


_GENERATED = _generated()


def _request_types():
    """Every request message of every agentlearn service, and every message type nested in one."""
    import importlib

    seen: dict[str, object] = {}

    def visit(desc) -> None:  # type: ignore[no-untyped-def]
        if desc.full_name in seen or desc.full_name.startswith("google."):
            return
        seen[desc.full_name] = desc
        for fd in desc.fields:
            if fd.message_type is not None:
                visit(fd.message_type)

    for name in _GENERATED:
        module = importlib.import_module(name)
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                visit(method.input_type)
    return list(seen.values())


REQUEST_TYPES = _request_types()


def test_every_request_type_compiles_into_a_plan():
    """Every rule the protos use is one the checker enforces (an unknown one raises here)."""
    assert len(REQUEST_TYPES) > 40
    for desc in REQUEST_TYPES:
        contract.plan_of(desc)


@pytest.mark.parametrize("desc", REQUEST_TYPES, ids=lambda d: d.full_name)
def test_every_request_field_carries_a_rule(desc):
    """A string, number, enum or list a caller sends is bounded by the contract. Booleans have
    nothing to bound; message fields are bounded by their own type's rules (and timestamps by the
    generic year 1..9999 check)."""
    from buf.validate import validate_pb2

    unruled = []
    for fd in desc.fields:
        if fd.type == FieldDescriptor.TYPE_BOOL and not fd.is_repeated:
            continue
        if fd.type == FieldDescriptor.TYPE_MESSAGE and not fd.is_repeated:
            continue
        if not fd.GetOptions().HasExtension(validate_pb2.field):
            unruled.append(fd.name)
    assert unruled == [], f"{desc.full_name}: fields without a buf.validate rule: {unruled}"


def test_every_violation_is_reported_at_once_in_field_order():
    req = diary.WriteNoteRequest(company="a" * 5000, seat="b c", content="", tier=99, ttl_days=-1)
    found = violations(req)
    assert [(v.field, v.reason) for v in found] == [
        ("company", "FIELD_TOO_LONG"),
        ("seat", "FIELD_INVALID"),
        ("content", "FIELD_REQUIRED"),
        ("tier", "FIELD_INVALID"),
        ("ttl_days", "TTL_OUT_OF_RANGE"),
    ]
    assert found[0].limit == "200"
    err = refusal(found, domain="diary.agentlearn.dev")
    assert isinstance(err, InvalidArgument) and err.reason == "FIELD_TOO_LONG"
    assert [v.field for v in err.violations] == ["company", "seat", "content", "tier", "ttl_days"]
    assert err.metadata["fields"] == "company,seat,content,tier,ttl_days"
    assert err.metadata["violations"] == "5"


def test_a_bad_value_is_echoed_only_as_a_short_prefix():
    found = violations(diary.WriteNoteRequest(company="acme", seat="x y" * 60, content="c", tier=1))
    [bad] = found
    assert (bad.field, bad.reason) == ("seat", "FIELD_INVALID")
    assert "x yx y" in bad.description and "x y" * 60 not in bad.description and "(180 characters)" in bad.description
    err = refusal(violations(diary.WriteNoteRequest(company="ü" * 100_000, seat="s", content="c", tier=1)), domain="d")
    assert len(err.message) <= 300 and "ü" * 40 not in err.message and "\\xfc" * 40 not in err.message
    assert all(len(str(v)) <= 96 for v in err.metadata.values())


def test_required_enum_and_defined_only():
    assert [(v.field, v.reason) for v in violations(episodes.SearchEpisodesRequest(company="c", seat="s"))] == []
    found = violations(episodes.SearchEpisodesRequest(company="c", seat="s", outcome_filter=99))
    assert [(v.field, v.reason) for v in found] == [("outcome_filter", "FIELD_INVALID")]
    # ListNotes tier 99 is refused, not read as "both tiers".
    assert [v.field for v in violations(diary.ListNotesRequest(company="c", seat="s", tier=99))] == ["tier"]


def test_nested_lists_and_items_name_their_position():
    flt = episodes.EpisodeFilter(outcomes=[1, 0, 42], min_tool_calls=-1)
    found = violations(episodes.ListEpisodesRequest(company="c", seat="s", filter=flt))
    assert [(v.field, v.reason) for v in found] == [
        ("filter.outcomes[1]", "FIELD_INVALID"),
        ("filter.outcomes[2]", "FIELD_INVALID"),
        ("filter.min_tool_calls", "FIELD_INVALID"),
    ]
    found = violations(
        prefetch.GetGuidanceRequest(company="c", registered_tools=["ok", "t" * 201, "bad\x00"] + ["x"] * 998)
    )
    assert [(v.field, v.reason) for v in found] == [
        ("registered_tools", "TOO_MANY_ITEMS"),
        ("registered_tools[1]", "FIELD_TOO_LONG"),
        ("registered_tools[2]", "FIELD_INVALID"),
    ]


def test_a_cel_rule_keeps_the_services_own_reason_code():
    found = violations(diary.MarkNotesUsedRequest(company="c", seat="s", note_ids=[UUID] * 501))
    assert [(v.field, v.reason, v.limit) for v in found] == [("note_ids", "TOO_MANY_IDS", "500")]
    found = violations(profiles.GetProfilesRequest(company="c", observer="o", subjects=[profiles.Subject()] * 51))
    assert found[0].reason == "TOO_MANY_SUBJECTS"
    found = violations(episodes.ListEpisodesRequest(company="c", seat="s", page_size=-1))
    assert [(v.field, v.reason) for v in found] == [("page_size", "PAGE_SIZE_INVALID")]
    found = violations(episodes.SearchEpisodesRequest(company="c", seat="s", limit=101))
    assert [(v.field, v.reason, v.limit) for v in found] == [("limit", "LIMIT_OUT_OF_RANGE", "0..100")]
    # An optional limit is only checked when set.
    assert violations(diary.RecallNotesRequest(company="c", seat="s")) == []
    [negative] = violations(diary.RecallNotesRequest(company="c", seat="s", vector_limit=-1))
    assert negative.reason == "LIMIT_OUT_OF_RANGE"


def test_message_oneof_rule():
    none = violations(episodes.GetEpisodeRequest(company="c", seat="s"))
    both = violations(episodes.GetEpisodeRequest(company="c", seat="s", episode_id=UUID, turn_id="r1"))
    assert [(v.field, v.reason) for v in none] == [("episode_id", "ONE_OF_REQUIRED")]
    assert [(v.field, v.reason) for v in both] == [("episode_id", "ONE_OF_REQUIRED")]
    assert violations(episodes.GetEpisodeRequest(company="c", seat="s", turn_id="r1")) == []
    # The unset member of the oneof is not checked (an empty episode_id is no malformed UUID).
    assert violations(episodes.GetEpisodeRequest(company="c", seat="s", episode_id=UUID)) == []


@pytest.mark.parametrize(
    ("seconds", "nanos", "field"),
    [
        (253_402_300_800, 0, "turn.start_time.seconds"),  # year 10000
        (-62_135_596_801, 0, "turn.start_time.seconds"),  # before year 1
        (0, -1, "turn.start_time.nanos"),
        (0, 1_000_000_000, "turn.start_time.nanos"),
    ],
)
def test_timestamps_outside_years_1_to_9999_or_with_bad_nanos_are_refused(seconds, nanos, field):
    turn = reflector.TurnCompleted(turn_id="r1", company="c", seat="s", role="eng", outcome=1)
    turn.start_time.seconds, turn.start_time.nanos = seconds, nanos
    assert [(v.field, v.reason) for v in violations(reflector.SubmitTurnRequest(turn=turn))] == [
        (field, "FIELD_INVALID")
    ]
    turn.start_time.seconds, turn.start_time.nanos = 253_402_300_799, 999_999_999  # the last instant
    assert violations(reflector.SubmitTurnRequest(turn=turn)) == []


def test_nul_is_refused_in_any_string_even_without_a_rule():
    req = reflector.SubmitTurnRequest(
        turn=reflector.TurnCompleted(
            turn_id="r1",
            company="c",
            seat="s",
            role="eng",
            outcome=1,
            interactions=[reflector.InboundInteraction(sender=reflector.Sender(platform="slack"), body="a\x00b")],
        )
    )
    assert [(v.field, v.reason) for v in violations(req)] == [("turn.interactions[0].body", "FIELD_INVALID")]


def test_a_long_list_of_bad_items_costs_a_bounded_walk():
    req = diary.MarkNotesUsedRequest(company="c", seat="s", note_ids=["x"] * 100_000)
    found = violations(req)
    assert len(found) == contract.MAX_COLLECTED
    err = refusal(found, domain="d")
    assert err.metadata["violations"] == f"{contract.MAX_COLLECTED}+"
    assert len(err.violations) == contract.MAX_REPORTED


def test_check_request_raises_one_invalid_argument():
    with pytest.raises(InvalidArgument) as exc:
        check_request(diary.GetNoteRequest(company="c", seat="s", note_id="nope"), domain="diary.agentlearn.dev")
    assert (exc.value.reason, exc.value.domain, exc.value.violations[0].field) == (
        "FIELD_INVALID",
        "diary.agentlearn.dev",
        "note_id",
    )
    check_request(diary.GetNoteRequest(company="c", seat="s", note_id=UUID), domain="d")


def _custom_message(rules_text: str):  # type: ignore[no-untyped-def]
    """A throwaway message type with one annotated string field (for rules no shipped proto uses)."""
    from buf.validate import validate_pb2

    pool = descriptor_pool.DescriptorPool()
    for dep in (validate_pb2.DESCRIPTOR,):
        for imp in dep.dependencies:
            pool.AddSerializedFile(imp.serialized_pb)
        pool.AddSerializedFile(dep.serialized_pb)
    fdp = descriptor_pb2.FileDescriptorProto(name=f"t_{abs(hash(rules_text))}.proto", package="t", syntax="proto3")
    fdp.dependency.append("buf/validate/validate.proto")
    msg = fdp.message_type.add(name="M")
    field = msg.field.add(name="v", number=1, type=FieldDescriptor.TYPE_INT32, label=FieldDescriptor.LABEL_OPTIONAL)
    rule = validate_pb2.FieldRules()
    rule.cel.add(id="SOME_REASON", expression=rules_text)
    field.options.Extensions[validate_pb2.field].CopyFrom(rule)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.M"))


def test_an_expression_the_checker_does_not_understand_fails_loudly():
    with pytest.raises(ContractError, match=r"not one libs\.common\.contract understands"):
        contract.plan_of(_custom_message("this % 2 == 0").DESCRIPTOR)
    ok = _custom_message("this >= 3 && this <= 5")
    assert [v.reason for v in violations(ok(v=7))] == ["SOME_REASON"]
    assert violations(ok(v=4)) == []


def _counting_enumerate(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The sizes of the lists the walk goes through item by item (its per-item loops are the only
    ``enumerate`` calls in the module; a module global shadows the builtin)."""
    walked: list[int] = []

    def counting(items, start=0):  # type: ignore[no-untyped-def]
        walked.append(len(items))
        return enumerate(items, start)

    monkeypatch.setattr(contract, "enumerate", counting, raising=False)
    return walked


def test_a_repeated_scalar_without_item_rules_is_not_walked_item_by_item(monkeypatch):
    """An embedding's floats carry a rule on the list (max_items) and none on an item: the list is
    checked, its 384 items are not visited, and the request passes or fails as it always did."""
    from agentlearn.common.v1 import embedding_pb2

    walked = _counting_enumerate(monkeypatch)
    vector = embedding_pb2.Embedding(values=[0.25] * 384, model="m", dimensions=384)
    req = diary.RecallNotesRequest(company="c", seat="s", query="q", query_embedding=vector)
    assert violations(req) == []
    assert walked == []
    too_long = embedding_pb2.Embedding(values=[0.25] * 16_385, model="m\x00", dimensions=-1)
    found = violations(diary.RecallNotesRequest(company="c", seat="s", query="q", query_embedding=too_long))
    assert [(v.field, v.reason, v.limit, v.facts) for v in found] == [
        ("query_embedding.values", "TOO_MANY_ITEMS", "16384", (("count", "16385"),)),
        ("query_embedding.model", "FIELD_INVALID", "", ()),
        ("query_embedding.dimensions", "FIELD_INVALID", "0..16384", (("value", "-1"),)),
    ]
    assert walked == []


def test_a_repeated_scalar_with_item_rules_is_still_checked_item_by_item(monkeypatch):
    walked = _counting_enumerate(monkeypatch)
    flt = episodes.EpisodeFilter(outcomes=[1, 0, 42])
    found = violations(episodes.ListEpisodesRequest(company="c", seat="s", filter=flt))
    assert [(v.field, v.reason) for v in found] == [
        ("filter.outcomes[1]", "FIELD_INVALID"),
        ("filter.outcomes[2]", "FIELD_INVALID"),
    ]
    assert walked == [3]
    # A string list has its items walked even without an item rule: no NUL in any of them.
    walked.clear()
    found = violations(prefetch.GetGuidanceRequest(company="c", registered_tools=["ok", "bad\x00"]))
    assert [(v.field, v.reason) for v in found] == [("registered_tools[1]", "FIELD_INVALID")]
    assert walked == [2]


def test_a_walk_stops_at_the_cap_inside_nested_lists():
    """The cap holds across nesting: the first MAX_COLLECTED violations, in field order."""
    bad = [reflector.InboundInteraction(sender=reflector.Sender(platform="slack"), body="\x00")] * 500
    turn = reflector.TurnCompleted(turn_id="r1", company="c", seat="s", role="eng", outcome=1, interactions=bad)
    found = violations(reflector.SubmitTurnRequest(turn=turn))
    assert len(found) == contract.MAX_COLLECTED
    assert found[0].field == "turn.interactions[0].body"
    assert found[-1].field == f"turn.interactions[{contract.MAX_COLLECTED - 1}].body"


def test_a_string_bound_is_read_from_the_contract():
    """A caller fitting a text to another service's field reads the bound the proto states."""
    from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
    from agentlearn.prefetch.v1 import prefetch_service_pb2 as prefetch_pb
    from libs.common.contract import ContractError, string_max_len

    assert string_max_len(diary_pb.RecallNotesRequest, "query") == 8000
    assert string_max_len(prefetch_pb.BuildTurnContextRequest, "ask") == 100_000
    with pytest.raises(ContractError):
        string_max_len(diary_pb.RecallNotesRequest, "vector_limit")
