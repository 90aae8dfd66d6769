"""Each reflection worker's rules, with every service it writes through running for real: the
episodist, the profiler, skill use, single-turn synthesis, the auto refiner, and isolation between
them. The model is the offline rules or a scripted OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as d_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as d_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pr_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from libs.common.auxmodel.answers import digest
from libs.common.events import read_events
from services.reflector.workers.profiler import LIST_BOUNDS, STYLE_CHARS
from tests.support.app import open_app
from tests.support.scripted_openai import openai_provider
from tests.support.turns import message, turn

PROMPTS = Path(__file__).resolve().parent.parent / "services" / "reflector" / "prompts"

ALL = ["diary", "episodes", "skills", "profiles", "reflector"]
FIVE_TOOLS = ["jira_get_issue", "github_search", "github_create_branch", "run_tests", "github_create_pr"]


class Env:
    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app
        self.stub = pb_grpc.ReflectorServiceStub(app.channel)
        self.episodes = ep_grpc.EpisodeServiceStub(app.channel)
        self.skills = sk_grpc.SkillServiceStub(app.channel)
        self.profiles = pr_grpc.ProfileServiceStub(app.channel)
        self.harness = app.components["reflector"].service.harness

    async def reflect(self, t: pb.TurnCompleted) -> pb.Reflection:
        await self.stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))
        await self.harness.drain()
        resp = await self.stub.GetReflection(pb.GetReflectionRequest(company=t.company, seat=t.seat, turn_id=t.turn_id))
        return resp.reflection

    @staticmethod
    def worker(r: pb.Reflection, name: str) -> pb.WorkerOutcome:
        [w] = [w for w in r.workers if w.worker == name]
        return w

    async def skill(self, name: str, tools: list[str], seat: str = "ana") -> sk_pb.Skill:
        resp = await self.skills.CreateSkill(
            sk_pb.CreateSkillRequest(
                company="acme",
                seat=seat,
                name=name,
                summary=f"use for {name}",
                body=f"# {name}\n\n1. Go.\n",
                tool_sequence=tools,
                trigger=sk_pb.SKILL_TRIGGER_SINGLE,
                source_turn_ids=[f"seed-{name}"],
            )
        )
        return resp.skill


@pytest.fixture
def env_for(make_settings, dsn, clock, local_embedder, edge_index):
    def opener(learning=None, **settings):  # type: ignore[no-untyped-def]
        return _Opened(make_settings(learning=learning or {}, **settings), dsn, clock, local_embedder, edge_index)

    return opener


class _Opened:
    def __init__(self, settings, dsn, clock, embedder, index):  # type: ignore[no-untyped-def]
        self._cm = open_app(settings, dsn, names=ALL, clock=clock, embedder=embedder, index=index)

    async def __aenter__(self) -> Env:
        return Env(await self._cm.__aenter__())

    async def __aexit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        await self._cm.__aexit__(*exc)


# ------------------------------------------------------------------------------ episodist


async def test_the_episodist_records_one_row_per_turn(env_for, clock):
    async with env_for() as env:
        msgs = [message("bob", "Can you look at the flaky kafka consumer?")]
        r = await env.reflect(
            turn(
                "run-1",
                now=clock.now(),
                messages=msgs,
                label="Message from Bob: Slack message",
                what_it_did="Pinned the consumer group and reran CI.",
            )
        )
        assert env.worker(r, "episodist").status == pb.WORKER_STATUS_WROTE
        got = (
            await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-1"))
        ).episode
        assert got.label == "Message from Bob: Slack message"
        assert got.ask == "Can you look at the flaky kafka consumer?"  # the salient body, not a wrapper
        assert got.what_it_did == "Pinned the consumer group and reran CI."
        assert list(got.tools_called) == ["search_docs", "read_ticket"] and got.role == "swe"
        assert list(got.tool_sequence) == ["read_ticket"]  # the final round, as reported
        assert list(got.subjects) == ["bob"]


async def test_a_redelivered_trigger_counts_once_in_episodes_profiles_and_notes(env_for, clock):
    """The same work run twice (a redelivered trigger: a new run id, the same work key) is reflected
    twice — a second pass over a second execution — but collapses by its work key: one episode, one
    observation of Bob, one note."""
    async with env_for(learning={"reflection": {"workers": ["persist_decider", "episodist", "profiler"]}}) as env:
        msgs = [message("bob", "Thanks! I prefer weekly digests over daily pings.")]
        first = turn("run-1", now=clock.now(), messages=msgs)
        again = turn("run-2", now=clock.now(), messages=msgs)
        again.work_key = first.work_key
        await env.reflect(first)
        r = await env.reflect(again)
        assert r.state == pb.REFLECTION_STATE_COMPLETED
        w = env.worker(r, "episodist")
        assert w.status == pb.WORKER_STATUS_NOTHING and "collapsed" in w.detail
        listed = await env.episodes.ListEpisodes(ep_pb.ListEpisodesRequest(company="acme", seat="ana"))
        assert listed.total_size == 1
        [bob] = (
            await env.profiles.GetProfiles(
                pr_pb.GetProfilesRequest(
                    company="acme", observer="ana", subjects=[pr_pb.Subject(handle="bob", platform="slack")]
                )
            )
        ).profiles
        assert bob.observation_count == 1
        notes = await env.app.infra.pool.fetchval("SELECT count(*) FROM agent_diary WHERE seat = 'ana'")
        assert notes == 1


async def test_a_self_iterate_round_is_recorded_but_not_persisted(env_for, clock):
    async with env_for() as env:
        r = await env.reflect(
            turn(
                "run-1",
                now=clock.now(),
                outcome=pb.TURN_OUTCOME_SELF_ITERATE,
                messages=[message("bob", "I prefer bullet points.")],
            )
        )
        assert env.worker(r, "episodist").status == pb.WORKER_STATUS_WROTE
        assert env.worker(r, "persist_decider").gate == "unsettled"


async def test_a_turn_that_called_reflect_and_persist_is_self_persisted_without_the_flag(env_for, clock):
    """Spec: the post-turn decider is skipped "when the turn already self-persisted in-flight (the
    executor called reflect_and_persist)". Either signal says so — the flag, or the call among the
    turn's tools (every call, or the final round's when no calls were reported) — and is reported
    alike; the call alone used to run the decider, which could note the same fact a second time."""
    said = [message("bob", "I prefer weekly digests over daily pings.")]
    async with env_for(learning={"reflection": {"workers": ["persist_decider"]}}) as env:
        flagged = await env.reflect(turn("run-1", now=clock.now(), messages=said, self_persisted=True))
        called = await env.reflect(
            turn("run-2", now=clock.now(), messages=said, tools=["search_docs", "reflect_and_persist", "send_message"])
        )
        last_round = await env.reflect(
            turn("run-3", now=clock.now(), messages=said, tools=[], final_round=["reflect_and_persist"])
        )
        want = env.worker(flagged, "persist_decider")
        assert want.status == pb.WORKER_STATUS_SKIPPED and want.gate == "self_persisted"
        for r in (called, last_round):
            w = env.worker(r, "persist_decider")
            assert (w.status, w.gate, w.detail, list(w.written)) == (want.status, want.gate, want.detail, [])
        assert await env.app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0


async def test_an_answer_that_names_no_tier_defaults_to_noop(env_for, clock, scripted_openai):
    """Spec: the decision "Defaults to NOOP". An answer that is a JSON object but names none of the
    four tiers — no classification at all, or one outside them — persists nothing and is recorded as
    NOOP, not as a failure. An answer that is no JSON object is still `invalid_output`: that is a
    broken model or endpoint rather than a decision, and calling it NOOP would hide it (the other
    workers draw the same line: an object without a decision is nothing, no object is a failure)."""
    answers = [
        {},
        {"classification": "MAYBE", "content": "Bob prefers weekly digests."},
        {"content": "Bob prefers weekly digests.", "reason": "stated"},
    ]
    said = [message("bob", "I prefer weekly digests over daily pings.")]
    async with env_for(
        learning={"reflection": {"workers": ["persist_decider"]}}, providers=scripted(scripted_openai)
    ) as env:
        for n, answer in enumerate(answers):
            scripted_openai.chat_handler = lambda body, answer=answer: json.dumps(answer)
            r = await env.reflect(turn(f"run-{n}", now=clock.now(), messages=said))
            w = env.worker(r, "persist_decider")
            assert (w.status, w.detail, w.failure, list(w.written)) == (pb.WORKER_STATUS_NOTHING, "NOOP", "", [])
            assert r.state == pb.REFLECTION_STATE_COMPLETED
        assert await env.app.infra.pool.fetchval("SELECT count(*) FROM agent_diary") == 0
        decided = await read_events(env.app.infra.pool, "persist_decider_completed")
        assert [(e["payload"]["classification"], e["payload"]["written"]) for e in decided] == [("NOOP", False)] * 3

        scripted_openai.chat_handler = lambda body: "LONG: Bob prefers weekly digests."
        r = await env.reflect(turn("run-unparseable", now=clock.now(), messages=said))
        w = env.worker(r, "persist_decider")
        assert w.status == pb.WORKER_STATUS_FAILED and w.failure.startswith("invalid_output")


# ------------------------------------------------------------------------------ profiler


async def test_the_profiler_observes_each_distinct_sender_never_the_seat(env_for, clock):
    async with env_for() as env:
        msgs = [
            message("bob", "Please keep it short."),
            message("carla", "Let's ship the kafka fix today."),
            message("bob", "Also: never page me after 6pm."),
            message("ana", "On it."),  # the seat itself
        ]
        r = await env.reflect(
            turn("run-1", now=clock.now(), messages=msgs, outcome=pb.TURN_OUTCOME_SELF_ITERATE)
        )  # runs on unsettled turns too
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE and sorted(w.written) == ["profile:slack/bob", "profile:slack/carla"]
        got = await env.profiles.GetProfiles(
            pr_pb.GetProfilesRequest(
                company="acme",
                observer="ana",
                subjects=[
                    pr_pb.Subject(handle="bob", platform="slack"),
                    pr_pb.Subject(handle="carla", platform="slack"),
                    pr_pb.Subject(handle="ana", platform="slack"),
                ],
            )
        )
        assert [p.subject.handle for p in got.profiles] == ["bob", "carla"]
        bob = got.profiles[0]
        assert bob.observation_count == 1  # four messages, one counterparty pass per sender
        assert any("never page me" in s for s in bob.sensitivities)
        assert any("ship the kafka fix" in d for d in got.profiles[1].past_decisions)
        # Private to the observer.
        other = await env.profiles.GetProfiles(
            pr_pb.GetProfilesRequest(
                company="acme", observer="dan", subjects=[pr_pb.Subject(handle="bob", platform="slack")]
            )
        )
        assert list(other.profiles) == []


async def test_a_sender_named_like_the_seat_in_another_case_is_the_seat(env_for, clock):
    """The profiler compares the seat to a sender case-insensitively, as the profiles service refuses
    (SELF_PROFILE): "Ana" on a turn of seat ana is the seat, skipped — it used to be sent, refused,
    and fail the worker before the senders after it were profiled."""
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}) as env:
        msgs = [
            message("bob", "Please keep it short."),
            message("Ana", "On it."),
            message("carla", "Let's ship the kafka fix today."),
        ]
        r = await env.reflect(turn("run-1", now=clock.now(), messages=msgs))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE and w.failure == ""
        assert sorted(w.written) == ["profile:slack/bob", "profile:slack/carla"]


async def test_one_senders_failure_costs_no_other_sender(env_for, clock, scripted_openai):
    """The model's answer about dan is unusable: dan is not profiled (the record says so), bob before
    him and carla after him are."""

    def answer(body: dict) -> str:  # type: ignore[type-arg]
        if "Dan" in body["messages"][1]["content"].split("\n", 1)[0]:
            return "not json at all"
        return json.dumps({"noop": False, "communication_style": "brief", "topics": ["kafka"]})

    scripted_openai.chat_handler = answer
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        msgs = [message("bob", "Keep it short."), message("dan", "Check the refund job."), message("carla", "Ship.")]
        r = await env.reflect(turn("run-1", now=clock.now(), messages=msgs))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE
        assert sorted(w.written) == ["profile:slack/bob", "profile:slack/carla"]
        assert w.failure.startswith("invalid_output") and f"sender {digest('slack/dan')};" in w.failure
        assert r.state == pb.REFLECTION_STATE_COMPLETED  # a final failure: not retried


async def test_the_profiler_profiles_every_sender_a_turn_may_carry(env_for, clock, scripted_openai):
    """SubmitTurn takes a sender on a platform written "MS Teams", a one-letter GitHub login, a
    platform with "/" and ":" in it; the profiles' contract refused the first and the last
    (INVALID_ARGUMENT: final, so the person never got a profile). Each is profiled now, the platform
    filed folded, and each sender's key escapes the platform so none can read as another sender's."""
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"noop": False, "communication_style": "brief", "topics": ["billing"]}
    )
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        msgs = [
            message("dana", "Keep the invoices in euros.", platform="MS Teams"),
            message("q", "Ship the fix.", platform="github"),
            message("bob", "Check the refund job.", platform="Lab:Chat/EU"),
        ]
        r = await env.reflect(turn("run-1", now=clock.now(), messages=msgs))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE and w.failure == "", w.failure
        assert sorted(w.written) == ["profile:Lab%3AChat%2FEU/bob", "profile:MS Teams/dana", "profile:github/q"]
        got = await env.profiles.GetProfiles(
            pr_pb.GetProfilesRequest(
                company="acme",
                observer="ana",
                subjects=[
                    pr_pb.Subject(handle="dana", platform="ms teams"),
                    pr_pb.Subject(handle="q", platform="GitHub"),
                    pr_pb.Subject(handle="bob", platform="lab:chat/eu"),
                ],
            )
        )
        assert [(p.subject.handle, p.subject.platform) for p in got.profiles] == [
            ("dana", "ms teams"),
            ("q", "github"),
            ("bob", "lab:chat/eu"),
        ]
        assert all(list(p.topics) == ["billing"] for p in got.profiles)


async def test_a_sender_at_the_bounds_of_submit_turn_is_profiled(env_for, clock, scripted_openai):
    """A handle of 200 characters and a platform of 64 (SubmitTurn's bounds), ":" in both: the
    profiler's key (``<work key>:profiler:<platform>/<handle>``, both escaped) was past
    UpsertProfile's 200-character request_id, refused (final), and the person never profiled."""
    handle, platform = "x:" * 100, "p:" * 32
    scripted_openai.chat_handler = lambda body: json.dumps({"noop": False, "communication_style": "brief"})
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        r = await env.reflect(turn("run-1", now=clock.now(), messages=[message(handle, "Hi.", platform=platform)]))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE and w.failure == "", w.failure
        got = await env.profiles.GetProfiles(
            pr_pb.GetProfilesRequest(
                company="acme", observer="ana", subjects=[pr_pb.Subject(handle=handle, platform=platform)]
            )
        )
        assert [p.communication_style for p in got.profiles] == ["brief"]


async def test_the_profiler_sends_whole_entries_within_the_services_bounds(env_for, clock, scripted_openai):
    """An answer past UpsertProfile's bounds: a style or an item longer than its bound is left out
    whole (never cut mid-text to read as the whole of it), the others sent whole however long
    within it; a list with more items than a profile keeps is sent as the model's first ones, so
    the sender's observation is not refused whole (TOO_MANY_ITEMS, not retried)."""
    style_chars = STYLE_CHARS
    most_topics, item_chars = LIST_BOUNDS["topics"]
    long_style = ("Writes long careful paragraphs and explains every constraint before the ask. " * 20)[
        : style_chars - 10
    ].strip()
    decision = "Decided " + "to keep the nightly batch " * ((item_chars - 8) // 26)
    assert 500 < len(long_style) <= style_chars and len(decision) <= item_chars

    def answer(body: dict) -> str:  # type: ignore[type-arg]
        who = body["messages"][1]["content"].split("\n", 1)[0]
        if "Dan" in who:
            topics = [f"topic {i}" for i in range(most_topics + 1)]
            return json.dumps({"noop": False, "communication_style": "terse", "topics": topics})
        if "Carla" in who:  # everything past its bound: nothing left to write
            return json.dumps({"noop": False, "communication_style": "x" * (style_chars + 1)})
        too_long = "Decided " + "y" * item_chars
        return json.dumps(
            {"noop": False, "communication_style": long_style, "past_decisions": [too_long, decision, "Ship Friday"]}
        )

    scripted_openai.chat_handler = answer
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        msgs = [message("bob", "Keep it short."), message("dan", "Check the refund job."), message("carla", "Hi.")]
        r = await env.reflect(turn("run-1", now=clock.now(), messages=msgs))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_WROTE and not w.failure
        assert sorted(w.written) == ["profile:slack/bob", "profile:slack/dan"]
        got = await env.profiles.GetProfiles(
            pr_pb.GetProfilesRequest(
                company="acme",
                observer="ana",
                subjects=[pr_pb.Subject(handle=h, platform="slack") for h in ("bob", "dan", "carla")],
            )
        )
        bob, dan = got.profiles
        assert bob.communication_style == long_style
        assert list(bob.past_decisions) == [decision.strip(), "Ship Friday"]
        assert dan.communication_style == "terse" and list(dan.topics) == [f"topic {i}" for i in range(most_topics)]


def test_the_profiler_prompt_states_the_services_bounds():
    """The prompt asks the model to keep within what UpsertProfile takes; its numbers are the
    contract's (LIST_BOUNDS, read from the proto), so the two cannot drift apart."""
    text = (PROMPTS / "profiler.md").read_text()
    assert f"at most {STYLE_CHARS} characters" in text
    decisions, sensitivities, topics = (LIST_BOUNDS[f] for f in ("past_decisions", "sensitivities", "topics"))
    assert f"at most {decisions[0]} past\ndecisions, {sensitivities[0]} sensitivities and {topics[0]} topics" in text
    assert {decisions[1], sensitivities[1], topics[1]} == {int(text.split("each item at most ")[1].split()[0])}


async def test_a_passing_failure_for_one_sender_retries_only_the_senders_not_yet_merged(
    env_for, clock, scripted_openai
):
    from tests.support.scripted_openai import Reply

    down = {"dan": True}

    def about(body: dict) -> str:  # type: ignore[type-arg]
        return body["messages"][1]["content"].split("\n", 1)[0]

    scripted_openai.rule("chat", lambda body: Reply(status=503) if "Dan" in about(body) and down["dan"] else None)
    scripted_openai.chat_handler = lambda body: json.dumps({"noop": False, "communication_style": "brief"})
    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        msgs = [message("bob", "Keep it short."), message("dan", "Check the refund job."), message("carla", "Ship.")]
        r = await env.reflect(turn("run-1", now=clock.now(), messages=msgs))
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_RETRYING and f"sender {digest('slack/dan')};" in w.failure
        assert sorted(w.written) == ["profile:slack/bob", "profile:slack/carla"]
        down["dan"] = False
        scripted_openai.clear()
        clock.advance(seconds=60)
        await env.harness.drain()
        r = (
            await env.stub.GetReflection(pb.GetReflectionRequest(company="acme", seat="ana", turn_id="run-1"))
        ).reflection
        w = env.worker(r, "profiler")
        assert r.state == pb.REFLECTION_STATE_COMPLETED and w.status == pb.WORKER_STATUS_WROTE
        assert sorted(w.written) == ["profile:slack/bob", "profile:slack/carla", "profile:slack/dan"]
        # Only dan was asked about again: bob's and carla's profiles already carry this turn.
        assert [about(b) for b in scripted_openai.received("chat")] == ["The person: Dan (slack)"]


async def test_each_senders_pass_is_shown_that_senders_messages_alone(env_for, clock, scripted_openai):
    """Spec (Profiler): one observation pass per distinct sender, whose provenance names that sender
    alone — so the pass is shown no other sender's words: what Carol said must not reach Bob's pass,
    where a fact from it would land in Bob's profile and erasing Carol would miss it. Nor the seat's
    own messages, nor, in a turn several people wrote in, the agent's account (which restates what
    each asked). The label (what kind of event woke the turn) is shown to every pass; the account
    only when the sender is the turn's one counterparty."""
    scripted_openai.chat_handler = lambda body: json.dumps({"noop": True})

    def prompts() -> dict[str, str]:
        users = [b["messages"][1]["content"] for b in scripted_openai.received("chat")]
        return {u.split("\n", 1)[0]: u for u in users}

    async with env_for(learning={"reflection": {"workers": ["profiler"]}}, providers=scripted(scripted_openai)) as env:
        msgs = [
            message("bob", "Keep status updates to three bullets."),
            message("carol", "I'm on leave next week, hand the kafka fix to Bob."),
            message("ana", "Noted: Carol is away, Bob takes kafka."),  # the seat itself
        ]
        await env.reflect(
            turn(
                "run-1",
                now=clock.now(),
                messages=msgs,
                label="Messages in #team: Slack thread",
                what_it_did="Reassigned the kafka fix while Carol is on leave.",
            )
        )
        got = prompts()
        assert sorted(got) == ["The person: Bob (slack)", "The person: Carol (slack)"]
        bob, carol = got["The person: Bob (slack)"], got["The person: Carol (slack)"]
        assert "Keep status updates to three bullets." in bob
        assert "I'm on leave next week" not in bob and "Carol is away" not in bob  # not Carol's words, nor the seat's
        assert "I'm on leave next week, hand the kafka fix to Bob." in carol
        assert "three bullets" not in carol and "Carol is away" not in carol
        for prompt in (bob, carol):
            assert "Woken by: Messages in #team: Slack thread" in prompt
            assert "Reassigned the kafka fix" not in prompt  # several people: the account restates them

        scripted_openai.clear()
        await env.reflect(
            turn(
                "run-2",
                now=clock.now(),
                messages=[message("bob", "Approved, go ahead.")],
                what_it_did="Merged the kafka fix.",
            )
        )
        [alone] = prompts().values()
        assert "Approved, go ahead." in alone and "What it did: Merged the kafka fix." in alone


@pytest.mark.parametrize("trigger", [pb.TRIGGER_KIND_AGENT_ASK, pb.TRIGGER_KIND_SCHEDULE, pb.TRIGGER_KIND_SANDBOX])
async def test_internal_triggers_are_not_profiled(env_for, clock, trigger):
    async with env_for() as env:
        r = await env.reflect(
            turn("run-1", now=clock.now(), trigger=trigger, messages=[message("bob", "Please keep it short.")])
        )
        w = env.worker(r, "profiler")
        assert w.status == pb.WORKER_STATUS_SKIPPED and w.gate.startswith("internal_trigger")


# ------------------------------------------------------------------------------ skill use


async def test_a_run_id_and_work_key_at_their_bounds_keep_every_workers_write(env_for, clock):
    """A run id of 200 characters and a work key of 256 (SubmitTurn's bounds): a worker's
    idempotency key (``<work key or run id>:<worker>``) is longer than either, and the writes it keys
    took 200 characters, refused for good (``invalid_argument``): the note and the skill's use
    lost while the reflection said COMPLETED."""
    run_id = "r" * 200
    t = turn(run_id, now=clock.now(), messages=[message("bob", "I prefer weekly digests over daily pings.")])
    t.work_key = "w" * 256
    async with env_for() as env:
        s = await env.skill("alpha", ["a1", "a2"])
        t.offered_skills.append(pb.OfferedSkill(id=s.id, name=s.name))
        r = await env.reflect(t)
        for name in ("persist_decider", "skill_use"):
            w = env.worker(r, name)
            assert w.status == pb.WORKER_STATUS_WROTE and w.failure == "", (name, w.failure)


async def test_every_offered_skill_is_marked_used(env_for, clock):
    async with env_for() as env:
        a = await env.skill("alpha", ["a1", "a2"])
        b = await env.skill("beta", ["b1", "b2"])
        r = await env.reflect(turn("run-1", now=clock.now(), offered=[(a.id, a.name), (b.id, b.name)]))
        assert env.worker(r, "skill_use").status == pb.WORKER_STATUS_WROTE
        listed = {
            s.name: s.use_count
            for s in (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        }
        assert listed == {"alpha": 1, "beta": 1}


# ------------------------------------------------------------------------------ synthesizer


async def test_a_procedure_turn_drafts_a_single_turn_skill(env_for, clock):
    async with env_for() as env:
        r = await env.reflect(
            turn(
                "run-1",
                now=clock.now(),
                tools=FIVE_TOOLS,
                ask="Fix the flaky checkout test",
                what_it_did="Opened PR 42 with the fix.",
                messages=[message("carla", "Please fix the flaky checkout test.")],
            )
        )
        w = env.worker(r, "synthesizer")
        assert w.status == pb.WORKER_STATUS_WROTE
        [skill] = (
            await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana", view=sk_pb.SKILL_VIEW_FULL))
        ).skills
        assert skill.trigger == sk_pb.SKILL_TRIGGER_SINGLE and list(skill.source_turn_ids) == ["run-1"]
        # Issue 17: the draft names its turn, the person whose messages it rests on, model and prompt.
        prov = (
            await env.skills.GetSkillProvenance(
                sk_pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=skill.id)
            )
        ).provenance
        assert list(prov.turn_ids) == ["run-1"] and [s.handle for s in prov.subjects] == ["carla"]
        assert prov.model and prov.prompt_version and prov.writer == "synthesizer"
        assert list(skill.tool_sequence) == FIVE_TOOLS  # the run that happened
        [event] = await read_events(env.app.infra.pool, "skill_synthesized")
        assert event["turn_id"] == "run-1"


async def test_a_single_turn_skill_stamps_its_source_episode(env_for, clock):
    async with env_for() as env:
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS, ask="Fix the flaky checkout test"))
        assert env.worker(r, "synthesizer").status == pb.WORKER_STATUS_WROTE
        [skill] = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        got = await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-1"))
        assert got.episode.consolidated_into_skill_id == skill.id


async def test_a_stamp_that_waits_for_its_episode_is_retried_with_the_episodist(env_for, clock):
    """The synthesizer runs before the episodist here: its stamp finds no episode, so it is retried
    (not finished unstamped), and the retry stamps the skill the first attempt drafted, drafting
    nothing again."""
    async with env_for(learning={"reflection": {"workers": ["synthesizer", "episodist"]}}) as env:
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS, ask="Fix the flaky checkout test"))
        w = env.worker(r, "synthesizer")
        assert w.status == pb.WORKER_STATUS_RETRYING and w.failure.startswith("episode_pending")
        assert r.state == pb.REFLECTION_STATE_RETRYING
        clock.advance(seconds=60)
        await env.harness.drain()
        r = (
            await env.stub.GetReflection(pb.GetReflectionRequest(company="acme", seat="ana", turn_id="run-1"))
        ).reflection
        assert r.state == pb.REFLECTION_STATE_COMPLETED
        assert env.worker(r, "synthesizer").status == pb.WORKER_STATUS_WROTE
        [skill] = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        got = await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-1"))
        assert got.episode.consolidated_into_skill_id == skill.id


async def test_a_stamp_retried_after_its_skill_filled_the_catalogue_still_stamps_the_episode(env_for, clock):
    """The same retry when the first attempt's skill took the seat's last slot: the retry's gate is
    CATALOGUE_FULL (the cap is checked first), and it still finds its own skill (the gate names the
    duplicate under the cap too) and stamps the episode, drafting nothing again."""
    learning = {"reflection": {"workers": ["synthesizer", "episodist"]}, "skill_synthesis": {"max_skills_per_agent": 1}}
    async with env_for(learning=learning) as env:
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS, ask="Fix the flaky checkout test"))
        assert env.worker(r, "synthesizer").status == pb.WORKER_STATUS_RETRYING
        clock.advance(seconds=60)
        await env.harness.drain()
        r = (
            await env.stub.GetReflection(pb.GetReflectionRequest(company="acme", seat="ana", turn_id="run-1"))
        ).reflection
        w = env.worker(r, "synthesizer")
        assert (r.state, w.status) == (pb.REFLECTION_STATE_COMPLETED, pb.WORKER_STATUS_WROTE)
        assert "episode stamped" in w.written
        [skill] = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        got = await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-1"))
        assert got.episode.consolidated_into_skill_id == skill.id


async def test_an_archived_skill_is_learned_and_not_drafted_again(env_for, clock, scripted_openai):
    """Single-turn synthesis checks archived skills as the clustered pass does: a turn of an archived
    skill's procedure closes the gate before any model call (it used to be re-created under a new
    name)."""
    scripted_openai.chat_handler = draft_handler
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}}, providers=scripted(scripted_openai)
    ) as env:
        old = await env.skill("ship-fix", FIVE_TOOLS)
        await env.skills.ArchiveSkill(sk_pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=old.id))
        r = await env.reflect(turn("run-1", now=clock.now(), tools=list(reversed(FIVE_TOOLS))))
        w = env.worker(r, "synthesizer")
        assert (w.status, w.gate, w.detail) == (pb.WORKER_STATUS_SKIPPED, "duplicate", "duplicates ship-fix (archived)")
        assert scripted_openai.received("chat") == []
        # CreateSkill agrees with the gate: the archived skill's tools are taken.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.skill("ship-fix-again", FIVE_TOOLS)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_synthesis_needs_min_tool_calls_and_a_settled_turn(env_for, clock):
    async with env_for() as env:
        few = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS[:4]))
        assert env.worker(few, "synthesizer").gate == "below_min_tool_calls"
        mid = await env.reflect(turn("run-2", now=clock.now(), tools=FIVE_TOOLS, outcome=pb.TURN_OUTCOME_SELF_ITERATE))
        assert env.worker(mid, "synthesizer").gate == "unsettled"


def scripted(server):  # type: ignore[no-untyped-def]
    return {
        "llm": {"m": openai_provider(server, "m", timeout_seconds=1.0)},
        "auxiliary_chain": ["m"],
    }


def purposes(server) -> list[str]:  # type: ignore[no-untyped-def]
    """Which prompt each chat call carried (by its system prompt's opening words)."""
    return [body["messages"][0]["content"][:40] for body in server.received("chat")]


async def test_a_duplicate_tool_set_closes_the_gate_before_any_model_call(env_for, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: json.dumps({"noop": True, "classification": "NOOP"})
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}}, providers=scripted(scripted_openai)
    ) as env:
        await env.skill("ship-fix", list(reversed(FIVE_TOOLS)))  # same set, another order
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS))
        w = env.worker(r, "synthesizer")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "duplicate")
        assert scripted_openai.received("chat") == []


FINAL_A = ["run_tests", "github_create_pr"]
FINAL_B = ["jira_get_issue", "github_search"]


def draft_handler(body: dict) -> str:  # type: ignore[type-arg]
    n = len(body["messages"][1]["content"])
    return json.dumps({"decline": False, "name": f"fix-flaky-{n}", "summary": "fix a flaky test", "body": "# Fix\n1."})


async def test_a_turn_like_a_skills_source_is_refused_before_the_model_is_paid(env_for, clock, scripted_openai):
    """One definition of the turn's tool set on both sides: the second turn, identical to the one
    the skill was drafted from, closes the gate before any model call (it used to pay for a draft
    CreateSkill then refused, because the gate compared every call and the skill stored the final
    round)."""
    scripted_openai.chat_handler = draft_handler
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}}, providers=scripted(scripted_openai)
    ) as env:
        first = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS, final_round=FINAL_A))
        assert env.worker(first, "synthesizer").status == pb.WORKER_STATUS_WROTE
        [skill] = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        assert list(skill.tool_sequence) == FIVE_TOOLS  # the turn's run: every call, in order
        assert len(scripted_openai.received("chat")) == 1
        again = await env.reflect(turn("run-2", now=clock.now(), tools=FIVE_TOOLS, final_round=FINAL_A))
        w = env.worker(again, "synthesizer")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "duplicate")
        assert len(scripted_openai.received("chat")) == 1  # no second draft paid for


async def test_the_same_tools_with_another_final_round_are_the_same_procedure(env_for, clock, scripted_openai):
    """A turn that called the same tools as a skill's source, ending in another final round, is a
    duplicate (it used to pass both checks and become a second skill)."""
    scripted_openai.chat_handler = draft_handler
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}}, providers=scripted(scripted_openai)
    ) as env:
        await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS, final_round=FINAL_A))
        other = await env.reflect(turn("run-2", now=clock.now(), tools=list(reversed(FIVE_TOOLS)), final_round=FINAL_B))
        w = env.worker(other, "synthesizer")
        assert (w.status, w.gate) == (pb.WORKER_STATUS_SKIPPED, "duplicate")
        skills = (await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills
        assert len(skills) == 1
        assert len(scripted_openai.received("chat")) == 1


async def test_a_full_catalogue_closes_the_gate_before_any_model_call(env_for, clock, scripted_openai):
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}, "skill_synthesis": {"max_skills_per_agent": 1}},
        providers=scripted(scripted_openai),
    ) as env:
        await env.skill("only", ["x1", "x2"])
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS))
        assert env.worker(r, "synthesizer").gate == "catalogue_full"
        assert scripted_openai.received("chat") == []


@pytest.mark.parametrize("missing", ["name", "summary", "body"])
async def test_a_draft_with_a_gap_is_dropped(env_for, clock, scripted_openai, missing):
    draft = {"decline": False, "name": "fix-flaky", "summary": "fix a flaky test", "body": "# Fix\n1. Go"}
    draft[missing] = ""
    scripted_openai.chat_handler = lambda body: json.dumps(draft)
    async with env_for(
        learning={"reflection": {"workers": ["synthesizer"]}}, providers=scripted(scripted_openai)
    ) as env:
        r = await env.reflect(turn("run-1", now=clock.now(), tools=FIVE_TOOLS))
        w = env.worker(r, "synthesizer")
        assert w.status == pb.WORKER_STATUS_NOTHING and missing in w.detail
        assert list((await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana"))).skills) == []


# ------------------------------------------------------------------------------ refiner


async def test_the_refiner_appends_a_counter_example_after_a_failure(env_for, clock):
    async with env_for(learning={"reflection": {"workers": ["refiner"]}}) as env:
        s = await env.skill("deploy", ["build", "push", "deploy"])
        r = await env.reflect(
            turn(
                "run-1",
                now=clock.now(),
                outcome=pb.TURN_OUTCOME_FAILED,
                tools=["build", "push", "deploy"],
                offered=[(s.id, s.name)],
                label="Deploy request",
                what_it_did="Deploy failed: registry quota exceeded.",
                messages=[message("dave", "Deploy the release please.")],
            )
        )
        assert env.worker(r, "refiner").status == pb.WORKER_STATUS_WROTE
        got = (await env.skills.GetSkill(sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))).skill
        assert got.version == 2
        assert got.body.endswith(
            "## What practice added\n\n- Counter-example: Deploy request: Deploy failed: registry quota exceeded.\n"
        )
        # Issue 17: the bullet names its turn, the person, the model and prompt that wrote it.
        [bullet] = (
            await env.skills.GetSkillProvenance(
                sk_pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=s.id)
            )
        ).bullets
        assert bullet.version == 2 and list(bullet.provenance.turn_ids) == ["run-1"]
        assert [x.handle for x in bullet.provenance.subjects] == ["dave"]
        assert bullet.provenance.model and bullet.provenance.prompt_version and bullet.provenance.writer == "refiner"


async def test_noop_is_the_ordinary_answer_and_writes_nothing(env_for, clock):
    async with env_for(learning={"reflection": {"workers": ["refiner"]}}) as env:
        s = await env.skill("deploy", ["build", "push", "deploy"])
        r = await env.reflect(
            turn("run-1", now=clock.now(), tools=["build", "push", "deploy"], offered=[(s.id, s.name)])
        )
        assert env.worker(r, "refiner").status == pb.WORKER_STATUS_NOTHING
        got = (await env.skills.GetSkill(sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))).skill
        assert got.version == 1


async def test_an_invented_skill_name_is_dropped(env_for, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"noop": False, "skill": "deploy-v2", "observation": "check quotas first"}
    )
    async with env_for(learning={"reflection": {"workers": ["refiner"]}}, providers=scripted(scripted_openai)) as env:
        s = await env.skill("deploy", ["build", "push", "deploy"])
        r = await env.reflect(turn("run-1", now=clock.now(), outcome=pb.TURN_OUTCOME_FAILED, offered=[(s.id, s.name)]))
        w = env.worker(r, "refiner")
        assert w.status == pb.WORKER_STATUS_NOTHING and "invented" in w.detail
        assert (
            await env.skills.GetSkill(sk_pb.GetSkillRequest(company="acme", seat="ana", skill_id=s.id))
        ).skill.version == 1


async def test_one_call_over_the_whole_catalogue_and_archived_skills_cost_no_call(env_for, clock, scripted_openai):
    scripted_openai.chat_handler = lambda body: json.dumps({"noop": True})
    async with env_for(learning={"reflection": {"workers": ["refiner"]}}, providers=scripted(scripted_openai)) as env:
        a = await env.skill("alpha", ["a1", "a2"])
        b = await env.skill("beta", ["b1", "b2"])
        await env.reflect(turn("run-1", now=clock.now(), offered=[(a.id, a.name), (b.id, b.name)]))
        [call] = scripted_openai.received("chat")
        assert "### alpha" in call["messages"][1]["content"] and "### beta" in call["messages"][1]["content"]
        for s in (a, b):
            await env.skills.ArchiveSkill(sk_pb.ArchiveSkillRequest(company="acme", seat="ana", skill_id=s.id))
        scripted_openai.clear()
        r = await env.reflect(turn("run-2", now=clock.now(), offered=[(a.id, a.name), (b.id, b.name)]))
        assert env.worker(r, "refiner").status == pb.WORKER_STATUS_NOTHING
        assert scripted_openai.received("chat") == []


async def test_the_refiner_is_unbuilt_when_refinement_is_off(env_for, clock):
    async with env_for(learning={"skill_refinement": {"enabled": False}}) as env:
        s = await env.skill("deploy", ["build", "push"])
        r = await env.reflect(turn("run-1", now=clock.now(), offered=[(s.id, s.name)]))
        assert "refiner" not in [w.worker for w in r.workers]
    async with env_for(
        learning={"skill_refinement": {"auto_refine_on_success": False, "auto_refine_on_failure": False}}
    ) as env:
        r = await env.reflect(turn("run-2", now=clock.now(), offered=[(s.id, s.name)]))
        assert "refiner" not in [w.worker for w in r.workers]


# ------------------------------------------------------------------------------ isolation


async def test_one_worker_failing_costs_no_other_worker(env_for, clock, scripted_openai):
    """The persist decider's model call fails; every other worker (running beside it) still writes,
    and the turn is retried for the one that did not finish."""
    from tests.support.scripted_openai import Reply

    failed = []

    def fail_the_decider_once(body: dict) -> Reply | None:  # type: ignore[type-arg]
        if not failed and "what, if anything, an agent should remember" in body["messages"][0]["content"]:
            failed.append(body)
            return Reply(status=500)
        return None

    scripted_openai.rule("chat", fail_the_decider_once)
    scripted_openai.chat_handler = lambda body: json.dumps(
        {"noop": False, "communication_style": "brief", "topics": ["kafka"]}
    )
    async with env_for(providers=scripted(scripted_openai)) as env:
        r = await env.reflect(turn("run-1", now=clock.now(), messages=[message("bob", "I prefer brief notes.")]))
        statuses = {w.worker: w.status for w in r.workers}
        assert statuses["persist_decider"] == pb.WORKER_STATUS_RETRYING
        assert statuses["episodist"] == pb.WORKER_STATUS_WROTE
        assert statuses["profiler"] == pb.WORKER_STATUS_WROTE
        assert r.state == pb.REFLECTION_STATE_RETRYING
        [event] = await read_events(env.app.infra.pool, "reflection_retrying")
        assert event["payload"]["reason"].startswith("persist_decider: server_error")


# ------------------------------------------------------------------------------ provenance


async def test_every_sender_submit_turn_accepts_is_carried_whole_into_the_lessons_provenance(env_for, clock):
    """A one-letter GitHub login, a platform written "MS Teams", a coalesced trigger of 101 people:
    SubmitTurn takes them, and every write of the turn carries them in its provenance (none left
    out: an erasure finds her rows by it). The stricter ErasureSubject contract made the note, the
    skill and the episode fail as invalid (final), the reflection still COMPLETED: lost for good."""
    workers = ["persist_decider", "episodist", "synthesizer"]
    crowd = [message(f"user{i}", "I prefer tickets linked in every PR." if i == 0 else "+1") for i in range(101)]
    cases = [
        ("run-1", [message("q", "I prefer weekly digests over daily pings.", platform="github")], FIVE_TOOLS),
        (
            "run-2",
            [message("dana", "I prefer short standups on Mondays.", platform="MS Teams")],
            [*FIVE_TOOLS[1:], "jira_comment"],
        ),
        ("run-3", crowd, [*FIVE_TOOLS[:4], "slack_post"]),
    ]
    async with env_for(learning={"reflection": {"workers": workers}}) as env:
        for run_id, messages, tools in cases:
            r = await env.reflect(turn(run_id, now=clock.now(), tools=tools, messages=messages))
            people = sorted((m.sender.handle, m.sender.platform) for m in messages)
            assert r.state == pb.REFLECTION_STATE_COMPLETED
            for name in workers:
                assert env.worker(r, name).status == pb.WORKER_STATUS_WROTE, (run_id, env.worker(r, name))
            [note_id] = [w.split()[0].removeprefix("note:") for w in env.worker(r, "persist_decider").written]
            note = await d_grpc.DiaryServiceStub(env.app.channel).GetNoteProvenance(
                d_pb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=note_id)
            )
            assert sorted((s.handle, s.platform) for s in note.provenance.subjects) == people
            [skill_id] = [
                w.split()[0].removeprefix("skill:")
                for w in env.worker(r, "synthesizer").written
                if w.startswith("skill:")
            ]
            skill = await env.skills.GetSkillProvenance(
                sk_pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=skill_id)
            )
            assert sorted((s.handle, s.platform) for s in skill.provenance.subjects) == people
            episode = (
                await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=run_id))
            ).episode
            told = await env.episodes.GetEpisodeProvenance(
                ep_pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=episode.id)
            )
            assert sorted((s.handle, s.platform) for s in told.provenance.subjects) == people
