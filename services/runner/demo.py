"""``./run demo``: a scripted agent life against a running ``./run up``.

One seat (ana, a software engineer) lives through a few weeks of turns: people with their own
styles ask for things, state preferences and situational facts, and one procedure recurs (fixing a
flaky test: the same five tools in the same order). Every turn is submitted to the reflector, which
learns from it in the background. Then new turns start, and the demo prints what BuildTurnContext
hands the agent: the notes, the similar prior work, the synthesized skill and the profiles that the
earlier turns taught.

Then a chat session (spec/session-learning.txt): Dana works with ana on a failing payments test —
an execution plan whose steps get done, a substantial turn of tool results ending in a green
verification, and a manual "Check recent work". The learning checks run from the durable queue,
and the demo prints their receipts and the skill proposal waiting for approval. Everything runs
with the offline model provider: no keys, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from agentlearn.knowledge.v1 import knowledge_service_pb2 as kpb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kgrpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rpb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rgrpc
from agentlearn.sessions.v1 import session_service_pb2 as spb_s
from agentlearn.sessions.v1 import session_service_pb2_grpc as sgrpc_s
from agentlearn.skills.v1 import skill_service_pb2 as spb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sgrpc
from libs.common.protoconv import timestamp

__all__ = ["main"]

SEAT, ROLE = "ana", "swe"
FIX_TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "run_tests", "github_create_pr"]


def _turn(
    company: str,
    n: int,
    when: datetime,
    *,
    label: str,
    who: str = "",
    platform: str = "slack",
    says: list[str] | None = None,
    ask: str = "",
    did: str,
    tools: list[str],
    outcome: rpb.TurnOutcome = rpb.TURN_OUTCOME_DONE,
    offered: list[tuple[str, str]] | None = None,
) -> rpb.TurnCompleted:
    return rpb.TurnCompleted(
        turn_id=f"{company}-turn-{n:03d}",
        work_key=f"{company}-work-{n:03d}",
        company=company,
        seat=SEAT,
        role=ROLE,
        label=label,
        ask=ask,
        what_it_did=did,
        outcome=outcome,
        review_outcome="approved",
        # Every call in order, and the final round's tools: the last call (the one that answered).
        tool_sequence=tools[-1:],
        tools_called=tools,
        offered_skills=[rpb.OfferedSkill(id=i, name=name) for i, name in (offered or [])],
        interactions=[
            rpb.InboundInteraction(
                sender=rpb.Sender(handle=who, platform=platform, display_name=who.title()),
                body=body,
                send_time=timestamp(when),
            )
            for body in (says or [])
        ],
        trigger_kind=rpb.TRIGGER_KIND_MESSAGE if says else rpb.TRIGGER_KIND_TASK,
        start_time=timestamp(when - timedelta(minutes=12)),
        end_time=timestamp(when),
        conversation_id=f"{company}-{who or 'tasks'}",
    )


def life(company: str, start: datetime) -> list[rpb.TurnCompleted]:
    """A few weeks of ana's turns, oldest first."""
    turns: list[rpb.TurnCompleted] = []

    def add(**kw: Any) -> None:
        turns.append(_turn(company, len(turns) + 1, start + timedelta(hours=9 * len(turns)), **kw))

    add(
        label="Message from Bob: Slack message",
        who="bob",
        says=[
            "Hi Ana! Quick one: what's the state of the payments migration?",
            "Thanks. I prefer weekly digests over daily pings, by the way.",
        ],
        did="Summarised the payments migration status for Bob in three bullets.",
        tools=["jira_search", "slack_reply"],
    )
    add(
        label="Message from Carla: Jira comment",
        who="carla",
        platform="jira",
        says=[
            "POC-518: the checkout test failed again on main. Let's ship the retry fix today.",
            "Please never merge to main without a green staging run.",
        ],
        did="Traced the failure to a race in the cart fixture.",
        tools=["jira_get_issue", "github_search"],
    )
    flaky = ["checkout", "login", "search", "profile", "invoice", "export"]
    between: dict[int, dict[str, Any]] = {  # the messages that come in after the i-th fix
        2: {
            "label": "Message from Bob: Slack message",
            "who": "bob",
            "says": ["Heads up: I'm on vacation until the 20th, Dan covers payments meanwhile."],
            "did": "Acknowledged; noted Dan as the payments contact.",
            "tools": ["slack_reply"],
        },
        3: {
            "label": "Message from Dan: Slack message",
            "who": "dan",
            "says": ["- can you check the refund job?\n- it timed out twice last night\nthanks!"],
            "did": "Raised the refund job's timeout and added a retry; Dan confirmed.",
            "tools": ["k8s_logs", "github_search", "github_create_pr"],
        },
    }
    for i, name in enumerate(flaky):
        add(
            label="Task assigned: flaky test",
            ask=f"Fix the flaky {name} test on main",
            did=f"Opened a PR that stabilises the {name} test (fixture race); CI green.",
            tools=FIX_TOOLS,
        )
        if i in between:
            add(**between[i])
    add(
        label="Message from Carla: Jira comment",
        who="carla",
        platform="jira",
        says=["We use trunk-based development, so keep branches short-lived."],
        did="Rebased and merged the short branch.",
        tools=["github_merge"],
    )
    return turns


def _print_context(title: str, resp: ppb.BuildTurnContextResponse) -> None:
    print("\n" + "=" * 100)
    print(f"  {title}")
    embedding = resp.summary.turn_embedding
    fate = (
        ppb.TurnEmbedding.Name(embedding).removeprefix("TURN_EMBEDDING_").lower()
        if embedding
        else "none: no search asked for one"
    )
    print(f"  {resp.summary.line}   (turn embedding: {fate})")
    print("=" * 100)
    for block in resp.blocks:
        if block.hit:
            print(block.markdown.rstrip() + "\n")


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./run demo", description="a scripted agent life against ./run up")
    parser.add_argument("--address", default="127.0.0.1:50051", help="the running all-in-one (default %(default)s)")
    parser.add_argument("--company", default=f"demo-{int(time.time())}", help="a fresh company each run")
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTLEARN_TOKEN"),
        help="a caller token, for ./run up --require-auth (default: $AGENTLEARN_TOKEN; local mode needs none)",
    )
    args = parser.parse_args(argv)
    interceptors = [_Bearer(args.token)] if args.token else []
    async with grpc.aio.insecure_channel(args.address, interceptors=interceptors) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), 10)
        except TimeoutError:
            print(f"nothing answers on {args.address}: start the system first with ./run up")
            return 2
        try:
            return await _demo(channel, args.company)
        except grpc.aio.AioRpcError as err:
            if err.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise
            hint = "" if args.token else " (pass --token or set AGENTLEARN_TOKEN: ./run token issue)"
            print(f"./run demo: {err.code().name}: {err.details()}{hint}", file=sys.stderr)
            return 2


class _Bearer(grpc.aio.UnaryUnaryClientInterceptor):
    """Every call carries ``authorization: Bearer <token>`` (the demo's calls are all unary)."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()), self._metadata)
        return await continuation(client_call_details._replace(metadata=metadata), request)


async def _demo(channel: grpc.aio.Channel, company: str) -> int:
    """The scripted life and the chat session (see the module's docstring)."""
    reflector = rgrpc.ReflectorServiceStub(channel)
    prefetch = pgrpc.PrefetchServiceStub(channel)
    skills = sgrpc.SkillServiceStub(channel)
    now = datetime.now(UTC)
    turns = life(company, now - timedelta(days=21))
    print(f"company {company}, seat {SEAT}: submitting {len(turns)} turns to the reflector ...")
    for t in turns:
        await reflector.SubmitTurn(rpb.SubmitTurnRequest(turn=t), timeout=10)
    pending = {t.turn_id for t in turns}
    deadline = time.monotonic() + 180
    while pending and time.monotonic() < deadline:
        for turn_id in sorted(pending):
            r = (
                await reflector.GetReflection(
                    rpb.GetReflectionRequest(company=company, seat=SEAT, turn_id=turn_id), timeout=10
                )
            ).reflection
            if r.state in (rpb.REFLECTION_STATE_COMPLETED, rpb.REFLECTION_STATE_GATED):
                pending.discard(turn_id)
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        print(f"{len(pending)} turns were not reflected within 3 minutes; showing what was learned so far")
    print("\nwhat each turn taught (the reflector's record):")
    for t in turns:
        r = (
            await reflector.GetReflection(
                rpb.GetReflectionRequest(company=company, seat=SEAT, turn_id=t.turn_id), timeout=10
            )
        ).reflection
        wrote = [
            f"{w.worker}: {', '.join(w.written) or w.detail}"
            for w in r.workers
            if w.status == rpb.WORKER_STATUS_WROTE and w.worker != "episodist"
        ]
        print(f"  {t.turn_id}  {t.label[:38]:<38}  " + ("; ".join(wrote) or "(episode only)"))

    learned = (await skills.ListSkills(spb.ListSkillsRequest(company=company, seat=SEAT), timeout=10)).skills
    offered = [(s.id, s.name) for s in learned]

    bob = ppb.Counterparty(handle="bob", platform="slack", display_name="Bob")
    new_turns: list[tuple[str, dict[str, Any]]] = [
        (
            "New turn: Bob asks for a payments update",
            {"ask": "Bob: can you send me an update on the payments migration?", "senders": [bob]},
        ),
        ("New turn: a task like the recurring one", {"ask": "Fix the flaky notifications test on main"}),
        (
            "New turn: a thin trigger ('+1' in a thread): the gate renders hints, asks no model",
            {"ask": "+1", "requires_recon": True, "senders": [bob]},
        ),
    ]
    for n, (title, turn) in enumerate(new_turns, start=1):
        resp = await prefetch.BuildTurnContext(
            ppb.BuildTurnContextRequest(company=company, seat=SEAT, role=ROLE, turn_id=f"{company}-new-{n}", **turn),
            timeout=60,
        )
        _print_context(title, resp)
    print(f"skills the seat learned: {', '.join(name for _, name in offered) or 'none'}")
    if not await session_demo(channel, company):
        return 1
    return 0


# ------------------------------------------------------------------------------ a chat session

USER, WORKSPACE = "dana", "payments"


def _event(n: int, kind: spb_s.EventKind, text: str, when: datetime, turn: str, **kw: Any) -> spb_s.SessionEvent:
    return spb_s.SessionEvent(
        event_id=f"ev-{n:03d}", kind=kind, text=text, event_time=timestamp(when), turn_id=turn, **kw
    )


def session_events(start: datetime) -> tuple[list[spb_s.SessionEvent], list[spb_s.SessionEvent]]:
    """Two turns of Dana's session with ana: the first opens the work, the second is substantial (six
    tool results and a green verification; an external coding agent's excerpt among them)."""
    ok = spb_s.EVENT_STATUS_SUCCEEDED
    first = [
        _event(
            1, spb_s.EVENT_KIND_USER_MESSAGE, "The payments refund test fails on CI. Can you fix it?", start, "turn-1"
        ),
        _event(
            2,
            spb_s.EVENT_KIND_USER_MESSAGE,
            "Dana reviews pull requests only in the mornings.",
            start + timedelta(seconds=5),
            "turn-1",
            remember=True,
        ),
        _event(
            3,
            spb_s.EVENT_KIND_ASSISTANT_MESSAGE,
            "On it: I'll plan the fix first.",
            start + timedelta(seconds=9),
            "turn-1",
        ),
    ]
    at = start + timedelta(minutes=1)
    runs = [
        (
            "pytest",
            'tests/payments/test_refund.py FAILED: relation "refunds_v2" does not exist',
            spb_s.EVENT_STATUS_FAILED,
        ),
        ("make", "make migrate: applied 3 migrations (refunds_v2 created)", ok),
        ("grep", "conftest.py:12 uses DATABASE_URL=postgres://ci:s3cret-pw@db:5432/test", ok),
        ("claude-code", "Patched conftest.py to run migrations once per session; 1 file changed", ok),
        ("git", "committed: fix(payments): migrate the test database before the refund tests", ok),
        ("gh", "opened PR #482: fix(payments): migrate before refund tests", ok),
    ]
    second = []
    for i, (tool, text, status) in enumerate(runs):
        when = at + timedelta(seconds=20 * i)
        second.append(_event(10 + 2 * i, spb_s.EVENT_KIND_TOOL_REQUEST, f"{tool} ...", when, "turn-2", tool_name=tool))
        second.append(
            _event(
                11 + 2 * i,
                spb_s.EVENT_KIND_TOOL_RESULT,
                text,
                when + timedelta(seconds=10),
                "turn-2",
                tool_name=tool,
                status=status,
                source="claude-code" if tool == "claude-code" else "",
            )
        )
    end = at + timedelta(minutes=3)
    second.append(
        _event(
            30,
            spb_s.EVENT_KIND_VERIFICATION,
            "pytest tests/payments: 42 passed in 3.1s",
            end,
            "turn-2",
            tool_name="pytest",
            status=ok,
        )
    )
    second.append(_event(31, spb_s.EVENT_KIND_ASSISTANT_MESSAGE, "Fixed, PR #482 is green.", end, "turn-2"))
    second.append(
        _event(
            32,
            spb_s.EVENT_KIND_TURN_END,
            "",
            end + timedelta(seconds=1),
            "turn-2",
            turn_outcome=spb_s.TURN_OUTCOME_SUCCEEDED,
        )
    )
    return first, second


def _name(enum: EnumTypeWrapper, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower()


def _print_check(c: spb_s.LearningCheck) -> None:
    trigger = _name(spb_s.CheckTrigger, c.trigger, "CHECK_TRIGGER_")
    state = _name(spb_s.CheckState, c.state, "CHECK_STATE_")
    outcome = _name(spb_s.CheckOutcome, c.outcome, "CHECK_OUTCOME_") if c.outcome else "-"
    print(f"  {trigger:<17} {state:<11} {outcome:<16} {c.reason}")
    ev = c.evidence
    print(
        f"      read {ev.chat_messages} chat messages, {ev.verification_records} verification records, "
        f"{ev.execution_events} execution events, {ev.plan_steps} plan steps; "
        f"{ev.redactions} secret{'' if ev.redactions == 1 else 's'} redacted"
    )
    for o in c.outputs:
        kind = _name(spb_s.OutputKind, o.kind, "OUTPUT_KIND_")
        disp = _name(spb_s.OutputDisposition, o.disposition, "OUTPUT_DISPOSITION_")
        print(f"      {disp:<7} {kind:<15} {o.id}  (cites {', '.join(o.evidence_ids)})")
    for d in c.dropped:
        print(f"      dropped {_name(spb_s.OutputKind, d.kind, 'OUTPUT_KIND_')}: {d.reason}")
    for p in c.partial_failures:
        print(f"      partial failure {_name(spb_s.FailureKind, p.failure, 'FAILURE_KIND_')}: {p.detail}")


async def _settled(stub: sgrpc_s.SessionServiceStub, company: str, session_id: str, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        checks = (
            await stub.ListLearningChecks(
                spb_s.ListLearningChecksRequest(company=company, session_id=session_id, user=USER), timeout=10
            )
        ).checks
        if checks and all(c.state not in (spb_s.CHECK_STATE_QUEUED, spb_s.CHECK_STATE_RUNNING) for c in checks):
            return True
        await asyncio.sleep(0.3)
    return False


async def session_demo(channel: grpc.aio.Channel, company: str) -> bool:
    """A chat session's learning checks: plan steps done, a substantial turn, a manual check."""
    sessions = sgrpc_s.SessionServiceStub(channel)
    skills = sgrpc.SkillServiceStub(channel)
    knowledge = kgrpc.KnowledgeServiceStub(channel)
    session_id = f"{company}-session-1"
    first, second = session_events(datetime.now(UTC) - timedelta(minutes=10))
    print("\n" + "=" * 100)
    print(f"  Session learning: {USER} works with {SEAT} in workspace {WORKSPACE} (session {session_id})")
    print("=" * 100)
    await sessions.AppendSessionEvents(
        spb_s.AppendSessionEventsRequest(
            company=company, session_id=session_id, user=USER, workspace=WORKSPACE, seat=SEAT, role=ROLE, events=first
        ),
        timeout=10,
    )
    steps = [
        ("reproduce", "Reproduce the failing refund test"),
        ("fix", "Fix the test database setup"),
        ("pr", "Open a pull request"),
    ]

    async def plan(revision: int, statuses: list[spb_s.StepStatus]) -> spb_s.SavePlanResponse:
        return await sessions.SavePlan(
            spb_s.SavePlanRequest(
                company=company,
                session_id=session_id,
                user=USER,
                revision=revision,
                steps=[spb_s.PlanStep(id=i, title=t, status=st) for (i, t), st in zip(steps, statuses, strict=True)],
            ),
            timeout=10,
        )

    await plan(1, [spb_s.STEP_STATUS_PROPOSED] * 3)
    print("plan revision 1 (proposed): no check")
    await sessions.AppendSessionEvents(
        spb_s.AppendSessionEventsRequest(company=company, session_id=session_id, user=USER, events=second[:6]),
        timeout=10,
    )
    saved = await plan(2, [spb_s.STEP_STATUS_DONE, spb_s.STEP_STATUS_IN_PROGRESS, spb_s.STEP_STATUS_PENDING])
    print(f"plan revision 2: steps newly done {list(saved.newly_done_step_ids)} -> one check queued")
    turn = await sessions.AppendSessionEvents(
        spb_s.AppendSessionEventsRequest(company=company, session_id=session_id, user=USER, events=second[6:]),
        timeout=10,
    )
    print(f"turn-2 ended successfully after six tool results -> {len(turn.queued_checks)} check queued")
    if not await _settled(sessions, company, session_id):
        print("the learning checks did not finish within 2 minutes")
        return False
    await sessions.CheckRecentWork(
        spb_s.CheckRecentWorkRequest(company=company, session_id=session_id, user=USER), timeout=10
    )
    again = await sessions.CheckRecentWork(
        spb_s.CheckRecentWorkRequest(company=company, session_id=session_id, user=USER), timeout=10
    )
    print(f"Check recent work -> a manual check; asked again at once -> reused: {again.reused}")
    if not await _settled(sessions, company, session_id):
        print("the manual check did not finish within 2 minutes")
        return False
    checks = (
        await sessions.ListLearningChecks(
            spb_s.ListLearningChecksRequest(company=company, session_id=session_id, user=USER), timeout=10
        )
    ).checks
    print("\nlearning receipts (newest first; ListLearningChecks, also GET /api/sessions/{id}/learning):")
    for c in checks:
        _print_check(c)
    lessons = {o.id for c in checks for o in c.outputs if o.kind == spb_s.OUTPUT_KIND_PROJECT_LESSON}
    for page_id in sorted(lessons):
        # Read as an operator (a reader naming no seat or role): the demo runs in local mode.
        request = kpb.GetPageRequest(reader=kpb.Reader(company=company), page_id=page_id)
        page = (await knowledge.GetPage(request, timeout=10)).page
        print(f"\nproject lesson in {page.container}: {page.title}\n  {page.body.splitlines()[0]}")
    proposals = (
        await skills.ListSkillProposals(spb.ListSkillProposalsRequest(company=company, seat=SEAT), timeout=10)
    ).proposals
    print("\nskill proposals awaiting approval (ListSkillProposals; never live until approved):")
    for prop in proposals:
        state = spb.ProposalState.Name(prop.state).removeprefix("PROPOSAL_STATE_").lower()
        print(f"  [{state}] {prop.name}: {prop.summary}")
        print(f"    tools: {' -> '.join(prop.tool_sequence)}; from session {prop.source.session_id}")
        for line in prop.body.splitlines():
            print(f"    | {line}")
    return True
