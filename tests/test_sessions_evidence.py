"""The evidence a check reads (spec "Evidence and cost"): only records at or before the trigger; at
most 8 chat messages, 8 verification records and 100 execution events (the newest); the
milestone's plan evidence; excerpts capped at 2,400 characters within 40,000 in all; claims
labelled apart from results and user messages. Read from the one review request the scripted
model receives."""

from __future__ import annotations

import re
from datetime import timedelta

from agentlearn.sessions.v1 import session_service_pb2 as pb
from libs.common.config import EvidenceConfig
from services.sessions.domain import Event, EventKind, PlanStep, StepStatus
from services.sessions.evidence import assemble, cap
from tests.support.sessions import (
    assistant,
    is_review,
    open_sessions,
    prompt_text,
    result,
    scripted_llm,
    step,
    tool_request,
    user,
    verification,
)

_ITEM = re.compile(r"^\[(?P<ref>[EP]\d+)\] \((?P<label>\w+)[,)]", re.M)


def _review_prompts(server) -> list[str]:  # type: ignore[no-untyped-def]
    return [prompt_text(b) for b in server.received("chat") if is_review(b)]


def _labels(prompt: str) -> list[str]:
    return [m.group("label") for m in _ITEM.finditer(prompt)]


def _silent_sessions(make_settings, dsn, edge_index, clock, scripted_openai):  # type: ignore[no-untyped-def]
    """The sessions service whose review model finds nothing to learn in any prompt."""
    scripted_openai.chat_handler = lambda body: "{}"
    settings = make_settings(providers=scripted_llm(scripted_openai))
    return open_sessions(settings, dsn, clock=clock, embedder=None, index=edge_index)


async def test_only_the_newest_records_of_each_kind_at_or_before_the_trigger(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    async with _silent_sessions(make_settings, dsn, edge_index, clock, scripted_openai) as env:
        t = clock.now()
        chat = [
            (user if i % 2 == 0 else assistant)(f"c{i}", f"chat-{i:02d}", t + timedelta(seconds=i)) for i in range(20)
        ]
        checks = [verification(f"v{i}", "pytest", f"verify-{i:02d}", t + timedelta(seconds=i)) for i in range(20)]
        execution = [
            (tool_request if i % 2 else result)(f"x{i}", "bash", f"exec-{i:03d}", t + timedelta(seconds=i))
            for i in range(150)
        ]
        # Interleaved as they would be recorded.
        await env.append("s1", *chat[:10], *checks[:10], *execution[:75])
        await env.append("s1", *chat[10:], *checks[10:], *execution[75:])
        manual = await env.manual("s1")
        # Recorded after the trigger: never read by that check.
        await env.append("s1", user("late1", "late-chat", t), verification("late2", "pytest", "late-verify", t))
        assert await env.drain() == 1
        (check,) = await env.checks("s1")
    assert check.check_id == manual.check.check_id
    (prompt,) = _review_prompts(scripted_openai)
    assert "late-" not in prompt
    chats = sorted(set(re.findall(r"chat-\d\d", prompt)))
    assert chats == [f"chat-{i:02d}" for i in range(12, 20)]
    verifies = sorted(set(re.findall(r"verify-\d\d", prompt)))
    assert verifies == [f"verify-{i:02d}" for i in range(12, 20)]
    execs = sorted(set(re.findall(r"exec-\d{3}", prompt)))
    assert execs == [f"exec-{i:03d}" for i in range(50, 150)]
    ev = check.evidence
    assert (ev.chat_messages, ev.verification_records, ev.execution_events) == (8, 8, 100)
    assert ev.omitted_records == 12 + 12 + 50 and ev.plan_steps == 0
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY


async def test_claims_are_labelled_apart_from_results_and_user_messages(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    async with _silent_sessions(make_settings, dsn, edge_index, clock, scripted_openai) as env:
        t = clock.now()
        await env.append(
            "s1",
            user("u", "fix it", t),
            assistant("a", "Done! All tests pass.", t),
            tool_request("q", "bash", "pytest", t),
            result("r", "bash", "3 passed", t, source="claude-code"),
            verification("v", "ci", "pipeline green", t),
        )
        saved = await env.plan(
            "s1", 1, step("a", pb.STEP_STATUS_DONE, "Fix the test"), step("b", pb.STEP_STATUS_PENDING)
        )
        # Recorded after the plan save: not the milestone's evidence.
        await env.append("s1", result("late", "bash", "late-output", t + timedelta(minutes=1)))
        assert await env.drain() == 1
    (prompt,) = _review_prompts(scripted_openai)
    assert _labels(prompt) == [
        "plan_claim",
        "plan_claim",
        "user_message",
        "assistant_claim",
        "tool_request",
        "tool_result",
        "verification",
    ]
    assert "[P1] (plan_claim, status=done)" in prompt and "(newly done in this revision) Fix the test" in prompt
    assert "source=claude-code" in prompt and "late-output" not in prompt
    assert saved.queued_check.trigger == pb.CHECK_TRIGGER_PLAN_STEPS_DONE


async def test_excerpts_are_capped_and_the_budget_keeps_the_newest(
    make_settings, dsn, edge_index, clock, scripted_openai
):
    async with _silent_sessions(make_settings, dsn, edge_index, clock, scripted_openai) as env:
        t = clock.now()
        huge = "H" * 10_000
        many = [result(f"r{i}", "bash", f"out-{i:02d} " + "x" * 2000, t + timedelta(seconds=i)) for i in range(30)]
        await env.append("s1", result("big", "bash", "BIG " + huge, t), *many)
        await env.manual("s1")
        assert await env.drain() == 1
        (check,) = await env.checks("s1")
    (prompt,) = _review_prompts(scripted_openai)
    bodies = re.split(r"^\[E\d+\] .*$", prompt, flags=re.M)[1:]
    assert all(len(b.strip("\n")) <= 2400 for b in bodies)
    kept = sorted(set(re.findall(r"out-\d\d", prompt)))
    # 30 excerpts of 2,007 characters exceed 40,000: the newest 19 fit, the 20th is cut to what is
    # left, the oldest ten and BIG are omitted.
    assert kept == [f"out-{i:02d}" for i in range(10, 30)]
    assert "BIG" not in prompt
    ev = check.evidence
    assert ev.total_chars == 40_000 and ev.omitted_records == 11 and ev.truncated_excerpts == 1
    assert ev.execution_events == 20


def _event(seq: int, kind: EventKind, text: str) -> Event:
    from datetime import UTC, datetime

    return Event(event_id=f"e{seq}", kind=kind, text=text, event_time=datetime(2026, 1, 1, tzinfo=UTC), seq=seq)


def test_a_capped_excerpt_keeps_its_head_and_tail_and_says_how_much_went():
    text = "HEAD" + "m" * 5000 + "TAIL"
    capped, cut = cap(text, 2400)
    assert cut and len(capped) == 2400 and capped.startswith("HEAD") and capped.endswith("TAIL")
    omitted = int(re.search(r"\[(\d+) characters omitted\]", capped).group(1))
    assert len(capped) - len(re.search(r" … \[\d+ characters omitted\] … ", capped).group(0)) + omitted == len(text)
    assert cap("short", 2400) == ("short", False)


def test_the_plan_evidence_is_placed_first_within_the_budget():
    config = EvidenceConfig(total_chars=3000, excerpt_chars=2400)
    plan = [PlanStep("a", "Ship the migration", StepStatus.DONE)]
    events = [_event(i, EventKind.TOOL_RESULT, "r" * 1000) for i in range(1, 6)]
    ev = assemble([], [], events, {"execution": 5}, 3, plan, ["a"], config)
    assert ev.items[0].ref == "P1" and ev.items[0].source_id == "plan:3:a" and ev.items[0].label == "plan_claim"
    assert [i.ref for i in ev.items[1:]] == ["E3", "E4", "E5"]  # the newest that fit, oldest first
    assert ev.total_chars <= 3000 and ev.omitted_records == 2 and ev.truncated_excerpts == 1


def test_once_a_record_is_left_out_every_older_one_is_too():
    """The budget omits the oldest records: a short old record must not be kept where a newer one
    that did not fit was dropped (the evidence would read as if nothing happened in between)."""
    config = EvidenceConfig(total_chars=2500, excerpt_chars=2400)
    events = [
        _event(1, EventKind.TOOL_RESULT, "old and short"),
        _event(2, EventKind.TOOL_RESULT, "m" * 2400),
        _event(3, EventKind.TOOL_RESULT, "n" * 2340),
    ]
    ev = assemble([], [], events, {"execution": 3}, 0, [], [], config)
    assert [i.ref for i in ev.items] == ["E3"]
    assert ev.omitted_records == 2


def test_a_large_plan_leaves_room_for_the_newest_records_and_the_newly_done_step():
    """Spec: "Older records may be omitted" — never the newest for the plan's sake. The plan takes
    at most half the budget, the step newly done first (it is what the check is about); the rest
    goes to the newest records."""
    config = EvidenceConfig(total_chars=4000, excerpt_chars=2400)
    plan = [PlanStep(f"s{i}", f"step {i} " + "p" * 480, StepStatus.DONE) for i in range(10)]
    events = [_event(i, EventKind.TOOL_RESULT, f"result {i} " + "r" * 480) for i in range(1, 4)]
    ev = assemble([], [], events, {"execution": 3}, 7, plan, ["s9"], config)
    plan_ids = [i.source_id for i in ev.items if i.label == "plan_claim"]
    assert "plan:7:s9" in plan_ids and ev.plan_steps == len(plan_ids) < 10
    assert sum(len(i.text) for i in ev.items if i.label == "plan_claim") <= 2000
    assert [i.ref for i in ev.items if i.label != "plan_claim"] == ["E1", "E2", "E3"]
    assert plan_ids == sorted(plan_ids, key=lambda s: int(s.rsplit(":s", 1)[1]))  # shown in step order
    assert ev.total_chars <= 4000 and ev.omitted_records == 10 - len(plan_ids)
