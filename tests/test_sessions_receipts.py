"""Receipts (spec "Evidence and cost", "Visibility"): each outcome has its own — model error,
invalid output, truncated output, missing evidence, failed write, permission refused,
interrupted, completed (with counts), completed empty — and the citation rules drop candidates
with a reason. ListLearningChecks (latest 30, newest first, never raw evidence) and GetAwayDigest
read them back. The review is one call, attributed and charged; with no model the offline rule
walks the same path."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import grpc
import pytest

from agentlearn.sessions.v1 import session_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2 as spb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sgrpc
from libs.common.events import read_events
from libs.common.protoconv import timestamp
from services.sessions.domain import JOB_KIND
from tests.support.runner import free_port
from tests.support.scripted_openai import Reply
from tests.support.sessions import (
    assistant,
    chat_answer,
    info,
    is_review,
    open_sessions,
    result,
    scripted_llm,
    step,
    tool_request,
    turn_end,
    user,
    verification,
)


def _work(t):  # type: ignore[no-untyped-def]
    """A small piece of work: what the user said, claims, results and a verification."""
    return [
        user("u1", "Fix the flaky payments test. Remember: I review PRs only in the mornings.", t, remember=True),
        assistant("a1", "Done, all green now!", t),
        tool_request("q1", "bash", "pytest tests/payments -x", t),
        result("r0", "ls", "tests/payments: 12 files", t),
        result("r1", "bash", "FAILED test_refund - db schema missing", t, ok=False),
        result("r2", "make", "make migrate: applied 3 migrations", t + timedelta(seconds=5)),
        result("r3", "git", "committed fix", t + timedelta(seconds=8)),
        verification("v1", "pytest", "42 passed in 3.1s", t + timedelta(seconds=10)),
    ]


def _answer(review: dict):  # type: ignore[no-untyped-def]
    """A chat handler: the review's answer for review calls, the offline-style judge for the rest."""

    def handle(body: dict) -> str:
        if is_review(body):
            return json.dumps(review)
        prompt = body["messages"][-1]["content"]
        ids = [line.split("]")[0][1:] for line in prompt.splitlines() if line.startswith("[F")]
        facts = [line.split("] ", 1)[1] for line in prompt.splitlines() if line.startswith("[F")]
        return json.dumps(
            {"verdicts": [{"id": i, "classification": "LONG", "content": f} for i, f in zip(ids, facts, strict=True)]}
        )

    return handle


def _ref(prompt: str, text: str) -> str:
    """The evidence id the review was given for the item whose text starts with ``text``."""
    lines = prompt.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[") and i + 1 < len(lines) and lines[i + 1].startswith(text):
            return line[1 : line.index("]")]
    raise AssertionError(f"{text!r} not in the prompt")


@pytest.fixture
def llm(make_settings, scripted_openai):
    def make(**extra):  # type: ignore[no-untyped-def]
        return make_settings(providers=scripted_llm(scripted_openai), **extra)

    return make


async def _one_check(env, clock, *events, session="s1"):  # type: ignore[no-untyped-def]
    if events:
        await env.append(session, *events)
    else:
        await env.append(session)
    await env.manual(session)
    assert await env.drain() == 1
    (check,) = await env.checks(session)
    return check


# ------------------------------------------------------------------------------ failure outcomes


async def test_a_model_that_does_not_answer_is_a_model_error(llm, dsn, edge_index, clock, scripted_openai):
    scripted_openai.rule("chat", lambda body: Reply(status=500))
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    assert check.state == pb.CHECK_STATE_FAILED and check.outcome == pb.CHECK_OUTCOME_MODEL_ERROR
    assert "server_error" in check.reason and list(check.outputs) == []


async def test_an_answer_that_is_not_the_review_is_invalid_output(llm, dsn, edge_index, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: "Sure! Here are some lessons: be careful."
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
        scripted_openai.chat_handler = lambda body: json.dumps({"project_lessons": "not a list"})
        clock.advance(minutes=1)
        await env.manual("s1")
        await env.drain()
        second = (await env.checks("s1"))[0]
    assert check.state == pb.CHECK_STATE_FAILED and check.outcome == pb.CHECK_OUTCOME_INVALID_OUTPUT
    assert second.outcome == pb.CHECK_OUTCOME_INVALID_OUTPUT and "project_lessons" in second.reason


async def test_an_answer_cut_at_its_budget_is_truncated_output(llm, dsn, edge_index, clock, scripted_openai):
    cut = '{"project_lessons": [{"lesson": "Run make migrate before the payments tests, because the sch'
    scripted_openai.rule("chat", lambda body: Reply(body=chat_answer(cut, completion_tokens=body["max_tokens"])))
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    assert check.outcome == pb.CHECK_OUTCOME_TRUNCATED_OUTPUT and "2000-token budget" in check.reason


async def test_nothing_recorded_is_missing_evidence_and_no_model_is_asked(llm, dsn, edge_index, clock, scripted_openai):
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock)
    assert check.state == pb.CHECK_STATE_FAILED and check.outcome == pb.CHECK_OUTCOME_MISSING_EVIDENCE
    assert scripted_openai.received("chat") == []


async def test_writes_that_fail_are_reported_whole_or_partial(llm, dsn, edge_index, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: "{}"
    # The knowledge service is down; the diary is up.
    settings = llm(services={"knowledge": f"127.0.0.1:{free_port()}"})
    async with open_sessions(
        settings, dsn, clock=clock, embedder=None, index=edge_index, names=["diary", "skills", "sessions"]
    ) as env:
        await env.append("s1", *_work(clock.now()))
        await env.manual("s1")
        # First: only a lesson, which cannot be written.
        scripted_openai.chat_handler = _lesson_only
        assert await env.drain() == 1
        failed = (await env.checks("s1"))[0]
        # Then: a lesson (fails) and a personal fact (lands).
        scripted_openai.chat_handler = _lesson_and_fact
        clock.advance(minutes=1)
        await env.manual("s1")
        assert await env.drain() == 1
        partial = (await env.checks("s1"))[0]
    assert failed.state == pb.CHECK_STATE_FAILED and failed.outcome == pb.CHECK_OUTCOME_WRITE_FAILED
    (pf,) = failed.partial_failures
    assert pf.failure == pb.FAILURE_KIND_WRITE_FAILED and pf.detail.startswith("knowledge: UNAVAILABLE")
    assert partial.outcome == pb.CHECK_OUTCOME_COMPLETED and partial.counts.facts_written == 1
    kinds = {(p.kind, p.failure) for p in partial.partial_failures}
    assert (pb.OUTPUT_KIND_PROJECT_LESSON, pb.FAILURE_KIND_WRITE_FAILED) in kinds


def _prompt(body: dict) -> str:
    return body["messages"][-1]["content"]


def _lesson_only(body: dict) -> str:
    if not is_review(body):
        return "{}"
    ref = _ref(_prompt(body), "make migrate")
    return json.dumps(
        {"project_lessons": [{"lesson": "Run make migrate before the payments tests.", "evidence": [ref]}]}
    )


def _lesson_and_fact(body: dict) -> str:
    prompt = _prompt(body)
    if not is_review(body):
        return _answer({})(body)
    return json.dumps(
        {
            "project_lessons": [
                {"lesson": "Run make migrate before the payments tests.", "evidence": [_ref(prompt, "make migrate")]}
            ],
            "personal_facts": [
                {"fact": "Dana reviews PRs only in the mornings.", "evidence": [_ref(prompt, "Fix the")]}
            ],
        }
    )


async def test_writes_the_role_may_not_make_are_refused_and_the_receipt_says_so(
    llm, dsn, edge_index, clock, scripted_openai
):
    def review(body: dict) -> str:
        if not is_review(body):
            return "{}"
        prompt = _prompt(body)
        migrate, commit, verify = (_ref(prompt, s) for s in ("make migrate", "committed", "42 passed"))
        return json.dumps(
            {
                "project_lessons": [{"lesson": "Run make migrate before the payments tests.", "evidence": [migrate]}],
                "skill_candidate": {
                    "name": "fix-payments-test",
                    "summary": "Fix a payments test failing on the schema",
                    "body": "1. make migrate\n2. commit\n3. pytest",
                    "evidence": [migrate, commit, verify],
                },
            }
        )

    scripted_openai.chat_handler = review
    roles = {"swe": {"tool_permissions": {"write_knowledge": "ask", "distill_skill": "deny"}}}
    async with open_sessions(
        llm(companies={"acme": {"roles": roles}}), dsn, clock=clock, embedder=None, index=edge_index
    ) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
        proposals = await sgrpc.SkillServiceStub(env.app.channel).ListSkillProposals(
            spb.ListSkillProposalsRequest(company="acme", seat="ana")
        )
    assert check.state == pb.CHECK_STATE_FAILED and check.outcome == pb.CHECK_OUTCOME_PERMISSION_REFUSED
    details = {p.kind: p.detail for p in check.partial_failures}
    assert all(p.failure == pb.FAILURE_KIND_PERMISSION_REFUSED for p in check.partial_failures)
    assert "write_knowledge permission ask" in details[pb.OUTPUT_KIND_PROJECT_LESSON]
    assert "cannot give" in details[pb.OUTPUT_KIND_PROJECT_LESSON]
    assert "distill_skill permission deny" in details[pb.OUTPUT_KIND_SKILL_PROPOSAL]
    assert list(proposals.proposals) == []


# ------------------------------------------------------------------------------ completed outcomes


async def test_an_empty_review_is_completed_empty(llm, dsn, edge_index, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: '{"project_lessons": [], "personal_facts": [], "skill_candidate": null}'
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    assert check.state == pb.CHECK_STATE_COMPLETED and check.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY
    assert check.reason == "the review found nothing worth keeping" and list(check.dropped) == []


async def test_candidates_that_break_the_citation_rules_are_dropped_with_their_reason(
    llm, dsn, edge_index, clock, scripted_openai
):
    def review(body: dict) -> str:
        if not is_review(body):
            return _answer({})(body)
        p = _prompt(body)
        claim, request, said, migrate = (
            _ref(p, s) for s in ("Done, all green", "pytest tests/payments", "Fix the", "make")
        )
        return json.dumps(
            {
                "project_lessons": [
                    {"lesson": "Payments tests pass now.", "evidence": []},
                    {"lesson": "The payments suite is green.", "evidence": [claim, request]},
                    {"lesson": "Migrate first.", "evidence": ["E999"]},
                    {"lesson": "Run make migrate before the payments tests.", "evidence": [migrate]},
                ],
                "personal_facts": [
                    {"fact": "Dana runs make migrate.", "evidence": [migrate]},
                    {"fact": "Dana reviews PRs only in the mornings.", "evidence": [said, claim]},
                    {"fact": "Dana reviews PRs only in the mornings.", "evidence": [said]},
                ],
                "skill_candidate": {"name": "x", "summary": "y", "body": "z", "evidence": [claim]},
            }
        )

    scripted_openai.chat_handler = review
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    reasons = [(d.kind, d.reason) for d in check.dropped]
    lesson, fact, skill = pb.OUTPUT_KIND_PROJECT_LESSON, pb.OUTPUT_KIND_PERSONAL_FACT, pb.OUTPUT_KIND_SKILL_PROPOSAL
    assert (lesson, "cites no evidence") in reasons
    assert sum(1 for k, r in reasons if k == lesson and r.startswith("cites only claims")) == 1
    assert (lesson, "cites evidence it was not given: E999") in reasons
    assert [r for k, r in reasons if k == fact] == ["a personal fact may cite only user messages"] * 2
    (skill_reason,) = [r for k, r in reasons if k == skill]
    assert skill_reason.startswith("cites only claims")
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED
    assert (check.counts.lessons_written, check.counts.facts_written, check.counts.candidates_dropped) == (1, 1, 6)
    (dropped_claims,) = [d for d in check.dropped if d.kind == lesson and d.reason.startswith("cites only claims")]
    assert sorted(dropped_claims.evidence_ids) == ["a1", "q1"]  # the session's own ids, not the prompt's


async def test_a_used_review_is_completed_with_counts_and_its_outputs(llm, dsn, edge_index, clock, scripted_openai):
    def review(body: dict) -> str:
        if not is_review(body):
            return _answer({})(body)
        p = _prompt(body)
        said, fail, migrate, commit, verify = (
            _ref(p, s) for s in ("Fix the", "FAILED", "make migrate", "committed", "42 passed")
        )
        return json.dumps(
            {
                "project_lessons": [
                    {"lesson": "Run make migrate before the payments tests.", "evidence": [fail, migrate, verify]}
                ],
                "personal_facts": [{"fact": "Dana reviews PRs only in the mornings.", "evidence": [said]}],
                "skill_candidate": {
                    "name": "fix-payments-schema-test",
                    "summary": "Fix a payments test that fails on a missing schema",
                    "body": "1. Run make migrate.\n2. Commit.\n3. Run pytest.",
                    "evidence": [migrate, commit, verify],
                },
            }
        )

    scripted_openai.chat_handler = review
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        t = clock.now()
        end = await env.append("s1", *_work(t), *[result(f"x{i}", "bash", "ok", t) for i in range(3)], turn_end("e", t))
        assert len(end.queued_checks) == 1
        assert await env.drain() == 1
        (check,) = await env.checks("s1")
        proposals = await sgrpc.SkillServiceStub(env.app.channel).ListSkillProposals(
            spb.ListSkillProposalsRequest(company="acme", seat="ana")
        )
        spend = [
            e["payload"]
            for e in await read_events(env.app.infra.pool, "auxiliary_spend")
            if e["payload"]["purpose"] == "session_review"
        ]
    assert check.state == pb.CHECK_STATE_COMPLETED and check.outcome == pb.CHECK_OUTCOME_COMPLETED
    c = check.counts
    assert (c.lessons_written, c.facts_written, c.proposals_created, c.candidates_dropped) == (1, 1, 1, 0)
    by_kind = {o.kind: o for o in check.outputs}
    assert list(by_kind[pb.OUTPUT_KIND_PROJECT_LESSON].evidence_ids) == ["r1", "r2", "v1"]
    assert list(by_kind[pb.OUTPUT_KIND_PERSONAL_FACT].evidence_ids) == ["u1"]
    (proposal,) = proposals.proposals
    assert by_kind[pb.OUTPUT_KIND_SKILL_PROPOSAL].id == proposal.id
    assert proposal.state == spb.PROPOSAL_STATE_PENDING and list(proposal.tool_sequence) == ["make", "git"]
    assert check.reason.startswith("1 lesson written, 0 reused; 1 personal fact written")
    # No embedder here: the lesson and the fact were saved without vectors, and the fact and the
    # proposal without the embedding-backed duplicate check, which the receipt says.
    assert {(p.kind, p.failure) for p in check.partial_failures} == {
        (pb.OUTPUT_KIND_PROJECT_LESSON, pb.FAILURE_KIND_NOT_INDEXED),
        (pb.OUTPUT_KIND_PERSONAL_FACT, pb.FAILURE_KIND_NOT_INDEXED),
        (pb.OUTPUT_KIND_PERSONAL_FACT, pb.FAILURE_KIND_NOT_DEDUPLICATED),
        (pb.OUTPUT_KIND_SKILL_PROPOSAL, pb.FAILURE_KIND_NOT_DEDUPLICATED),
    }
    # One review call, attributed to the background stage and charged like every call.
    assert sum(1 for b in scripted_openai.received("chat") if is_review(b)) == 1
    (charged,) = spend
    assert charged["stage"] == "background" and charged["completion_tokens"] > 0


async def test_with_no_model_the_offline_rule_walks_the_same_path(make_settings, dsn, edge_index, clock):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        t = clock.now()
        check = await _one_check(env, clock, *_work(t))
        # What a person said without asking to remember it is not a fact: no wording is read.
        await env.append("s2", user("u", "I prefer tabs over spaces, always.", t), assistant("a", "Noted!", t))
        quiet = await _one_check(env, clock, session="s2")
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED
    assert (check.counts.lessons_written, check.counts.facts_written, check.counts.proposals_created) == (1, 1, 1)
    lesson = next(o for o in check.outputs if o.kind == pb.OUTPUT_KIND_PROJECT_LESSON)
    # The verification and the succeeded results before it (the failed one is not support).
    assert set(lesson.evidence_ids) == {"v1", "r0", "r2", "r3"}
    assert quiet.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY


# ------------------------------------------------------------------------------ interrupted


async def test_a_check_whose_process_died_is_reported_interrupted_and_never_replayed(
    make_settings, dsn, edge_index, clock
):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        await env.append("s1", *_work(clock.now()))
        queued = (await env.manual("s1")).check
        worker = env.sessions.worker
        # A worker claims it and dies: it never renews its lease.
        job = await worker.queue.claim(JOB_KIND, "dead-worker", clock.now(), 30.0, reclaim_lapsed=False)
        await worker.store.start_check(uuid.UUID(queued.check_id), clock.now())
        assert job is not None and await worker.sweep() == 0  # its lease still holds
        clock.advance(seconds=31)
        assert await worker.sweep() == 1
        assert await env.drain() == 0  # never claimed again
        (check,) = await env.checks("s1")
        assert check.state == pb.CHECK_STATE_INTERRUPTED and check.outcome == pb.CHECK_OUTCOME_INTERRUPTED
        assert "not replayed" in check.reason and "Check recent work" in check.reason
        # The sweep closes it with its event, naming the check as its queued event did.
        (closed,) = await read_events(env.app.infra.pool, "learning_check_interrupted")
        assert (closed["company"], closed["seat"]) == ("acme", check.seat)
        assert {k: closed["payload"].get(k) for k in ("check_id", "session_id", "trigger", "reason")} == {
            "check_id": queued.check_id,
            "session_id": "s1",
            "trigger": "manual",
            "reason": check.reason,
        }
        again = await env.manual("s1")  # a person asks again: a new check, not the old one
        assert not again.reused and again.check.check_id != queued.check_id
        assert await env.drain() == 1


# ------------------------------------------------------------------------------ reading receipts


async def test_the_latest_thirty_newest_first_paged_and_never_raw_evidence(make_settings, dsn, edge_index, clock):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        t = clock.now()
        await env.append("s1", user("u0", "SECRET-WORDING-OF-THE-USER", t))
        made = []
        for i in range(35):
            clock.advance(minutes=1)
            saved = await env.plan("s1", i + 1, *[step(f"s{j}", pb.STEP_STATUS_DONE) for j in range(i + 1)])
            made.append(saved.queued_check.check_id)
        await env.drain()
        page = await env.checks("s1")
        assert [c.check_id for c in page] == list(reversed(made))[:30]
        first = await env.stub.ListLearningChecks(
            pb.ListLearningChecksRequest(company="acme", session_id="s1", user="dana", page_size=20)
        )
        rest = await env.stub.ListLearningChecks(
            pb.ListLearningChecksRequest(
                company="acme", session_id="s1", user="dana", page_size=20, page_token=first.next_page_token
            )
        )
        assert [c.check_id for c in [*first.checks, *rest.checks]] == list(reversed(made))
        assert rest.next_page_token == ""
    for c in page:
        assert "SECRET-WORDING" not in str(c)


async def test_the_away_digest_lists_what_finished_since_a_time(make_settings, dsn, edge_index, clock, scripted_openai):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        t = clock.now()
        await env.append("old", *_work(t))
        await env.manual("old")
        await env.drain()
        clock.advance(hours=1)
        since = clock.now()
        await env.append("s1", *_work(t))
        await env.manual("s1")
        await env.append("s2")
        await env.manual("s2")  # missing evidence: failed
        await env.drain()
        await env.append("s3", *_work(t))
        dying = (await env.manual("s3")).check
        job = await env.sessions.worker.queue.claim(JOB_KIND, "dead", clock.now(), 5.0, reclaim_lapsed=False)
        assert job is not None and job.key.startswith("manual:s3:")
        await env.drain()
        clock.advance(seconds=10)
        await env.sessions.worker.sweep()
        await env.append("s4", *_work(t), user="erin")
        await env.manual("s4", user="erin")
        await env.drain()
        await env.append("s5", *_work(t))
        await env.manual("s5")  # still queued: not in the digest
        digest = await env.stub.GetAwayDigest(
            pb.GetAwayDigestRequest(company="acme", user="dana", since_time=timestamp(since))
        )
    assert (digest.completed_count, digest.failed_count, digest.interrupted_count) == (1, 1, 1)
    by_session = {c.session_id: c.state for c in digest.checks}
    assert by_session == {
        "s1": pb.CHECK_STATE_COMPLETED,
        "s2": pb.CHECK_STATE_FAILED,
        "s3": pb.CHECK_STATE_INTERRUPTED,
    }
    assert dying.check_id in {c.check_id for c in digest.checks}


async def test_the_away_digest_needs_a_time(make_settings, dsn, edge_index, clock):
    async with open_sessions(make_settings(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.stub.GetAwayDigest(pb.GetAwayDigestRequest(company="acme", user="dana"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info(err.value).metadata["field"] == "since_time"


async def test_finished_checks_are_counted_by_trigger_and_outcome_on_the_metrics_endpoint(
    llm, dsn, edge_index, clock, scripted_openai
):
    """Operators see learning-check outcomes without reading receipts: the
    ``agentlearn.learning_checks`` counter, by trigger and outcome, on ``/metrics``."""
    from prometheus_client import generate_latest

    from libs.common import telemetry
    from libs.common.config import TelemetryConfig

    def count() -> float:
        for line in generate_latest().decode().splitlines():
            if (
                line.startswith("agentlearn_learning_checks")
                and 'agentlearn_trigger="manual"' in line
                and 'agentlearn_outcome="missing_evidence"' in line
                and not line.startswith("#")
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    telemetry.configure_metrics(TelemetryConfig())
    before = count()
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock)
    assert check.outcome == pb.CHECK_OUTCOME_MISSING_EVIDENCE
    assert count() == before + 1


# ------------------------------------------------------------------------------ the judge's failures, crashes


def _fact_review_and_judge(judge):  # type: ignore[no-untyped-def]
    """A chat rule: the review proposes one personal fact citing the user's message; the memory
    judge is answered by ``judge(body)``."""

    def rule(body: dict) -> Reply:
        if not is_review(body):
            return judge(body)
        ref = _ref(_prompt(body), "Fix the")
        return Reply(
            body=chat_answer(
                json.dumps({"personal_facts": [{"fact": "Dana reviews PRs only in the mornings.", "evidence": [ref]}]})
            )
        )

    return rule


@pytest.mark.parametrize(
    ("judge", "outcome", "failure", "said"),
    [
        (lambda body: Reply(status=500), pb.CHECK_OUTCOME_MODEL_ERROR, pb.FAILURE_KIND_MODEL_ERROR, "did not answer"),
        (
            lambda body: Reply(body=chat_answer("I think it is a LONG one.")),
            pb.CHECK_OUTCOME_INVALID_OUTPUT,
            pb.FAILURE_KIND_INVALID_OUTPUT,
            "no usable verdicts",
        ),
        (  # an infinite time to live (int() overflows): unusable, not a crash of the worker
            lambda body: Reply(
                body=chat_answer('{"verdicts": [{"id": "F1", "classification": "SHORT", "ttl_days": 1e999}]}')
            ),
            pb.CHECK_OUTCOME_INVALID_OUTPUT,
            pb.FAILURE_KIND_INVALID_OUTPUT,
            "ttl_days",
        ),
    ],
    ids=["no-answer", "unusable", "infinite-ttl"],
)
async def test_the_memory_judges_failures_keep_their_own_receipts(  # type: ignore[no-untyped-def]
    llm, dsn, edge_index, clock, scripted_openai, judge, outcome, failure, said
):
    """Spec: model errors, invalid output and failed writes have distinct receipts. The memory
    judge that does not answer is a model error, one that answers nothing usable invalid output —
    not a failed write (nothing was refused by the diary)."""
    scripted_openai.rule("chat", _fact_review_and_judge(judge))
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    assert check.state == pb.CHECK_STATE_FAILED and check.outcome == outcome, check.reason
    (pf,) = check.partial_failures
    assert pf.kind == pb.OUTPUT_KIND_PERSONAL_FACT and pf.failure == failure and said in pf.detail
    assert list(check.outputs) == []


async def test_an_answer_nested_too_deeply_is_invalid_output(llm, dsn, edge_index, clock, scripted_openai):
    """json.loads gives up at about 1000 levels (RecursionError): the answer is invalid output, not
    a worker error that turns the check interrupted."""
    deep = '{"project_lessons": ' + "[" * 5000 + "]" * 5000 + "}"
    scripted_openai.rule("chat", lambda body: Reply(body=chat_answer(deep, completion_tokens=50)))
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
    assert check.outcome == pb.CHECK_OUTCOME_INVALID_OUTPUT and "nested too deeply" in check.reason, check.reason


async def test_a_check_that_crashes_midway_keeps_what_landed_on_its_interrupted_receipt(
    llm, dsn, edge_index, clock, scripted_openai
):
    """Two lessons; Postgres refuses the second one's record (a real failure of the store, which
    no receipt names): the check ends interrupted, and its receipt still lists the first lesson's
    page, which was written."""
    first, second = "Run make migrate before the payments tests.", "Commit the fix before rerunning pytest."

    def review(body: dict) -> str:
        if not is_review(body):
            return "{}"
        ref = _ref(_prompt(body), "make migrate")
        return json.dumps({"project_lessons": [{"lesson": t, "evidence": [ref]} for t in (first, second)]})

    scripted_openai.chat_handler = review
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        pool = env.app.infra.pool
        await pool.execute(
            """CREATE FUNCTION refuse_second() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'; END $$"""
        )
        await pool.execute(
            "CREATE TRIGGER refuse_second BEFORE INSERT ON workspace_lessons FOR EACH ROW "
            "WHEN (NEW.body LIKE 'Commit the fix%') EXECUTE FUNCTION refuse_second()"
        )
        check = await _one_check(env, clock, *_work(clock.now()))
        pages = await pool.fetch("SELECT id::text AS id FROM knowledge_pages")
    assert check.state == pb.CHECK_STATE_INTERRUPTED and "No space left on device" in check.reason, check.reason
    (page,) = pages
    (out,) = check.outputs
    assert (out.kind, out.id, out.disposition) == (
        pb.OUTPUT_KIND_PROJECT_LESSON,
        page["id"],
        pb.OUTPUT_DISPOSITION_WRITTEN,
    )


async def test_a_skill_needs_a_tool_result_a_tool_request_alone_does_not_support_it(
    llm, dsn, edge_index, clock, scripted_openai
):
    """Spec: tool requests cannot alone support a skill. A candidate citing the user's message and
    the assistant's tool request (no tool result) is dropped, and nothing is proposed."""

    def review(body: dict) -> str:
        if not is_review(body):
            return "{}"
        prompt = _prompt(body)
        refs = [_ref(prompt, "Fix the"), _ref(prompt, "pytest tests/payments")]
        skill = {"name": "run-payments-tests", "summary": "Run the payments tests", "body": "1. Run pytest."}
        return json.dumps({"skill_candidate": {**skill, "evidence": refs}})

    scripted_openai.chat_handler = review
    async with open_sessions(llm(), dsn, clock=clock, embedder=None, index=edge_index) as env:
        check = await _one_check(env, clock, *_work(clock.now()))
        proposals = await sgrpc.SkillServiceStub(env.app.channel).ListSkillProposals(
            spb.ListSkillProposalsRequest(company="acme", seat="ana")
        )
    assert check.outcome == pb.CHECK_OUTCOME_COMPLETED_EMPTY and list(check.outputs) == []
    (dropped,) = check.dropped
    assert dropped.kind == pb.OUTPUT_KIND_SKILL_PROPOSAL and "cites no tool result" in dropped.reason
    assert list(proposals.proposals) == []


@pytest.mark.parametrize("ref", ["F²", "F" + "1" * 5000])
def test_a_verdict_for_a_fact_id_that_is_no_number_is_no_verdict_not_a_crash(ref: str) -> None:
    """int() refuses "²" (a digit to str.isdigit) and a string past its digit limit: such an id
    judges no fact, like any id the judge was not given."""
    from services.sessions.judge import read_verdicts

    answer = json.dumps({"verdicts": [{"id": ref, "classification": "LONG", "content": "x"}]})
    assert read_verdicts(answer, 1) == {}
