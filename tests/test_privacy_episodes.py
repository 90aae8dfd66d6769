"""A compacted episode under erasure (issue 17): its provenance is the union of its members' with the
compaction's model and prompt version, and erasing one member's person re-derives it from the
remaining members by the lifecycle's own summary (the offline rules here: no model endpoint), or
deletes it when none remain. Real parts: the episodes service on loopback gRPC, Postgres, the
embedded vector index, the lifecycle pass as the runner runs it."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.episodes.v1 import episode_service_pb2 as pb
from services.episodes.lifecycle import COMPACTION_PROMPT_VERSION
from tests.support.app import open_app
from tests.support.erasure_checks import subject_target
from tests.support.grpc_errors import error_info
from tests.support.scripted_openai import Reply
from tests.support.turns import raw_episode
from tests.test_episodes_lifecycle import GATE, Chat, Seats
from tests.test_episodes_lifecycle import scripted_llm as lifecycle_llm

pytestmark = pytest.mark.timeout(120)

JIRA = ("jira.search", "jira.update")
DEPLOY = ("k8s.rollout", "k8s.status")


@pytest.fixture
async def seats(make_settings, dsn, clock, edge_index):
    settings = make_settings(learning={"episode_lifecycle": {"max_raw_episodes_per_agent": GATE}})
    async with open_app(settings, dsn, names=["episodes"], clock=clock, index=edge_index) as app:
        yield Seats(app, clock)


async def test_a_compacted_episode_is_rederived_without_her_and_one_of_hers_alone_is_deleted(seats):
    await seats.due()
    # One cluster resting on three people; one resting on Carla alone.
    carla = await seats.add(40, JIRA, label="Weekly report request", subjects=["carla"], what="Carla Moreno got it.")
    mixed = {
        carla,
        await seats.add(41, JIRA, label="Weekly report request", subjects=["dave"]),
        await seats.add(42, (*JIRA, "slack.post"), label="Weekly report reminder", subjects=["erin"]),
        await seats.add(43, JIRA, label="Weekly report request", subjects=["dave"], outcome=pb.TURN_OUTCOME_FAILED),
    }
    hers = {await seats.add(40 + i, DEPLOY, label="Deploy the billing API", subjects=["carla"]) for i in range(3)}
    await seats.run()
    compacted = {tuple(r["tool_sequence"]): r for r in await seats.compacted()}
    shared, alone = compacted[JIRA], compacted[DEPLOY]
    assert shared["count"] == 4 and shared["common_outcome"] == "3 of 4 ended done, 1 failed"

    # Provenance: the union of the members' run ids and people, the compaction's model and prompt.
    prov = (
        await seats.stub.GetEpisodeProvenance(
            pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=str(shared["id"]))
        )
    ).provenance
    assert set(prov.turn_ids) == mixed  # every member, not only the exemplars kept raw
    assert len(shared["exemplar_turn_ids"]) < len(mixed)
    assert {s.handle for s in prov.subjects} == {"carla", "dave", "erin"}
    assert prov.model == "offline-rules" and prov.prompt_version == COMPACTION_PROMPT_VERSION
    assert prov.writer == "episode_lifecycle"

    carla_runs = [*sorted(hers), carla]
    target = subject_target("carla", str(uuid.uuid4()), names=["Carla Moreno"], turn_ids=carla_runs)
    report = (await seats.stub.EraseRows(pb.EraseRowsRequest(target=target))).report
    tables = {t.table: t for t in report.tables}
    assert list(tables["episodes:rederived"].ids) == [str(shared["id"])]
    assert str(alone["id"]) in tables["episodes"].ids  # nothing of it remained: deleted

    rows = await seats.rows()
    [after] = [r for r in rows.values() if r["kind"] == "compacted"]
    assert after["id"] == shared["id"]  # re-derived in place
    # The summary was written again from the three remaining members.
    assert after["count"] == 3 and after["common_outcome"] == "2 of 3 ended done, 1 failed"
    assert "carla" not in after["subjects_involved"] and set(after["subjects_involved"]) == {"dave", "erin"}
    assert not set(after["exemplar_turn_ids"]) & set(carla_runs)
    text = json.dumps({k: str(v) for k, v in after.items()}).lower()
    assert "carla" not in text and "moreno" not in text
    members = await seats.app.infra.pool.fetch("SELECT * FROM compaction_members WHERE compacted_id = $1", after["id"])
    assert len(members) == 3 and not any("carla" in (str(m["record"]) + str(m["subjects"])).lower() for m in members)
    prov = (
        await seats.stub.GetEpisodeProvenance(
            pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=str(after["id"]))
        )
    ).provenance
    assert set(prov.turn_ids) == mixed - set(carla_runs) and {s.handle for s in prov.subjects} == {"dave", "erin"}
    # The verification finds nothing left, and a repeat of the erasure is the same report.
    found = (await seats.stub.FindRows(pb.FindRowsRequest(target=target))).report
    assert not [t for t in found.tables if t.count or t.changed]
    again = (await seats.stub.EraseRows(pb.EraseRowsRequest(target=target))).report
    assert again == report


async def test_an_episode_s_people_keep_each_identifier_in_its_own_field_raw_and_compacted(seats):
    """RecordEpisode took a turn's people as bare strings only, and GetEpisodeProvenance answered
    each as a handle (a Slack user id came back as a second person named "U07XK9Q2"). Its
    ``senders`` name each person with each identifier in its field: a raw row answers them, a
    compacted row the union of its members', and their identifiers are the row's subjects (what an
    erasure finds it by) though the request named none. A sender with no identifier is refused."""
    carla = er.ErasureSubject(handle="carla", external_id="U07XK9Q2", platform="slack")
    zed = er.ErasureSubject(external_id="U0ZED42", platform="slack")
    now = seats.clock.now()

    def request(turn_id: str, days_ago: int, *people: er.ErasureSubject) -> pb.RecordEpisodeRequest:
        end = now - timedelta(days=days_ago)
        return raw_episode(
            "ana", turn_id, end, "Weekly report request", "", "Sent it.", JIRA, tools_called=list(JIRA), senders=people
        )

    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await seats.stub.RecordEpisode(request("run-bad", 1, er.ErasureSubject(platform="slack")))
    code, info, bad = error_info(exc.value)
    assert (code, info.reason, bad.field_violations[0].field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_REQUIRED",
        "senders[0]",
    )

    def people(prov) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
        return sorted((s.handle, s.external_id, s.platform) for s in prov.subjects)

    async def provenance(episode_id: str):  # type: ignore[no-untyped-def]
        req = pb.GetEpisodeProvenanceRequest(company="acme", seat="ana", episode_id=episode_id)
        return (await seats.stub.GetEpisodeProvenance(req)).provenance

    both = [("", "U0ZED42", "slack"), ("carla", "U07XK9Q2", "slack")]
    raw = (await seats.stub.RecordEpisode(request("run-s1", 0, carla, zed))).episode
    assert people(await provenance(raw.id)) == both
    assert sorted(raw.subjects) == ["U07XK9Q2", "U0ZED42", "carla"]

    await seats.due()
    for i, who in enumerate(([carla], [zed], [carla, zed])):
        await seats.stub.RecordEpisode(request(f"run-c{i}", 40 + i, *who))
    await seats.run()
    [compacted] = [r for r in await seats.compacted() if tuple(r["tool_sequence"]) == JIRA]
    assert people(await provenance(str(compacted["id"]))) == both


async def test_a_model_briefly_down_fails_the_erasure_for_a_retry_and_only_a_refusal_deletes_the_row(
    make_settings, dsn, clock, edge_index, scripted_openai
):
    """A compacted row holds everyone else's summarised turns (their raw rows were folded away): a
    chain only briefly down while one person's erasure re-derives it (rate limited, a server
    error, a timeout) fails the owner's EraseRows as UNAVAILABLE, nothing erased, for the privacy
    worker to retry; the retry re-derives it. Only a final refusal deletes the row."""
    Chat(scripted_openai)
    status = {"code": 0}
    scripted_openai.rule("chat", lambda body: Reply(status=status["code"]) if status["code"] else None)
    settings = make_settings(
        learning={"episode_lifecycle": {"max_raw_episodes_per_agent": GATE}},
        providers={"llm": lifecycle_llm(scripted_openai), "auxiliary_chain": ["scripted"]},
    )
    async with open_app(settings, dsn, names=["episodes"], clock=clock, index=edge_index) as app:
        seats = Seats(app, clock)
        await seats.due()
        carla = await seats.add(40, JIRA, label="Weekly report request", subjects=["carla"])
        erin = await seats.add(41, JIRA, label="Weekly report request", subjects=["erin"])
        for i in range(2):
            await seats.add(42 + i, JIRA, label="Weekly report request", subjects=["dave"])
        await seats.run()
        [shared] = await seats.compacted()
        count_members = "SELECT count(*) FROM compaction_members WHERE compacted_id = $1"
        members = await app.infra.pool.fetchval(count_members, shared["id"])

        hers = subject_target("carla", str(uuid.uuid4()), turn_ids=[carla])
        for code in (429, 503):
            status["code"] = code
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await seats.stub.EraseRows(pb.EraseRowsRequest(target=hers))
            got, info, _ = error_info(exc.value)
            assert (got, info.reason) == (grpc.StatusCode.UNAVAILABLE, "SUMMARY_MODEL_UNAVAILABLE")
            [kept] = await seats.compacted()
            assert kept == shared  # nothing erased: the retry finds it whole
            assert await app.infra.pool.fetchval(count_members, shared["id"]) == members

        status["code"] = 0  # the model is back: the privacy worker's retry re-derives it
        report = (await seats.stub.EraseRows(pb.EraseRowsRequest(target=hers))).report
        assert [list(t.ids) for t in report.tables if t.table == "episodes:rederived"] == [[str(shared["id"])]]
        [after] = await seats.compacted()
        assert after["id"] == shared["id"] and after["count"] == 3

        status["code"] = 400  # a refusal is final: that erasure deletes the row (deleting is always correct)
        theirs = subject_target("erin", str(uuid.uuid4()), turn_ids=[erin])
        report = (await seats.stub.EraseRows(pb.EraseRowsRequest(target=theirs))).report
        assert str(shared["id"]) in {i for t in report.tables if t.table == "episodes" for i in t.ids}
        assert await seats.compacted() == []


async def test_a_row_folded_before_members_were_kept_loses_her_from_subjects_too(seats):
    """A compacted row from before ``compaction_members``: her handle is in ``subjects`` (its members'
    senders) as well as ``subjects_involved``, or in ``subjects`` alone. The erasure strips her from
    both (the others' part stays), and FindRows, asked after, finds nothing of her."""
    pool = seats.app.infra.pool
    now = seats.clock.now()
    insert = """
        INSERT INTO episodes (id, company, seat, kind, label, outcome, subjects, subjects_involved,
                              start_time, end_time, record_time, count, common_task_pattern)
        VALUES ($1, 'acme', 'ana', 'compacted', 'Weekly report', 'done', $2, $3, $4, $4, $4, 3, 'weekly report')"""
    both, only_subjects = uuid.uuid4(), uuid.uuid4()
    await pool.execute(insert, both, ["carla", "dave"], ["carla", "dave"], now)
    await pool.execute(insert, only_subjects, ["carla", "dave"], ["dave"], now)

    theirs = subject_target("carla", str(uuid.uuid4()))
    found = (await seats.stub.FindRows(pb.FindRowsRequest(target=theirs))).report
    assert {str(both), str(only_subjects)} <= {i for t in found.tables if t.table == "episodes" for i in t.ids}
    await seats.stub.EraseRows(pb.EraseRowsRequest(target=theirs))
    rows = await pool.fetch(
        "SELECT id, subjects, subjects_involved FROM episodes WHERE id = ANY($1::uuid[])", [both, only_subjects]
    )
    assert {r["id"]: (list(r["subjects"]), list(r["subjects_involved"])) for r in rows} == {
        both: (["dave"], ["dave"]),
        only_subjects: (["dave"], ["dave"]),
    }
    after = (await seats.stub.FindRows(pb.FindRowsRequest(target=subject_target("carla", str(uuid.uuid4()))))).report
    assert [i for t in after.tables if t.table == "episodes" for i in t.ids] == []
