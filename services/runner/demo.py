"""``./run demo``: a scripted agent life against a running ``./run up``.

One seat (ana, a software engineer) lives through a few weeks of turns: people with their own
styles ask for things, state preferences and situational facts, and one procedure recurs (fixing a
flaky test: the same five tools in the same order). Every turn is submitted to the reflector, which
learns from it in the background. Then new turns start, and the demo prints what BuildTurnContext
hands the agent: the notes, the similar prior work, the synthesized skill and the profiles that the
earlier turns taught. Everything runs with the offline model provider: no keys, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import grpc

from agentlearn.prefetch.v1 import prefetch_service_pb2 as ppb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pgrpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rpb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rgrpc
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
    outcome: int = rpb.TURN_OUTCOME_DONE,
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
        tool_sequence=tools,
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

    def add(**kw) -> None:  # type: ignore[no-untyped-def]
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
    for i, name in enumerate(flaky):
        add(
            label="Task assigned: flaky test",
            ask=f"Fix the flaky {name} test on main",
            did=f"Opened a PR that stabilises the {name} test (fixture race); CI green.",
            tools=FIX_TOOLS,
        )
        if i == 2:
            add(
                label="Message from Bob: Slack message",
                who="bob",
                says=["Heads up: I'm on vacation until the 20th, Dan covers payments meanwhile."],
                did="Acknowledged; noted Dan as the payments contact.",
                tools=["slack_reply"],
            )
        if i == 3:
            add(
                label="Message from Dan: Slack message",
                who="dan",
                says=["- can you check the refund job?\n- it timed out twice last night\nthanks!"],
                did="Raised the refund job's timeout and added a retry; Dan confirmed.",
                tools=["k8s_logs", "github_search", "github_create_pr"],
            )
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
    print(f"  {resp.summary.line}   (turn embedding: {ppb.TurnEmbedding.Name(resp.summary.turn_embedding)})")
    print("=" * 100)
    for block in resp.blocks:
        if block.hit:
            print(block.markdown.rstrip() + "\n")


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./run demo", description="a scripted agent life against ./run up")
    parser.add_argument("--address", default="127.0.0.1:50051", help="the running all-in-one (default %(default)s)")
    parser.add_argument("--company", default=f"demo-{int(time.time())}", help="a fresh company each run")
    args = parser.parse_args(argv)
    company = args.company
    async with grpc.aio.insecure_channel(args.address) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), 10)
        except TimeoutError:
            print(f"nothing answers on {args.address}: start the system first with ./run up")
            return 2
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
        resp = await prefetch.BuildTurnContext(
            ppb.BuildTurnContextRequest(
                company=company,
                seat=SEAT,
                role=ROLE,
                turn_id=f"{company}-new-1",
                ask="Bob: can you send me an update on the payments migration?",
                senders=[bob],
            ),
            timeout=60,
        )
        _print_context("New turn: Bob asks for a payments update", resp)

        resp = await prefetch.BuildTurnContext(
            ppb.BuildTurnContextRequest(
                company=company,
                seat=SEAT,
                role=ROLE,
                turn_id=f"{company}-new-2",
                ask="Fix the flaky notifications test on main",
            ),
            timeout=60,
        )
        _print_context("New turn: a task like the recurring one", resp)

        resp = await prefetch.BuildTurnContext(
            ppb.BuildTurnContextRequest(
                company=company,
                seat=SEAT,
                role=ROLE,
                turn_id=f"{company}-new-3",
                ask="+1",
                requires_recon=True,
                senders=[bob],
            ),
            timeout=60,
        )
        _print_context("New turn: a thin trigger ('+1' in a thread): the gate renders hints, asks no model", resp)
        print(f"skills the seat learned: {', '.join(name for _, name in offered) or 'none'}")
    return 0
