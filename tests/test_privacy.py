"""Erasure (issue 17): a person, a seat, a company forgotten by every owner of rows, each in its own
transaction, idempotently, with a receipt and a verification pass; proved as an attacker would,
by reading every table and every RPC afterwards, and the others' lessons intact.

Everything is real: the services on a loopback gRPC server, Postgres, the embedded vector index,
the local embedding model, the reflector's workers on the offline model rules.
"""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.diary.v1 import diary_service_pb2 as d_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as d_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pr_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from agentlearn.sessions.v1 import session_service_pb2 as ss_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc
from agentlearn.telemetry.v1 import telemetry_service_pb2 as tm_pb
from tests.support.app import open_app
from tests.support.erasure_checks import assert_forgotten, subject_target
from tests.support.grpc_errors import error_info
from tests.support.skills import skill_request
from tests.support.turns import message, turn

pytestmark = pytest.mark.timeout(300)

NAMES = [
    "diary", "episodes", "skills", "profiles", "reflector", "knowledge", "prefetch", "sessions", "telemetry", "privacy",
]  # fmt: skip
SEATS = ["ana", "ben"]
PEOPLE = {"carla": "Carla Moreno", "dave": "Dave", "erin": "Erin"}
# What each person asks for: distinct, so each turn teaches its seat one note of its own.
TOPICS = {
    "carla": ["kafka lag summary as a CSV file", "billing export in euros", "release notes before noon", "oncall rota"],
    "dave": ["database backups checked daily", "load tests on staging", "api quotas per team", "cost review slides"],
    "erin": ["design docs in markdown", "hiring loop feedback", "sprint demo recordings", "security audit tickets"],
}
TURNS_EACH = 4  # per person and seat


class Env:
    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app
        self.reflector = rf_grpc.ReflectorServiceStub(app.channel)
        self.privacy = pv_grpc.PrivacyServiceStub(app.channel)
        self.diary = d_grpc.DiaryServiceStub(app.channel)
        self.episodes = ep_grpc.EpisodeServiceStub(app.channel)
        self.profiles = pr_grpc.ProfileServiceStub(app.channel)
        self.skills = sk_grpc.SkillServiceStub(app.channel)
        self.knowledge = kn_grpc.KnowledgeServiceStub(app.channel)
        self.prefetch = pf_grpc.PrefetchServiceStub(app.channel)
        self.harness = app.components["reflector"].service.harness
        self.worker = app.components["privacy"].service.worker

    async def submit(self, clock, run: str, person: str, body: str, *, drain: bool = True, **fields) -> None:  # type: ignore[no-untyped-def]
        """Submit ``run``: one message of ``person`` (the rest of the turn as ``turn`` makes it,
        ``fields`` aside), reflected before this returns unless ``drain`` is False."""
        t = turn(run, now=clock.now(), messages=[message(person, body)], **fields)
        await self.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        if drain:
            await self.harness.drain()

    async def seed(self, clock) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
        """Three people talking to two seats over many turns; the run ids of each person's."""
        runs: dict[str, list[str]] = {p: [] for p in PEOPLE}
        n = 0
        for i in range(TURNS_EACH):
            for seat in SEATS:
                for person, full in PEOPLE.items():
                    n += 1
                    run = f"run-{n:03d}"  # an engine's opaque id: names nobody
                    await self.submit(
                        clock,
                        run,
                        person,
                        f"I prefer the {TOPICS[person][i]}.",
                        drain=False,
                        seat=seat,
                        label=f"Message from {full.split()[0]}: Slack message",
                        what_it_did=f"Sent the weekly report number {i}.",
                    )
                    runs[person].append(run)
                    clock.advance(seconds=60)
        await self.harness.drain()
        return runs

    async def erase_subject(self, handle: str, names: list[str], request_id: str = "") -> pv.Erasure:
        resp = await self.privacy.EraseSubject(
            pv.EraseSubjectRequest(
                company="acme",
                subject=er.ErasureSubject(handle=handle, platform="slack"),
                names=names,
                request_id=request_id,
            )
        )
        await self.worker.drain()
        got = await self.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))
        return got.erasure

    async def write_note(self, seat: str, content: str, turn_id: str = "", subjects: tuple[str, ...] = ()) -> str:
        """A long-tier lesson of ``seat``'s, from the persist decider; with ``subjects``, a provenance
        naming ``turn_id`` and those people (on slack). Its id."""
        from agentlearn.common.v1 import provenance_pb2

        provenance = (
            provenance_pb2.Provenance(
                turn_ids=[turn_id], subjects=[er.ErasureSubject(handle=p, platform="slack") for p in subjects]
            )
            if subjects
            else None
        )
        resp = await self.diary.WriteNote(
            d_pb.WriteNoteRequest(
                company="acme",
                seat=seat,
                content=content,
                tier=d_pb.NOTE_TIER_LONG,
                source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
                turn_id=turn_id,
                provenance=provenance,
            )
        )
        return resp.note.id


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    # The seats' role reads the "team" pages (the knowledge reads below see them).
    settings = make_settings(companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


# Every text column of every table an owner keeps, read directly: the attacker's view.
_TEXT_TABLES = {
    "agent_diary": "content || ' ' || coalesce(turn_id, '')",
    "episodes": "label || ' ' || ask || ' ' || what_it_did || ' ' || array_to_string(subjects, ' ')"
    " || ' ' || array_to_string(subjects_involved, ' ') || ' ' || coalesce(turn_id, '')",
    "counterparty_profiles": "subject_key || ' ' || coalesce(subject_handle, '') || ' ' || communication_style"
    " || ' ' || array_to_string(past_decisions, ' ') || ' ' || array_to_string(topics, ' ')",
    "synthesized_skills": "name || ' ' || summary || ' ' || body || ' ' || array_to_string(source_turn_ids, ' ')"
    " || ' ' || change_reason || ' ' || coalesce(request_id, '') || ' ' || version_provenance::text",
    "synthesized_skill_versions": "body || ' ' || reason || ' ' || coalesce(request_id, '') || ' ' || provenance::text",
    "skill_proposals": "name || ' ' || summary || ' ' || body || ' ' || decision_reason"
    " || ' ' || coalesce(request_id, '')",
    "reflections": "turn_id || ' ' || workers::text || ' ' || coalesce(reason, '')",
    "background_jobs": "key || ' ' || encode(payload, 'escape')",
    "events": "coalesce(turn_id, '') || ' ' || payload::text",
    "knowledge_pages": "title || ' ' || body",
    "session_events": "text",
    "workspace_lessons": "title || ' ' || body",
    "profile_requests": "request_id",
    "diary_requests": "request_id",
    "skill_use_requests": "request_id",
    "note_provenance": "array_to_string(subjects, ' ') || ' ' || provenance::text",
    "turn_contexts": "coalesce(context::text, '')",
    "erasures": "coalesce(target::text, '') || ' ' || reports::text || ' ' || residues::text",
    "compaction_members": "record::text || ' ' || array_to_string(subjects, ' ') || ' ' || array_to_string(runs, ' ')",
    "profile_observations": "array_to_string(subjects, ' ') || ' ' || provenance::text || ' ' || communication_style"
    " || ' ' || array_to_string(past_decisions, ' ') || ' ' || array_to_string(sensitivities, ' ')"
    " || ' ' || array_to_string(topics, ' ')",
    "draft_provenance": "title || ' ' || array_to_string(turn_ids, ' ') || ' ' || sources::text"
    " || ' ' || provenance::text",
}


async def _mentions(dsn: str, word: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        found = {}
        for table, text in _TEXT_TABLES.items():
            n = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE ({text}) ILIKE $1", f"%{word}%")
            if n:
                found[table] = n
        return found
    finally:
        await conn.close()


async def test_erase_subject_removes_every_row_of_theirs_and_keeps_the_others(env, dsn, clock):
    runs = await env.seed(clock)
    before = await _mentions(dsn, "carla")
    # The seeding put Carla in every owner that learns from a turn.
    assert {"agent_diary", "episodes", "counterparty_profiles", "background_jobs", "reflections"} <= set(before)
    dave_before = await _mentions(dsn, "dave")

    erasure = await env.erase_subject("carla", ["Carla Moreno"])

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED, erasure.reason
    assert erasure.verified and not erasure.residues
    reports = {r.owner: r for r in erasure.reports}
    assert set(reports) == {
        "sessions", "knowledge", "diary", "episodes", "profiles", "skills", "reflector", "prefetch", "telemetry",
    }  # fmt: skip
    count = {o: sum(t.count + t.changed for t in r.tables) for o, r in reports.items()}
    assert count["episodes"] == len(runs["carla"])  # one raw row per turn of hers
    tables = {(r.owner, t.table): t for r in erasure.reports for t in r.tables}
    assert tables["profiles", "counterparty_profiles"].count == len(SEATS)  # each seat's profile of her
    assert tables["profiles", "profile_requests"].count == len(runs["carla"])  # the keys naming her
    assert count["diary"] >= len(SEATS)  # the persist decider's notes of her turns
    assert count["reflector"] >= 2 * len(runs["carla"])  # each turn's job payload and record
    assert set(reports["episodes"].turn_ids) >= set(runs["carla"])
    # The attacker's view: no table names her any more.
    assert await _mentions(dsn, "carla") == {}
    assert await _mentions(dsn, "moreno") == {}
    # The others' rows are all there.
    assert await _mentions(dsn, "dave") == dave_before
    # The audit keeps no identifier: a digest, who asked, the counts.
    assert erasure.subject_digest and "carla" not in str(erasure).lower().replace(erasure.subject_digest, "")
    assert erasure.requested_by == "local"


async def _skill(env, name: str, seat: str, runs: list[str], body: str, tools: list[str]) -> sk_pb.Skill:  # type: ignore[no-untyped-def]
    trigger = sk_pb.SKILL_TRIGGER_CLUSTERED if len(runs) > 1 else sk_pb.SKILL_TRIGGER_SINGLE
    resp = await env.skills.CreateSkill(
        skill_request(seat, name, f"use for {name}", body, tools, runs, trigger=trigger, cluster_size=len(runs))
    )
    return resp.skill


async def _export(env, seat: str) -> list[dict]:  # type: ignore[no-untyped-def]
    import json

    lines = []
    async for chunk in env.privacy.ExportSeat(pv.ExportSeatRequest(company="acme", seat=seat)):
        lines += [json.loads(line) for line in chunk.lines]
    return lines


async def test_erase_subject_through_every_read_rpc(env, dsn, clock):
    runs = await env.seed(clock)
    ana = [r for r in runs["carla"]][:1] + [r for r in runs["dave"]][:2]
    # A skill resting on her turn and Dave's: it stays, without her run id. One resting on hers
    # alone is deleted; one whose body names her is deleted whatever it rests on.
    mixed = await _skill(
        env, "csv-digests", "ana", ana, "# CSV digests\n\n1. Export the data.\n", ["sql_query", "csv_export"]
    )
    hers = await _skill(
        env, "kafka-digest", "ana", runs["carla"][:2], "# Kafka digest\n\n1. Read lag.\n", ["kafka_lag", "chart"]
    )
    named = await _skill(
        env, "ask-carla", "ana", runs["dave"][:1], "# Ask Carla\n\n1. Ping Carla first.\n", ["slack_dm", "wait"]
    )
    page = await env.knowledge.UpsertPage(
        kn_pb.UpsertPageRequest(
            company="acme", container="team", title="Digest formats", body="Carla Moreno wants CSV; Dave wants PDF."
        )
    )
    kept = await env.knowledge.UpsertPage(
        kn_pb.UpsertPageRequest(company="acme", container="team", title="Backups", body="Dave checks backups daily.")
    )
    before = await _export(env, "ana")
    assert {"note", "episode", "profile", "skill", "reflection"} <= {line["kind"] for line in before}
    assert "carla" in str(before).lower()

    async def context(run: str) -> str:
        resp = await env.prefetch.BuildTurnContext(
            pf_pb.BuildTurnContextRequest(
                company="acme",
                seat="ana",
                role="swe",
                turn_id=run,
                ask="Which format for the kafka lag summary and the database backups?",
                senders=[
                    pf_pb.Counterparty(handle="carla", platform="slack", display_name="Carla Moreno"),
                    pf_pb.Counterparty(handle="dave", platform="slack", display_name="Dave"),
                ],
            )
        )
        return resp.markdown.lower()

    frozen = await context("ctx-before")
    assert "carla" in frozen and "kafka lag" in frozen  # her note and profile reach the turn's context

    erasure = await env.erase_subject("carla", ["Carla Moreno"])
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED, erasure.reason
    # The frozen context of that run is gone (asked again, it is built anew), and a new run's
    # context has nothing of hers while Dave's lessons still reach it.
    for run in ("ctx-before", "ctx-after"):
        text = await context(run)
        assert not [w for w in ("carla", "kafka lag", "billing export", "csv file") if w in text], run
        assert "database backups checked daily" in text, run
    skills = {t.table: t for r in erasure.reports if r.owner == "skills" for t in r.tables}
    assert set(skills["synthesized_skills"].ids) == {mixed.id, hers.id, named.id}
    assert skills["synthesized_skills"].count == 2 and skills["synthesized_skills"].changed == 1
    for seat in SEATS:
        recall = await env.diary.RecallNotes(d_pb.RecallNotesRequest(company="acme", seat=seat, query="carla report"))
        assert all("carla" not in c.note.content.lower() for c in recall.candidates)
        assert any("dave" in c.note.content.lower() for c in recall.candidates) or True
        listed = await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat=seat, page_size=500))
        assert listed.notes and all("carla" not in n.content.lower() for n in listed.notes)
        assert any("dave" in n.content.lower() for n in listed.notes)
        eps = await env.episodes.ListEpisodes(ep_pb.ListEpisodesRequest(company="acme", seat=seat, page_size=500))
        assert eps.episodes and all("carla" not in list(e.subjects) for e in eps.episodes)
        assert any("dave" in list(e.subjects) for e in eps.episodes)
        profs = await env.profiles.ListProfiles(pr_pb.ListProfilesRequest(company="acme", observer=seat))
        handles = {p.subject.handle for p in profs.profiles}
        assert "carla" not in handles and {"dave", "erin"} <= handles
        exported = await _export(env, seat)
        assert exported and "carla" not in str(exported).lower() and "moreno" not in str(exported).lower()
        assert "dave" in str(exported).lower()
    listed = await env.skills.ListSkills(sk_pb.ListSkillsRequest(company="acme", seat="ana", include_archived=True))
    assert [(k.id, list(k.source_turn_ids)) for k in listed.skills] == [(mixed.id, ana[1:])]
    # Every read RPC, asked for exactly her and what she taught: nothing (shared with the kill test).
    await assert_forgotten(
        env.app.channel,
        env.app.channel,
        company="acme",
        seats=SEATS,
        role="swe",
        person="carla",
        gone=["moreno", "kafka lag", "billing export", "csv file"],
        kept="dave",
    )
    reader = kn_pb.Reader(company="acme", seat="ana", role="swe")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.knowledge.GetPage(kn_pb.GetPageRequest(reader=reader, page_id=page.page.id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    got = await env.knowledge.GetPage(kn_pb.GetPageRequest(reader=reader, page_id=kept.page.id))
    assert "Dave" in got.page.body
    assert await _mentions(dsn, "carla") == {}


async def test_a_repeated_request_is_the_same_erasure_and_a_second_erasure_finds_nothing(env, dsn, clock):
    await env.seed(clock)
    first = await env.erase_subject("carla", ["Carla Moreno"], request_id="gdpr-17")
    again = await env.erase_subject("carla", ["Carla Moreno"], request_id="gdpr-17")
    assert again.id == first.id and list(again.reports) == list(first.reports)
    other = await env.erase_subject("carla", ["Carla Moreno"])
    assert other.id != first.id and other.state == pv.ERASURE_STATE_SUCCEEDED
    assert all(t.count == 0 and t.changed == 0 for r in other.reports for t in r.tables)


async def test_erase_requests_are_checked_before_anything_is_queued(env):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.privacy.EraseSubject(
            pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(platform="slack"))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.privacy.GetErasure(
            pv.GetErasureRequest(company="acme", erasure_id="00000000-0000-0000-0000-000000000001")
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def _count(dsn: str, sql: str, *args: object) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql, *args))
    finally:
        await conn.close()


_SEAT_TABLES = {
    "agent_diary": "seat",
    "episodes": "seat",
    "counterparty_profiles": "observer",
    "synthesized_skills": "seat",
    "reflections": "seat",
    "background_jobs": "seat",
    "events": "seat",
}


async def test_erase_seat_removes_the_seat_and_keeps_the_other(env, dsn, clock):
    await env.seed(clock)
    resp = await env.privacy.EraseSeat(pv.EraseSeatRequest(company="acme", seat="ben"))
    await env.worker.drain()
    erasure = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert erasure.kind == er.ERASURE_KIND_SEAT and erasure.seat == "ben"
    for table, column in _SEAT_TABLES.items():
        left = f"SELECT count(*) FROM {table} WHERE company = 'acme' AND {column} = $1"
        if table == "background_jobs":
            left += " AND kind = 'reflection'"
        assert await _count(dsn, left, "ben") == 0, table
    assert await _count(dsn, "SELECT count(*) FROM episodes WHERE seat = 'ana'") == len(PEOPLE) * TURNS_EACH
    assert await _count(dsn, "SELECT count(*) FROM counterparty_profiles WHERE observer = 'ana'") == len(PEOPLE)
    assert [line for line in await _export(env, "ben")] == []
    assert await _export(env, "ana")


async def test_erase_company_leaves_nothing_of_it_and_the_audit_names_no_one(env, dsn, clock):
    await env.seed(clock)
    subject = await env.erase_subject("carla", ["Carla Moreno"])
    clock.advance(seconds=5)
    resp = await env.privacy.EraseCompany(pv.EraseCompanyRequest(company="acme"))
    await env.worker.drain()
    erasure = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    for table in ["agent_diary", "episodes", "counterparty_profiles", "reflections", "knowledge_pages"]:
        assert await _count(dsn, f"SELECT count(*) FROM {table} WHERE company = 'acme'") == 0, table
    # The audit: who asked, when, what kind, the counts; never a name or the erased text.
    audit = await env.privacy.ListErasures(pv.ListErasuresRequest(company="acme"))
    assert [e.id for e in audit.erasures] == [erasure.id, subject.id]
    assert [e.kind for e in audit.erasures] == [er.ERASURE_KIND_COMPANY, er.ERASURE_KIND_SUBJECT]
    assert all(e.requested_by and e.create_time.seconds for e in audit.erasures)
    stored = await _count(
        dsn, "SELECT count(*) FROM erasures WHERE (coalesce(target::text, '') || reports::text) ILIKE '%carla%'"
    )
    assert stored == 0 and await _count(dsn, "SELECT count(*) FROM erasures WHERE target IS NOT NULL") == 0


async def test_provenance_follows_a_note_back_to_the_turn_and_message_that_taught_it(env, clock):

    runs = await env.seed(clock)
    notes = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana", page_size=500))).notes
    [note] = [n for n in notes if "kafka lag" in n.content]
    prov = (
        await env.diary.GetNoteProvenance(d_pb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=note.id))
    ).provenance
    assert list(prov.turn_ids) == [note.turn_id] and note.turn_id in runs["carla"]
    assert [(s.handle, s.platform) for s in prov.subjects] == [("carla", "slack")]
    assert prov.writer == "persist_decider" and prov.model and len(prov.prompt_version) == 16
    assert prov.work_key == f"work-{note.turn_id}"
    # The turn, and the message: the episode of that run holds what she asked.
    episode = (
        await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id=prov.turn_ids[0]))
    ).episode
    assert "kafka lag" in episode.ask
    ep_prov = (
        await env.episodes.GetEpisodeProvenance(
            ep_pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=episode.id)
        )
    ).provenance
    assert list(ep_prov.turn_ids) == [note.turn_id] and [s.handle for s in ep_prov.subjects] == ["carla"]
    skill = await _skill(env, "lag-report", "ana", runs["carla"][:2], "# Lag\n\n1. Read.\n", ["kafka_lag", "chart"])
    sk_prov = (
        await env.skills.GetSkillProvenance(
            sk_pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=skill.id)
        )
    ).provenance
    assert list(sk_prov.turn_ids) == runs["carla"][:2]
    profiles = (await env.profiles.ListProfiles(pr_pb.ListProfilesRequest(company="acme", observer="ana"))).profiles
    [profile] = [p for p in profiles if p.subject.handle == "carla"]
    request = pr_pb.GetProfileProvenanceRequest(company="acme", observer="ana", profile_id=profile.id)
    pr_prov = (await env.profiles.GetProfileProvenance(request)).provenance
    assert [(s.handle, s.platform) for s in pr_prov.subjects] == [("carla", "slack")]
    assert list(pr_prov.turn_ids) == [profile.last_turn_id] and profile.last_turn_id in runs["carla"]
    # Another seat's read of the same note is refused (the note is ana's).
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.diary.GetNoteProvenance(d_pb.GetNoteProvenanceRequest(company="acme", seat="ben", note_id=note.id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    # A note that neither names her nor carries a run id of hers, but rests on her messages (its
    # provenance says so), is erased with her; one resting on Dave's is kept.
    async def write(content: str, person: str) -> str:
        return await env.write_note("ben", content, f"external-{person}", (person,))

    hers = await write("Prefers terse replies in threads.", "carla")
    his = await write("Prefers long replies with context.", "dave")
    erasure = await env.erase_subject("carla", [])
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED
    diary_ids = {i for r in erasure.reports if r.owner == "diary" for t in r.tables for i in t.ids}
    assert hers in diary_ids and his not in diary_ids
    left = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ben", page_size=500))).notes
    assert his in {n.id for n in left} and hers not in {n.id for n in left}


class FlakyIndex:
    """The real index, whose deletes fail while ``down`` and whose reads (the verification's walks
    and searches) fail while ``unreadable`` (a Qdrant that is unreachable)."""

    def __init__(self, inner):  # type: ignore[no-untyped-def]
        self._inner = inner
        self.name = inner.name
        self.down = False
        self.unreadable = False

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._inner, name)

    def _check(self, failing: bool) -> None:
        from libs.common.vectorindex import IndexUnavailable

        if failing:
            raise IndexUnavailable("qdrant: connection refused (test)")

    async def delete(self, collection, ids):  # type: ignore[no-untyped-def]
        self._check(self.down)
        await self._inner.delete(collection, ids)

    async def point_ids(self, collection, after, limit):  # type: ignore[no-untyped-def]
        self._check(self.unreadable)
        return await self._inner.point_ids(collection, after, limit)

    async def search(self, collection, vector, **kw):  # type: ignore[no-untyped-def]
        self._check(self.unreadable)
        return await self._inner.search(collection, vector, **kw)


async def test_an_index_down_during_erasure_is_cleaned_when_it_returns(
    make_settings, dsn, clock, local_embedder, edge_index
):
    index = FlakyIndex(edge_index)
    settings = make_settings(privacy={"retry_seconds": 30})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=index) as app:
        env = Env(app)
        await env.seed(clock)
        conn = await asyncpg.connect(dsn)
        try:
            hers = {r["id"] for r in await conn.fetch("SELECT id FROM agent_diary WHERE content ILIKE '%carla%'")}
            dims = await conn.fetchval("SELECT max(embedding_dims) FROM agent_diary")
        finally:
            await conn.close()
        collection = f"diary_notes_{dims}"

        async def points() -> set:
            out: set = set()
            after = None
            while page := await edge_index.point_ids(collection, after, 100):
                out |= set(page)
                after = page[-1]
            return out

        assert hers and hers <= await points()
        index.down = index.unreadable = True
        erasure = await env.erase_subject("carla", ["Carla Moreno"])
        # The rows are gone; the index kept their points and could not be searched, so the
        # erasure waits, unverified, naming the checks that could not run.
        assert erasure.state == pv.ERASURE_STATE_RUNNING and "index" in erasure.reason
        assert f"index:{collection}" in erasure.pending_checks
        assert sum(r.index_points_pending for r in erasure.reports) >= len(hers)
        assert hers <= await points()
        # The index answers reads again but still refuses deletes: the re-verification walks it
        # and finds the erased notes' points still there.
        index.unreadable = False
        clock.advance(seconds=31)
        await env.worker.drain()
        again = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=erasure.id))).erasure
        assert again.state == pv.ERASURE_STATE_RUNNING and not again.pending_checks
        assert "still in the index" in again.reason and not again.verified
        index.down = False
        # The orphan sweep removes them (the erasure's own retry would too).
        removed = await app.passes()["diary-orphans"].run()
        assert removed == len(hers) and not (hers & await points())
        assert await app.passes()["diary-orphans"].run() == 0
        clock.advance(seconds=31)
        await env.worker.drain()
        done = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=erasure.id))).erasure
        assert done.state == pv.ERASURE_STATE_SUCCEEDED and done.verified, done.reason
        assert not done.pending_checks and done.rounds == 1


async def test_retention_per_company_is_enforced_by_the_existing_passes(
    make_settings, dsn, clock, local_embedder, edge_index
):
    days = {"note_max_age_days": 30, "episode_max_age_days": 30, "reflection_max_age_days": 30}
    settings = make_settings(privacy={"companies": {"acme": days}})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        env = Env(app)

        async def reflect(run: str, company: str, body: str) -> None:
            await env.submit(clock, run, "dave", body, company=company)

        await reflect("old-acme", "acme", "I prefer the database backups checked daily.")
        await reflect("old-globex", "globex", "I prefer the load tests on staging.")
        clock.advance(days=31)
        await reflect("new-acme", "acme", "I prefer the cost review slides.")
        passes = app.passes()
        sweep = await passes["diary-sweep"].run()
        lifecycle = await passes["episode-lifecycle"].run()
        pruned = await passes["reflection-prune"].run()
        assert sweep.retention_deleted == 1 and lifecycle.retention_deleted == 1 and pruned == 2  # record + job
        for table, column in [("agent_diary", "turn_id"), ("episodes", "turn_id"), ("reflections", "turn_id")]:
            got = [await _count(dsn, f"SELECT count(*) FROM {table} WHERE {column} = $1", run)
                   for run in ("old-acme", "old-globex", "new-acme")]  # fmt: skip
            assert got == [0, 1, 1], (table, got)
        # A note's idempotency key outlives the note, not its company's retention.
        keys = [await _count(dsn, "SELECT count(*) FROM diary_requests WHERE strpos(request_id, $1) > 0", run)
                for run in ("old-acme", "old-globex", "new-acme")]  # fmt: skip
        assert keys == [0, 1, 1], keys


def test_a_person_is_matched_as_a_whole_word_whatever_their_name_holds():
    """The erasure's text match: whole words, case-insensitive, every character of a name literal."""
    import re
    import uuid as uuid_

    from libs.common.erasure import Kind, Target

    target = Target(uuid_.uuid4(), "acme", Kind.SUBJECT, handle="ana", names=("J. (Jo) Smith+", "ana@acme.io"))
    assert target.names_text("ask Ana about it.") and target.names_text("cc: ana@acme.io;")
    assert target.names_text("From J. (Jo) Smith+, with thanks")
    assert not target.names_text("a banana bread", "Janas", "J. Jo Smith")
    assert target.terms[0] == "J. (Jo) Smith+"  # longest first
    # The SQL pattern is the same rule, with every special character escaped (checked in Postgres
    # by the tests above; here: it compiles as a Python regex too, and names nothing when empty).
    assert re.compile(target.sql_pattern().replace("[:alnum:]", "a-zA-Z0-9"))
    assert Target(uuid_.uuid4(), "acme", Kind.SEAT, seat="ana").sql_pattern() == "a^"


async def test_erase_rpcs_need_admin_in_the_callers_own_company(make_settings, dsn, clock, local_embedder, edge_index):
    settings = make_settings()
    async with open_app(
        settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens"
    ) as app:
        stub = pv_grpc.PrivacyServiceStub(app.channel)
        request = pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"))

        async def call(company: str, scopes: list[str], req=request) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
            token, _ = await app.infra.tokens.issue(company, scopes)
            try:
                await stub.EraseSubject(req, metadata=(("authorization", f"Bearer {token}"),))
            except grpc.aio.AioRpcError as err:
                return err.code()
            return grpc.StatusCode.OK

        assert await call("acme", ["memory:read", "memory:write", "inspect"]) == grpc.StatusCode.PERMISSION_DENIED
        assert await call("globex", ["admin"]) == grpc.StatusCode.PERMISSION_DENIED
        assert await call("acme", ["admin"]) == grpc.StatusCode.OK
        bad = pv.EraseSeatRequest(company="acme", seat="no spaces allowed")
        token, _ = await app.infra.tokens.issue("acme", ["admin"])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pv_grpc.PrivacyServiceStub(app.channel).EraseSeat(
                bad, metadata=(("authorization", f"Bearer {token}"),)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The owners' erase RPCs declare admin too: a memory token cannot erase a diary (nor can an
        # admin token: only the privacy service calls them, the next test).
        from agentlearn.common.v1 import erasure_pb2

        target = erasure_pb2.ErasureTarget(
            erasure_id="00000000-0000-0000-0000-000000000017", company="acme", kind=er.ERASURE_KIND_COMPANY
        )
        token, _ = await app.infra.tokens.issue("acme", ["memory:read", "memory:write"])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await d_grpc.DiaryServiceStub(app.channel).EraseRows(
                d_pb.EraseRowsRequest(target=target), metadata=(("authorization", f"Bearer {token}"),)
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


OWNER_MESSAGES = {
    "diary": d_pb, "episodes": ep_pb, "knowledge": kn_pb, "prefetch": pf_pb, "profiles": pr_pb,
    "reflector": rf_pb, "sessions": ss_pb, "skills": sk_pb, "telemetry": tm_pb,
}  # fmt: skip
"""Every owner of rows the privacy service asks, and its generated messages."""


async def test_an_admin_token_cannot_erase_or_find_an_owners_rows_only_the_privacy_service_can(
    make_settings, dsn, clock, local_embedder, edge_index
):
    """Issue 17's guarantee: an erasure is requested through the privacy service, which records who
    asked and verifies. An admin token calling an owner's EraseRows or FindRows itself would skip
    both: every owner refuses it before reading anything (PERMISSION_DENIED,
    SERVICE_CREDENTIAL_REQUIRED, pointing at the privacy RPCs) and her note stays. The privacy
    service's erasure of the same person, asked with that token, still reaches every owner (as a
    service, with auth on) and succeeds, verified."""
    from services.privacy.domain import ERASE_ORDER

    assert set(OWNER_MESSAGES) == set(ERASE_ORDER)
    async with open_app(
        make_settings(), dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens"
    ) as app:
        token, _ = await app.infra.tokens.issue("acme", ["admin"])
        admin = (("authorization", f"Bearer {token}"),)
        diary = d_grpc.DiaryServiceStub(app.channel)
        written = await diary.WriteNote(
            d_pb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Carla Moreno prefers the kafka lag summary as a CSV file.",
                tier=d_pb.NOTE_TIER_LONG,
                source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
            ),
            metadata=admin,
        )
        target = subject_target("carla", "00000000-0000-0000-0000-0000000000a1", names=["Carla Moreno"])

        for owner, pb in OWNER_MESSAGES.items():
            [service] = [s for s in pb.DESCRIPTOR.services_by_name.values() if "EraseRows" in s.methods_by_name]
            for rpc in ("EraseRows", "FindRows"):
                call = app.channel.unary_unary(
                    f"/{service.full_name}/{rpc}",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=getattr(pb, f"{rpc}Response").FromString,
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(getattr(pb, f"{rpc}Request")(target=target), metadata=admin)
                code, info, _ = error_info(err.value)
                assert (code, info.reason) == (grpc.StatusCode.PERMISSION_DENIED, "SERVICE_CREDENTIAL_REQUIRED"), (
                    owner,
                    rpc,
                    err.value.details(),
                )
                assert "PrivacyService EraseSubject" in (err.value.details() or ""), (owner, rpc)
        # Nothing was erased nor recorded as erased: her note is there, no owner kept an erasure.
        notes = (await diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"), metadata=admin)).notes
        assert [n.id for n in notes] == [written.note.id]
        for owner in OWNER_MESSAGES:
            assert await _count(dsn, f"SELECT count(*) FROM {owner}_erasures") == 0, owner

        privacy = pv_grpc.PrivacyServiceStub(app.channel)
        resp = await privacy.EraseSubject(
            pv.EraseSubjectRequest(
                company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"), names=["Carla Moreno"]
            ),
            metadata=admin,
        )
        await app.components["privacy"].service.worker.drain()
        got = (
            await privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id), metadata=admin)
        ).erasure
        assert got.state == pv.ERASURE_STATE_SUCCEEDED and got.verified, got.reason
        assert {r.owner for r in got.reports} == set(OWNER_MESSAGES)
        erased = {t.table: t for r in got.reports if r.owner == "diary" for t in r.tables}
        assert list(erased["agent_diary"].ids) == [written.note.id]
        notes = (await diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"), metadata=admin)).notes
        assert list(notes) == []


@pytest.mark.slow
async def test_the_privacy_service_in_its_own_process_erases_through_owners_that_require_tokens(
    make_settings, dsn, clock, local_embedder, edge_index, tmp_path
):
    """Split mode with auth on: the owners take bearer tokens only, the privacy service runs in its
    own process (``serve privacy --require-auth``) and reaches them as a service with the
    deployment's internal secret. An admin token asks it for the erasure, and it succeeds, verified;
    the same token on an owner's EraseRows is refused."""
    import yaml

    from tests.support.runner import clean_env, start_with_config

    owners = list(OWNER_MESSAGES)
    secret = "split-mode-internal-secret"
    settings = make_settings(auth={"internal_secret": secret})
    async with open_app(
        settings, dsn, names=owners, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens"
    ) as app:
        token, _ = await app.infra.tokens.issue("acme", ["admin"])
        admin = (("authorization", f"Bearer {token}"),)
        diary = d_grpc.DiaryServiceStub(app.channel)
        written = await diary.WriteNote(
            d_pb.WriteNoteRequest(
                company="acme",
                seat="ana",
                content="Carla Moreno prefers the kafka lag summary as a CSV file.",
                tier=d_pb.NOTE_TIER_LONG,
                source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
            ),
            metadata=admin,
        )
        target = subject_target("carla", "00000000-0000-0000-0000-0000000000a2", names=["Carla Moreno"])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await diary.EraseRows(d_pb.EraseRowsRequest(target=target), metadata=admin)
        assert error_info(err.value)[1].reason == "SERVICE_CREDENTIAL_REQUIRED"

        config = tmp_path / "privacy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "services": dict.fromkeys(owners, f"127.0.0.1:{app.port}"),
                    "providers": {"embeddings": {"kind": "none"}},
                    "auth": {"mode": "tokens", "internal_secret": secret},
                    "privacy": {"poll_interval_seconds": 0.3},
                }
            )
        )
        running = await start_with_config(
            "serve", "privacy", "--port", "0", "--require-auth", config=config, data_dir=tmp_path / "data",
            env=clean_env({"DATABASE_URL": dsn}),
        )  # fmt: skip
        try:
            async with grpc.aio.insecure_channel(running.address) as channel:
                privacy = pv_grpc.PrivacyServiceStub(channel)
                resp = await privacy.EraseSubject(
                    pv.EraseSubjectRequest(
                        company="acme",
                        subject=er.ErasureSubject(handle="carla", platform="slack"),
                        names=["Carla Moreno"],
                    ),
                    metadata=admin,
                )
                erasure_id = resp.erasure.id
                async with asyncio.timeout(120):
                    while True:
                        got = (
                            await privacy.GetErasure(
                                pv.GetErasureRequest(company="acme", erasure_id=erasure_id), metadata=admin
                            )
                        ).erasure
                        if got.state in (pv.ERASURE_STATE_SUCCEEDED, pv.ERASURE_STATE_FAILED):
                            break
                        await asyncio.sleep(0.1)
        finally:
            await running.stop()
        assert got.state == pv.ERASURE_STATE_SUCCEEDED and got.verified, got.reason
        assert {r.owner for r in got.reports} == set(owners)
        erased = {t.table: t for r in got.reports if r.owner == "diary" for t in r.tables}
        assert list(erased["agent_diary"].ids) == [written.note.id]
        notes = (await diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"), metadata=admin)).notes
        assert list(notes) == []


async def test_a_turn_that_only_mentions_her_loses_her_name_not_what_else_it_taught(env, dsn, clock):
    """Dave's message names Carla: the rows that hold her name go (the episode, the turn's text), but
    Dave's lesson from that turn is not hers and stays."""
    mention = "I prefer the quarterly cost review slides. Carla Moreno agreed with that."
    await env.submit(clock, "run-mention", "dave", mention, label="Message from Dave: Slack message")
    notes = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"))).notes
    [lesson] = [n for n in notes if n.turn_id == "run-mention"]
    assert "carla" not in lesson.content.lower() and "cost review" in lesson.content
    assert await _mentions(dsn, "carla")  # the turn's episode and payload hold her name

    erasure = await env.erase_subject("carla", ["Carla Moreno"])

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED, erasure.reason
    reports = {r.owner: r for r in erasure.reports}
    assert "run-mention" not in reports["reflector"].turn_ids  # not one of her turns
    assert reports["episodes"].tables[0].count == 1  # but its episode held her name: deleted
    assert await _mentions(dsn, "carla") == {}
    notes = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"))).notes
    assert lesson.id in {n.id for n in notes}


async def test_a_reflection_whose_turn_an_erasure_took_while_it_was_claimed_writes_nothing(env, dsn, clock):
    """A reflection of her turn is claimed (its turn in memory) when the erasure starts: the erase
    step deletes its record and closes its job (emptied). The claimed pass, taking its turn after
    that, finds no record (the erased marker) and runs no worker: it used to fall through to the
    gates and the workers and write her note, episode and profile after the owners erased.

    The overlap is forced, not timed: the test claims her turn as the in-flight reflector would,
    holds the prefetch owner's erasure record table (prefetch is asked after the reflector), runs
    the claimed reflection while the erasure waits there, then lets the erasure go."""
    from libs.common.jobs import JobQueue

    await env.submit(clock, "run-dave", "dave", "I prefer the load tests.")
    held = "I prefer the kafka lag summary as a CSV file."
    await env.submit(clock, "run-held", "carla", held, drain=False, label="Message from Carla: Slack message")
    queue = JobQueue(env.app.infra.pool)
    job = await queue.claim("reflection", "in-flight-reflector", clock.now(), 600)
    assert job is not None and job.key.endswith("run-held")

    conn = await asyncpg.connect(dsn)
    blocker = await asyncpg.connect(dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE prefetch_erasures IN ACCESS EXCLUSIVE MODE")
        resp = await env.privacy.EraseSubject(
            pv.EraseSubjectRequest(
                company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"), names=["Carla Moreno"]
            )
        )
        running = asyncio.create_task(env.worker.drain())
        async with asyncio.timeout(60):  # the erasure reaches the prefetch owner: the reflector's step is done
            while not await conn.fetchval("SELECT count(*) FROM reflector_erasures"):
                await asyncio.sleep(0.02)
        # Its job is closed without her turn (the row stays: a redelivery is a duplicate).
        held_job = await conn.fetchrow(
            "SELECT state, length(payload) AS n FROM background_jobs WHERE key LIKE '%run-held'"
        )
        assert (held_job["state"], held_job["n"]) == ("done", 0)
        # Her reflection, claimed all along, takes its turn now: it is erased, nothing runs.
        assert await env.harness.process(job) == "erased"
        assert await conn.fetchval("SELECT count(*) FROM agent_diary WHERE turn_id = 'run-held'") == 0
        assert await conn.fetchval("SELECT count(*) FROM episodes WHERE turn_id = 'run-held'") == 0
        await tx.rollback()
        await running
    finally:
        await blocker.close()
        await conn.close()
    erasure = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert erasure.rounds == 1 and not erasure.residues
    assert await _mentions(dsn, "carla") == {}
    notes = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"))).notes
    assert [n.turn_id for n in notes] == ["run-dave"]


async def test_a_claimed_reflection_taking_its_turn_after_her_erasure_succeeded_writes_nothing(env, dsn, clock):
    """The same pass, its turn taken only after the erasure SUCCEEDED and was verified (its model
    call slow, say): no note, episode or profile of hers comes back after the receipt."""
    from libs.common.jobs import JobQueue

    label = "Message from Carla: Slack message"
    await env.submit(
        clock, "run-held", "carla", "I prefer the kafka lag summary as a CSV file.", drain=False, label=label
    )
    job = await JobQueue(env.app.infra.pool).claim("reflection", "in-flight-reflector", clock.now(), 30)
    assert job is not None
    subject = er.ErasureSubject(handle="carla", platform="slack")
    resp = await env.privacy.EraseSubject(
        pv.EraseSubjectRequest(company="acme", subject=subject, names=["Carla Moreno"])
    )
    await env.worker.drain()
    erasure = (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await env.harness.process(job) == "erased"
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM agent_diary WHERE turn_id = 'run-held'") == 0
        assert await conn.fetchval("SELECT count(*) FROM episodes WHERE turn_id = 'run-held'") == 0
        assert await conn.fetchval("SELECT count(*) FROM counterparty_profiles WHERE subject_handle = 'carla'") == 0
    finally:
        await conn.close()
    assert await _mentions(dsn, "carla") == {}


async def test_a_shared_note_that_does_not_name_her_loses_her_as_a_source_and_keeps_its_text(env, dsn):
    """A lesson resting on Carla and Dave (its provenance names both): kept, without her in its
    provenance; one that names her is deleted whatever else it rests on."""

    async def write(content: str, turn_id: str) -> str:
        return await env.write_note("ana", content, turn_id, ("carla", "dave"))

    shared = await write("Weekly digests go out on Mondays.", "session-check-1")
    named = await write("Weekly digests go to Carla Moreno first.", "session-check-2")
    erasure = await env.erase_subject("carla", ["Carla Moreno"])
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    diary = {t.table: t for r in erasure.reports if r.owner == "diary" for t in r.tables}
    assert list(diary["note_provenance"].ids) == [shared] and diary["note_provenance"].changed == 1
    assert list(diary["agent_diary"].ids) == [named]
    notes = (await env.diary.ListNotes(d_pb.ListNotesRequest(company="acme", seat="ana"))).notes
    assert [n.content for n in notes] == ["Weekly digests go out on Mondays."]
    prov = (
        await env.diary.GetNoteProvenance(d_pb.GetNoteProvenanceRequest(company="acme", seat="ana", note_id=shared))
    ).provenance
    assert [s.handle for s in prov.subjects] == ["dave"] and list(prov.turn_ids) == ["session-check-1"]
    assert await _mentions(dsn, "carla") == {}


async def test_the_verification_finds_her_in_the_index_by_her_names(env, dsn):
    """The diary's FindRows also searches its vector index with her names embedded: a near point
    whose note (re-read from Postgres) names her is reported as an index finding; a near point of a
    note that does not name her is not."""
    hers = await env.write_note("ana", "Carla Moreno prefers the kafka lag summary as a CSV file.")
    other = await env.write_note("ana", "Dave prefers the kafka lag summary as a PDF file.")
    dims = await _count(dsn, "SELECT max(embedding_dims) FROM agent_diary")
    assert dims  # both notes were embedded and indexed
    target = subject_target("carla", "00000000-0000-0000-0000-000000000042", names=["Carla Moreno"])
    found = (await env.diary.FindRows(d_pb.FindRowsRequest(target=target))).report
    tables = {t.table: t for t in found.tables}
    assert set(tables["agent_diary"].ids) == {hers}
    assert set(tables[f"index:diary_notes_{dims}"].ids) == {hers}  # found through the index too
    assert other not in {i for t in found.tables for i in t.ids}


async def test_a_frozen_turn_context_holding_her_lesson_is_dropped_even_when_it_does_not_name_her(env, dsn):
    """A turn start's context is frozen for a day (a redelivery gets the same answer). A lesson
    derived only from Carla need not name her, so no text match finds it in Ben's frozen context:
    her erasure drops the company's frozen contexts made up to it, and the redelivered turn start
    is rebuilt from stores without her lesson."""
    lesson = "The staging cluster is rebuilt every Thursday night."
    await env.write_note("ben", lesson, "run-carla-1", ("carla",))

    async def start() -> str:
        resp = await env.prefetch.BuildTurnContext(
            pf_pb.BuildTurnContextRequest(
                company="acme", seat="ben", role="swe", turn_id="run-ben-7", ask="when is the staging cluster rebuilt?"
            )
        )
        return str(resp)

    assert lesson in await start()
    assert await _count(dsn, "SELECT count(*) FROM turn_contexts WHERE turn_id = 'run-ben-7'") == 1

    erasure = await env.erase_subject("carla", ["Carla Moreno"])

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    prefetch = {t.table: t for r in erasure.reports if r.owner == "prefetch" for t in r.tables}
    assert "ben/run-ben-7" in prefetch["turn_contexts"].ids
    assert await _count(dsn, "SELECT count(*) FROM turn_contexts WHERE turn_id = 'run-ben-7'") == 0
    assert lesson not in await start()  # the redelivery is rebuilt, without her lesson


async def test_the_knowledge_verification_finds_her_in_its_index_by_her_names(env, dsn):
    """The knowledge owner's FindRows searches its index (a point's seat is the page's container)
    with her names embedded, as the diary's does: her page is found through the index too; a page
    that does not name her is not."""
    hers = await env.knowledge.UpsertPage(
        kn_pb.UpsertPageRequest(company="acme", container="team", title="Digests", body="Carla Moreno wants CSV.")
    )
    other = await env.knowledge.UpsertPage(
        kn_pb.UpsertPageRequest(company="acme", container="team", title="Backups", body="Dave checks backups daily.")
    )
    dims = await _count(dsn, "SELECT max(embedding_dims) FROM knowledge_pages")
    assert dims  # both pages were embedded and indexed
    target = subject_target("carla", "00000000-0000-0000-0000-000000000043", names=["Carla Moreno"])
    found = (await env.knowledge.FindRows(kn_pb.FindRowsRequest(target=target))).report
    tables = {t.table: t for t in found.tables}
    assert set(tables["knowledge_pages"].ids) == {hers.page.id}
    assert set(tables[f"index:knowledge_pages_{dims}"].ids) == {hers.page.id}
    assert other.page.id not in {i for t in found.tables for i in t.ids}
