"""Erasing one person however the request and the rows spell her (issue 17): a platform compared
case-insensitively everywhere; her handle and her external id one person, never "another person" to
each other; rows resting on her alone deleted, not kept as shared; promotion drafts that name her;
a redelivered turn of hers after the erasure. Each test was written against a residue an erasure
reported SUCCEEDED over.

Real parts, as tests/test_privacy.py: the services on a loopback gRPC server, Postgres, the embedded
vector index, the local embedding model, the reflector's workers on the offline model rules, and the
privacy service's erasure worker.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from tests.support.app import open_app
from tests.support.turns import message, turn
from tests.test_privacy import NAMES, Env, _mentions

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    # As tests/test_privacy.py's; reflection records and their jobs kept 30 days (the retention
    # prune is run by hand where a test needs the turn's payload gone).
    settings = make_settings(
        companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}},
        privacy={"companies": {"acme": {"reflection_max_age_days": 30}}},
    )
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


EXTERNAL = "U07XK9Q2"
"""Carla's Slack user id (the engine sends it with her handle)."""


def _from_carla(body: str, platform: str = "Slack") -> rf_pb.InboundInteraction:
    """A message of Carla's as an engine reports it: her handle, her user id, its own spelling of
    the platform."""
    sender = rf_pb.Sender(handle="carla", external_id=EXTERNAL, platform=platform, display_name="Carla")
    return rf_pb.InboundInteraction(sender=sender, body=body)


async def _submit(env: Env, clock, run: str, *messages: rf_pb.InboundInteraction, drain: bool = True) -> None:  # type: ignore[no-untyped-def]
    await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=turn(run, now=clock.now(), messages=list(messages))))
    if drain:
        await env.harness.drain()
    clock.advance(seconds=60)


async def _erase(env: Env, subject: er.ErasureSubject, names: tuple[str, ...] = ()) -> pv.Erasure:
    resp = await env.privacy.EraseSubject(pv.EraseSubjectRequest(company="acme", subject=subject, names=list(names)))
    await env.worker.drain()
    return (await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure


async def _rows(dsn: str, sql: str, *args: object) -> list[dict]:  # type: ignore[type-arg]
    conn = await asyncpg.connect(dsn)
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def test_her_profile_goes_whatever_the_case_of_the_platform_the_request_names(env, dsn, clock):
    """The profiles file the platform lowercased; a request spelling it "Slack" erased every other
    row of hers and kept her profile (taken for another person's resting on her)."""
    await _submit(env, clock, "run-b1", _from_carla("I prefer the billing export in euros.", platform="slack"))
    assert await _rows(dsn, "SELECT id FROM counterparty_profiles WHERE subject_handle = 'carla'")

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="Slack"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await _rows(dsn, "SELECT id, platform FROM counterparty_profiles") == []
    for word in ("carla", EXTERNAL, "euros"):
        assert await _mentions(dsn, word) == {}, word


async def test_erased_by_her_external_id_on_a_platform_her_turns_spelt_otherwise(env, dsn, clock):
    """Her turns came in as {carla, U07XK9Q2, "Slack"}; the request names her user id on "slack".
    The reflector compared the platform as spelt, collected none of her turns, and her message
    stayed word for word in the job payload, the episode and the diary while the erasure reported
    SUCCEEDED. A turn of hers still queued (no episode yet: only the reflector knows it is hers) is
    not reflected after the erasure. Her handle, which the request did not name, is hers too:
    nothing keeps it either."""
    await _submit(env, clock, "run-a1", _from_carla("I prefer the billing export in euros."))
    await env.submit(clock, "run-d1", "dave", "I prefer the database backups checked daily.")
    await _submit(env, clock, "run-a2", _from_carla("I prefer the oncall rota in a spreadsheet."), drain=False)
    before = await _mentions(dsn, "euros")
    assert {"background_jobs", "episodes", "agent_diary"} <= set(before), before
    assert await _mentions(dsn, "carla") and await _mentions(dsn, EXTERNAL)

    erasure = await _erase(env, er.ErasureSubject(external_id=EXTERNAL, platform="slack"))
    await env.harness.drain()  # whatever is still queued runs now

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    reports = {r.owner: r for r in erasure.reports}
    assert {"run-a1", "run-a2"} <= set(reports["reflector"].turn_ids)
    for word in ("euros", "spreadsheet", "carla", EXTERNAL):
        assert await _mentions(dsn, word) == {}, word
    assert await _rows(dsn, "SELECT id FROM counterparty_profiles WHERE subject_handle = 'carla'") == []
    assert {"agent_diary", "episodes", "counterparty_profiles"} <= set(await _mentions(dsn, "dave"))


async def test_an_episode_names_both_her_identifiers_and_goes_when_her_turn_was_pruned(env, dsn, clock):
    """The episodist recorded a sender's handle OR external id: once the reflection prune had taken
    the turn's payload (the only other place her user id sat), an erasure naming her user id did not
    find the episode holding what she asked."""

    await _submit(env, clock, "run-c1", _from_carla("I prefer the billing export in euros."))
    [episode] = await _rows(dsn, "SELECT subjects FROM episodes WHERE turn_id = 'run-c1'")
    assert sorted(episode["subjects"]) == sorted(["carla", EXTERNAL])  # every identifier the engine sent
    clock.advance(days=31)
    assert await env.app.passes()["reflection-prune"].run() == 2  # its record and its job
    clock.advance(seconds=60)

    erasure = await _erase(env, er.ErasureSubject(external_id=EXTERNAL, platform="slack"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await _rows(dsn, "SELECT id FROM episodes") == []
    assert "run-c1" in {t for r in erasure.reports if r.owner == "episodes" for t in r.turn_ids}


async def _note(env: Env, content: str, turn_id: str, *people: er.ErasureSubject) -> str:
    """A long-tier lesson of ana's from the persist decider, resting on ``people``' messages in
    ``turn_id`` (a turn the erasure does not collect: its payload and episode are gone)."""
    from agentlearn.common.v1 import provenance_pb2
    from agentlearn.diary.v1 import diary_service_pb2 as d_pb

    resp = await env.diary.WriteNote(
        d_pb.WriteNoteRequest(
            company="acme",
            seat="ana",
            content=content,
            tier=d_pb.NOTE_TIER_LONG,
            source=d_pb.NOTE_SOURCE_PERSIST_DECIDER,
            turn_id=turn_id,
            provenance=provenance_pb2.Provenance(turn_ids=[turn_id], subjects=list(people)),
        )
    )
    return resp.note.id


async def test_a_note_resting_on_her_alone_is_deleted_whichever_identifier_the_request_names(env, dsn):
    """Its provenance names her by handle and user id; the request by handle. Her user id was taken
    for another person, the note kept as "shared" with its text, and her user id left in its
    provenance. A note resting on her and Dave keeps its text and loses every identifier of hers."""
    carla = er.ErasureSubject(handle="carla", external_id=EXTERNAL, platform="Slack")
    dave = er.ErasureSubject(handle="dave", external_id="U0DAVE01", platform="slack")
    alone = await _note(env, "The billing export goes out in euros.", "run-old-1", carla)
    shared = await _note(env, "Weekly digests go out on Mondays.", "run-old-2", carla, dave)

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    diary = {t.table: t for r in erasure.reports if r.owner == "diary" for t in r.tables}
    assert list(diary["agent_diary"].ids) == [alone]
    assert list(diary["note_provenance"].ids) == [shared] and diary["note_provenance"].changed == 1
    notes = await _rows(dsn, "SELECT d.id, p.subjects FROM agent_diary d JOIN note_provenance p ON p.note_id = d.id")
    assert notes == [{"id": uuid.UUID(shared), "subjects": ["U0DAVE01", "dave"]}]
    for word in ("carla", EXTERNAL, "euros"):
        assert await _mentions(dsn, word) == {}, word


async def test_a_promotion_draft_naming_her_among_its_people_is_erased(env, dsn, clock):
    """Drafts were matched by run id only: one whose runs were not collected as hers (past
    retention) but whose record names her among the people they answered stayed, and a Confluence
    draft's record kept {"handle": "carla"} (GetDraftProvenance returned it)."""
    import json

    import grpc

    from agentlearn.common.v1 import provenance_pb2
    from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
    from libs.common.erasure import provenance_json

    await _submit(env, clock, "run-c1", _from_carla("Please rotate the keys."))
    people = [er.ErasureSubject(handle=h) for h in ("carla", EXTERNAL, "dave")]  # as the episodes name them
    native = await env.knowledge.WritePromotionDraft(
        kn_pb.WritePromotionDraftRequest(
            company="acme",
            unit="platform",
            container_key="team",
            title="Team routine: rotate keys (0001)",
            body="1. Rotate the keys.\n",
            sources=[kn_pb.DraftSource(seat="ana", turn_id="run-x1"), kn_pb.DraftSource(seat="ben", turn_id="run-x2")],
            provenance=provenance_pb2.Provenance(model="m-1", subjects=people),
        )
    )
    assert native.created

    async def confluence(page_id: str, title: str, sources: list[tuple[str, str]]) -> None:
        prov = provenance_pb2.Provenance(turn_ids=[t for _, t in sources], subjects=people, writer="skill_promotion")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                """INSERT INTO draft_provenance (company, page_id, backend, container, title, unit, seats, turn_ids,
                                                 sources, provenance, record_time)
                   VALUES ('acme', $1, 'confluence', 'team', $2, 'platform', $3, $4, $5::jsonb, $6::jsonb, now())""",
                page_id,
                title,
                sorted({s for s, _ in sources}),
                [t for _, t in sources],
                json.dumps([{"seat": s, "turn_id": t} for s, t in sources]),
                provenance_json(prov),
            )
        finally:
            await conn.close()

    # The page is the customer's; the record is ours. One rests on her run and Dave's, one on hers
    # alone, one on Dave's with a title naming her.
    await confluence("CONF-1", "Team routine: key rotation (0002)", [("ana", "run-c1"), ("ben", "run-d9")])
    await confluence("CONF-2", "Team routine: key audit (0003)", [("ana", "run-c1")])
    await confluence("CONF-3", "Team routine: ask Carla (0004)", [("ben", "run-d9")])

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"), ("Carla Moreno",))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    knowledge = {t.table: t for r in erasure.reports if r.owner == "knowledge" for t in r.tables}
    assert sorted(knowledge["draft_provenance"].ids) == sorted(["CONF-1", "CONF-2", "CONF-3", native.page_id])
    assert knowledge["draft_provenance"].changed == 1 and knowledge["knowledge_pages"].ids == [native.page_id]
    for page_id in (native.page_id, "CONF-2", "CONF-3"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await env.knowledge.GetDraftProvenance(kn_pb.GetDraftProvenanceRequest(company="acme", page_id=page_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, page_id
    kept = await env.knowledge.GetDraftProvenance(kn_pb.GetDraftProvenanceRequest(company="acme", page_id="CONF-1"))
    assert [(s.seat, s.turn_id) for s in kept.sources] == [("ben", "run-d9")]
    assert list(kept.provenance.turn_ids) == ["run-d9"] and not kept.provenance.subjects
    for word in ("carla", EXTERNAL):
        assert await _mentions(dsn, word) == {}, word


async def test_a_turn_of_hers_redelivered_after_the_erasure_is_not_reflected_again(env, dsn, clock):
    """Her turn was still queued when the erasure ran: its job was deleted, and the job row is the
    only duplicate gate, so the engine's retry of SubmitTurn queued the whole turn again and
    everything of hers was derived anew after a SUCCEEDED erasure."""
    message = _from_carla("I prefer the billing export in euros.")
    await env.submit(clock, "run-d1", "dave", "I prefer the database backups checked daily.")
    await _submit(env, clock, "run-r1", message, drain=False)

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"))
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    # The engine did not hear back and sends the same turn again.
    again = await env.reflector.SubmitTurn(
        rf_pb.SubmitTurnRequest(turn=turn("run-r1", now=clock.now(), messages=[message]))
    )
    await env.harness.drain()

    assert not again.queued
    for word in ("euros", "carla", EXTERNAL):
        assert await _mentions(dsn, word) == {}, word
    [job] = await _rows(dsn, "SELECT state, length(payload) AS size FROM background_jobs WHERE key LIKE '%run-r1'")
    assert job == {"state": "done", "size": 0}
    assert "agent_diary" in await _mentions(dsn, "dave")  # Dave's turn was reflected


async def test_a_request_naming_her_handle_also_erases_the_user_id_her_turns_came_under(env, dsn, clock):
    """Rows derived from the episodes name people by bare strings (a skill's or a draft's
    provenance: her handle and her user id side by side, unpaired). The collection pass now learns
    her user id from the senders and profiles that pair it with the handle the request names, and
    every owner is asked about both: a skill resting on her turn and Dave's keeps Dave alone."""
    from agentlearn.common.v1 import provenance_pb2
    from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
    from tests.support.skills import skill_request

    await _submit(env, clock, "run-c1", _from_carla("I prefer the billing export in euros."))
    await env.submit(clock, "run-d1", "dave", "I prefer the database backups checked daily.")
    runs = ["run-c1", "run-d1"]
    people = [er.ErasureSubject(handle=h) for h in ("carla", EXTERNAL, "dave")]  # as the skills pass writes them
    provenance = provenance_pb2.Provenance(turn_ids=runs, subjects=people, writer="skill_synthesis:clustered")
    request = skill_request(
        "ana", "weekly-export", "use for exports", "# Export\n\n1. Export.\n", ["sql_query", "csv_export"], runs,
        trigger=sk_pb.SKILL_TRIGGER_CLUSTERED, cluster_size=2, provenance=provenance,
    )  # fmt: skip
    skill = (await env.skills.CreateSkill(request)).skill

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    prov = (
        await env.skills.GetSkillProvenance(
            sk_pb.GetSkillProvenanceRequest(company="acme", seat="ana", skill_id=skill.id)
        )
    ).provenance
    assert [s.handle for s in prov.subjects] == ["dave"] and list(prov.turn_ids) == ["run-d1"]
    stored = await _rows(dsn, "SELECT provenance::text AS p FROM synthesized_skills")
    assert len(stored) == 1 and EXTERNAL not in stored[0]["p"] and "carla" not in stored[0]["p"]
    for word in ("carla", EXTERNAL, "euros"):
        assert await _mentions(dsn, word) == {}, word
    # The audit keeps no identifier of hers, the one the collection found included.
    audit = await _rows(dsn, "SELECT coalesce(target::text, '') || reports::text || residues::text AS t FROM erasures")
    assert audit and all(EXTERNAL not in a["t"] and "carla" not in a["t"] for a in audit)


async def test_the_caches_holding_her_words_are_emptied_by_the_erasure(make_settings, dsn, clock, edge_index):
    """The query-vector cache (4,096 queries, no expiry: the prefetch embeds a turn's ask word for
    word) and the prefetch's content words of note texts outlived her erasure in memory. Every
    owner's EraseRows now empties this process's caches of text."""
    from agentlearn.diary.v1 import diary_service_pb2 as d_pb
    from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
    from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
    from services.prefetch.text import _content_words

    embedder = LocalMiniLMEmbedder(query_cache_entries=64)  # as a deployment runs it (4,096 by default)
    embedder.load()
    settings = make_settings(companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=embedder, index=edge_index) as app:
        env = Env(app)
        await _submit(env, clock, "run-q1", _from_carla("I prefer the billing export in euros."))
        ask = "Carla asked for the billing export in euros again"
        await env.diary.RecallNotes(d_pb.RecallNotesRequest(company="acme", seat="ana", query=ask))
        await env.prefetch.BuildTurnContext(
            pf_pb.BuildTurnContextRequest(company="acme", seat="ana", role="swe", turn_id="run-q2", ask=ask)
        )
        assert embedder.query_cache is not None and len(embedder.query_cache) > 0
        assert _content_words.cache_info().currsize > 0

        erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"), ("Carla",))

        assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
        assert len(embedder.query_cache) == 0
        assert _content_words.cache_info().currsize == 0


async def test_a_turn_of_hers_sent_again_after_the_erasure_is_answered_erased(env, dsn, clock):
    """After the erasure, SubmitTurn of a turn of hers again answered ``queued: false`` with
    ``state: QUEUED`` (its record was gone, and a missing record was read as "still queued"):
    nothing was queued and nothing would run. A queued turn of Dave's that only names her was closed
    unreflected with its record left QUEUED for ever. Each now answers ERASED, from SubmitTurn and
    from GetReflection alike: a turn reflected, one still queued, a self_iterate round (asked by its
    run id, as GetReflection answers a run that has only self-iterated), and Dave's."""
    mine = _from_carla("I prefer the billing export in euros.")
    naming = message("dave", "Carla Moreno wants the rota moved to Fridays.")
    round_ = turn("run-s1", now=clock.now(), messages=[mine], outcome=rf_pb.TURN_OUTCOME_SELF_ITERATE)
    await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=round_))
    await _submit(env, clock, "run-e1", mine)
    await env.submit(clock, "run-d1", "dave", "I prefer the database backups checked daily.")
    await _submit(env, clock, "run-e2", mine, drain=False)
    await _submit(env, clock, "run-n1", naming, drain=False)
    queued = await _rows(dsn, "SELECT turn_id FROM reflections WHERE state = 'queued' ORDER BY turn_id")
    assert [r["turn_id"] for r in queued] == ["run-e2", "run-n1"]

    erasure = await _erase(env, er.ErasureSubject(handle="carla", platform="slack"), names=("Carla Moreno",))
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason

    def state(value: int) -> str:
        return rf_pb.ReflectionState.Name(value)

    again = {
        "run-s1": round_,
        "run-e1": turn("run-e1", now=clock.now(), messages=[mine]),
        "run-e2": turn("run-e2", now=clock.now(), messages=[mine]),
        "run-n1": turn("run-n1", now=clock.now(), messages=[naming]),
    }
    for run, t in again.items():
        resp = await env.reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
        assert (resp.queued, state(resp.state)) == (False, "REFLECTION_STATE_ERASED"), run
        got = await env.reflector.GetReflection(rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id=run))
        assert state(got.reflection.state) == "REFLECTION_STATE_ERASED", run
        # The round's reflection answers for a run that only self-iterated, under its own key.
        key = run + "#self_iterate" if run == "run-s1" else run
        assert (got.reflection.turn_id, got.reflection.seat, got.reflection.workers) == (key, "ana", []), run
    await env.harness.drain()
    for word in ("euros", "carla", EXTERNAL, "Fridays"):
        assert await _mentions(dsn, word) == {}, word
    # Dave's own turn, untouched, answers what became of it.
    dave = await env.reflector.GetReflection(rf_pb.GetReflectionRequest(company="acme", seat="ana", turn_id="run-d1"))
    assert state(dave.reflection.state) == "REFLECTION_STATE_COMPLETED"


async def test_an_episode_s_provenance_answers_each_identifier_in_its_own_field(env, clock):
    """GetEpisodeProvenance answered every identifier the episodist recorded as a handle: Carla's
    Slack user id came back as a second person with handle "U07XK9Q2", and a sender known only by
    an external id as a handle too. Each sender is now one person, each identifier in its field,
    on the platform the turn named."""
    from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb

    zed = rf_pb.Sender(external_id="U0ZED42", platform="Slack", display_name="Zed")
    await _submit(
        env,
        clock,
        "run-p1",
        _from_carla("I prefer the billing export in euros."),
        rf_pb.InboundInteraction(sender=zed, body="Same for me, please."),
    )
    got = await env.episodes.GetEpisode(ep_pb.GetEpisodeRequest(company="acme", seat="ana", turn_id="run-p1"))
    request = ep_pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=got.episode.id)
    prov = (await env.episodes.GetEpisodeProvenance(request)).provenance

    people = sorted((s.handle, s.external_id, s.platform) for s in prov.subjects)
    assert people == [("", "U0ZED42", "Slack"), ("carla", EXTERNAL, "Slack")]
    assert list(prov.turn_ids) == ["run-p1"] and prov.writer == "episodist"


def _from(handle: str, body: str, platform: str) -> rf_pb.InboundInteraction:
    return rf_pb.InboundInteraction(sender=rf_pb.Sender(handle=handle, platform=platform), body=body)


async def test_a_one_letter_handle_takes_the_profilers_keys_naming_her_and_no_one_elses(env, dsn, clock):
    """The profiler's idempotency keys (``<work>:profiler:<platform>/<handle>``) were matched with
    the text pattern, which leaves out an identifier shorter than two characters (it would match
    any text saying "option q"): q's keys stayed after her erasure SUCCEEDED. They are read by their
    structure now: q's go, on the platform named or on every one, and qa's (and, while the
    request names github, q's on MS Teams: another person) stay."""
    await _submit(env, clock, "run-q1", _from("q", "I prefer the release notes in markdown.", "github"))
    await _submit(
        env,
        clock,
        "run-q2",
        _from("qa", "I prefer the test plans in a table.", "github"),
        _from("q", "I prefer the standups short.", "MS Teams"),
    )

    async def keys() -> list[str]:
        return sorted(r["request_id"] for r in await _rows(dsn, "SELECT request_id FROM profile_requests"))

    assert await keys() == [
        "work-run-q1:profiler:github/q",
        "work-run-q2:profiler:MS Teams/q",
        "work-run-q2:profiler:github/qa",
    ]

    erasure = await _erase(env, er.ErasureSubject(handle="q", platform="GitHub"))

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await keys() == ["work-run-q2:profiler:MS Teams/q", "work-run-q2:profiler:github/qa"]
    profiles = "SELECT subject_handle, platform FROM counterparty_profiles ORDER BY subject_handle, platform"
    assert [tuple(r.values()) for r in await _rows(dsn, profiles)] == [("q", "ms teams"), ("qa", "github")]

    erasure = await _erase(env, er.ErasureSubject(handle="q"))  # every platform

    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    assert await keys() == ["work-run-q2:profiler:github/qa"]
    assert [tuple(r.values()) for r in await _rows(dsn, profiles)] == [("qa", "github")]
