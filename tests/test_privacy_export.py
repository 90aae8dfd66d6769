"""ExportSeat holds what the system keeps of a seat's work (issue 17, data portability): besides its
notes, episodes, profiles and skills, where each of them came from (its owner's Get*Provenance
answer, a line of its own), the seat's sessions, their learning checks (the receipts), and the
provenance of the workspace lessons those checks wrote, narrowed to the seat's own sessions (a
lesson another seat's session taught too keeps that session out of this seat's export). Real
services on loopback, real Postgres and embedder; the review is a scripted model over real HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.common.v1 import provenance_pb2
from agentlearn.diary.v1 import diary_service_pb2 as d_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as d_grpc
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pr_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.sessions.v1 import session_service_pb2_grpc as ss_grpc
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from tests.support.sessions import SERVICES, review_rule, run_check
from tests.support.skills import skill_request
from tests.support.turns import raw_episode

pytestmark = pytest.mark.timeout(300)

SHARED = "Run make migrate before the payments tests: the test database needs the current schema."
HERS = "Pin the billing fixtures to the 2026 price list before running the billing suite."
ROLES = {"swe": {"workspaces": ["payments"]}}
NAMES = [*SERVICES, "episodes", "profiles", "reflector", "telemetry", "privacy"]


def _lessons(prompt: str) -> list[str]:
    """Each session's lessons: the shared one, and ana's own where the billing suite ran."""
    return [SHARED] + ([HERS] if "billing" in prompt else [])


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _export(channel: Any, seat: str, metadata: tuple[tuple[str, str], ...] = ()) -> list[dict[str, Any]]:
    request = pv.ExportSeatRequest(company="acme", seat=seat)
    stub = pv_grpc.PrivacyServiceStub(channel)
    return [json.loads(line) async for chunk in stub.ExportSeat(request, metadata=metadata) for line in chunk.lines]


def _of(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line[kind] for line in lines if line["kind"] == kind]


async def test_an_export_holds_the_seats_provenance_sessions_checks_and_its_share_of_lessons(reviewed, local_embedder):
    companies = {"acme": {"roles": ROLES}}
    async with reviewed(
        review_rule(lessons=_lessons), companies=companies, embedder=local_embedder, names=NAMES
    ) as env:
        channel = env.app.channel
        carla = er.ErasureSubject(handle="carla", platform="slack")
        provenance = provenance_pb2.Provenance(turn_ids=["run-1"], subjects=[carla], writer="persist_decider")
        note = await d_grpc.DiaryServiceStub(channel).WriteNote(
            d_pb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Carla wants the billing export as a CSV file.",
                tier=d_pb.NOTE_TIER_LONG,
                source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
                turn_id="run-1",
                provenance=provenance,
            )
        )
        end = env.app.infra.clock.now()
        episode = await ep_grpc.EpisodeServiceStub(channel).RecordEpisode(
            raw_episode("ana", "run-1", end, "Billing export", "", "Sent the CSV.", ["sql_query"], senders=[carla])
        )
        profile = await pr_grpc.ProfileServiceStub(channel).UpsertProfile(
            pr_pb.UpsertProfileRequest(
                company="acme",
                observer="ana",
                subject=pr_pb.Subject(handle="carla", platform="slack"),
                topics=["billing"],
                turn_id="run-1",
                provenance=provenance,
            )
        )
        skill = await sk_grpc.SkillServiceStub(channel).CreateSkill(
            skill_request("ana", "csv-export", "use for CSV exports", "# CSV\n\n1. Export.\n", ["sql_query"], ["run-1"])
        )
        # Ana's session teaches the shared lesson and her own; ben's (another user) the shared one.
        await run_check(env, "s-ana", user_name="carla", said="The billing tests keep failing on CI.")
        env.seat = "ben"
        await run_check(env, "s-ben", user_name="dave", said="The payments tests keep failing on CI.")
        ana = await _export(channel, "ana")
        ben = await _export(channel, "ben")

    # Each exported row is followed by where it came from, named by its id.
    assert [n["id"] for n in _of(ana, "note")] == [note.note.id]
    [np] = _of(ana, "note_provenance")
    assert np["note_id"] == note.note.id and np["provenance"]["turn_ids"] == ["run-1"]
    assert np["provenance"]["subjects"][0]["handle"] == "carla"
    [epv] = _of(ana, "episode_provenance")
    assert epv["episode_id"] == episode.episode.id and epv["provenance"]["turn_ids"] == ["run-1"]
    [ppv] = _of(ana, "profile_provenance")
    assert ppv["profile_id"] == profile.profile.id and ppv["observations"]
    [spv] = _of(ana, "skill_provenance")
    assert spv["skill_id"] == skill.skill.id and spv["provenance"]["turn_ids"] == ["run-1"]

    # The seat's sessions and their checks, and no other seat's.
    assert [(s["session_id"], s["user"]) for s in _of(ana, "session")] == [("s-ana", "carla")]
    [check] = _of(ana, "learning_check")
    assert check["session_id"] == "s-ana" and check["state"] == "CHECK_STATE_COMPLETED"
    pages = {o["id"] for o in check["outputs"] if o["kind"] == "OUTPUT_KIND_PROJECT_LESSON"}
    assert len(pages) == 2
    # Each lesson its checks wrote, with this session's sources only: the shared lesson's other
    # source (ben's session, dave's) is not ana's to export.
    lessons = _of(ana, "lesson_provenance")
    assert {p["page_id"] for p in lessons} == pages
    assert all({s["session_id"] for s in p["sources"]} == {"s-ana"} for p in lessons)
    assert "s-ben" not in json.dumps(ana) and "dave" not in json.dumps(ana)

    assert [s["session_id"] for s in _of(ben, "session")] == ["s-ben"]
    assert [c["session_id"] for c in _of(ben, "learning_check")] == ["s-ben"]
    [shared] = _of(ben, "lesson_provenance")  # the shared lesson only
    assert shared["page_id"] in pages and [s["session_id"] for s in shared["sources"]] == ["s-ben"]
    assert "s-ana" not in json.dumps(ben) and "carla" not in json.dumps(ben)
    assert not {"note", "episode", "profile", "skill"} & {line["kind"] for line in ben}


class _Bearer(grpc.aio.UnaryUnaryClientInterceptor):
    """Every unary call of a channel made with a token's credential."""

    def __init__(self, token: str):
        self._metadata = _bearer(token)

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(details._replace(metadata=self._metadata), request)


async def test_a_token_bound_to_a_seat_and_a_user_exports_that_users_sessions_checks_and_lessons_only(
    reviewed, local_embedder
):
    """The sessions service shows a token bound to seat ana and user ann only ann's sessions; the
    export, which reads them with the privacy service's own credential, shows it no more: not bob's
    session on the same seat, nor its checks, nor its sources of the lesson both sessions taught.
    The seat's own rows (its notes) are the seat's, listed to that token, and exported to it."""
    companies = {"acme": {"roles": ROLES}}
    async with reviewed(
        review_rule(lessons=[SHARED]), companies=companies, embedder=local_embedder, names=NAMES, auth_mode="tokens"
    ) as env:
        tokens = env.app.infra.tokens
        acme, _ = await tokens.issue("acme", ["admin"])
        ann, _ = await tokens.issue("acme", ["admin"], seat="ana", user="ann")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{env.app.port}", interceptors=[_Bearer(acme)])
        try:
            admin = dataclasses.replace(env, stub=ss_grpc.SessionServiceStub(channel))
            note = await d_grpc.DiaryServiceStub(channel).WriteNote(
                d_pb.WriteNoteRequest(
                    company="acme",
                    seat="ana",
                    content="The seat's CI runner is the large one.",
                    tier=d_pb.NOTE_TIER_LONG,
                    source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
                    turn_id="run-1",
                )
            )
            await run_check(admin, "s-ann", user_name="ann")
            await run_check(admin, "s-bob", user_name="bob")
            shown = await ss_grpc.SessionServiceStub(env.app.channel).ListSessions(
                ss_pb.ListSessionsRequest(company="acme", seat="ana"), metadata=_bearer(ann)
            )
            lines = await _export(env.app.channel, "ana", _bearer(ann))
            whole = await _export(env.app.channel, "ana", _bearer(acme))
        finally:
            await channel.close()

    assert [s.user for s in shown.sessions] == ["ann"]
    assert [(s["session_id"], s["user"]) for s in _of(lines, "session")] == [("s-ann", "ann")]
    assert [c["session_id"] for c in _of(lines, "learning_check")] == ["s-ann"]
    [lesson] = _of(lines, "lesson_provenance")
    assert lesson["session_id"] == "s-ann" and {s["session_id"] for s in lesson["sources"]} == {"s-ann"}
    assert "s-bob" not in json.dumps(lines) and "bob" not in json.dumps(lines)
    assert [n["id"] for n in _of(lines, "note")] == [note.note.id]
    # The company's token exports both users' sessions, each with its own share of the lesson.
    assert sorted(s["session_id"] for s in _of(whole, "session")) == ["s-ann", "s-bob"]
    assert sorted(p["session_id"] for p in _of(whole, "lesson_provenance")) == ["s-ann", "s-bob"]


async def test_each_lesson_is_read_once_per_export_and_split_across_the_seats_sessions(
    reviewed, local_embedder, monkeypatch
):
    """Two sessions of the seat teach the same two lessons: the export reads each lesson's
    provenance once (not once per session: N sessions of a common lesson were N reads of N sources)
    and still gives each session its own line with its own sources."""
    from services.sessions import servicer

    read: list[str] = []
    real = servicer.lesson_provenance

    async def counted(store, company, page_id):  # type: ignore[no-untyped-def]
        read.append(page_id)
        return await real(store, company, page_id)

    monkeypatch.setattr(servicer, "lesson_provenance", counted)
    companies = {"acme": {"roles": ROLES}}
    async with reviewed(
        review_rule(lessons=[SHARED, HERS]), companies=companies, embedder=local_embedder, names=NAMES
    ) as env:
        await run_check(env, "s-1", user_name="carla")
        await run_check(env, "s-2", user_name="dave")
        lines = await _export(env.app.channel, "ana")

    lessons = _of(lines, "lesson_provenance")
    assert len(read) == len(set(read)) == 2  # each lesson read once
    assert sorted((p["page_id"], p["session_id"]) for p in lessons) == sorted(
        (page, session) for page in set(read) for session in ("s-1", "s-2")
    )
    assert all([s["session_id"] for s in p["sources"]] == [p["session_id"]] for p in lessons)


async def test_provenance_reads_run_a_few_at_a_time_in_order_and_the_first_failure_ends_them_all():
    """A page's provenance reads run together, at most ``CONCURRENCY`` in flight, their answers in
    the rows' order however they finish; a read that fails cancels the others and its own error (the
    owner's status) is what ends the export."""
    from services.privacy.export import CONCURRENCY, _bounded

    in_flight, peak = 0, 0

    def read(i: int):  # type: ignore[no-untyped-def]
        async def call() -> int:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            for _ in range(30 - i):  # the later rows finish first
                await asyncio.sleep(0)
            in_flight -= 1
            return i

        return call

    assert await _bounded([read(i) for i in range(30)]) == list(range(30))
    assert peak == CONCURRENCY

    refusal = grpc.aio.AioRpcError(grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata())
    never = asyncio.Event()
    cancelled: list[int] = []

    def waits(i: int):  # type: ignore[no-untyped-def]
        async def call() -> int:
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(i)
                raise
            return i

        return call

    async def fails() -> int:
        raise refusal

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _bounded([waits(0), waits(1), fails, waits(3), waits(4)])
    assert raised.value is refusal
    assert sorted(cancelled) == [0, 1, 3, 4]
