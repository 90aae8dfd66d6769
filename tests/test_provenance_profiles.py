"""Profile provenance (issue 17): every observation merged into a counterparty profile keeps its
own provenance (the turn, the person whose messages it was derived from, the model, the prompt
version, the writer), and each entry of the profile is followed back to the turn that added it;
an erasure of a person finds through that provenance what rests on them in someone else's profile;
GetProfileProvenance refuses a bad id, a missing profile and another company's.

Real parts: the services on a loopback gRPC server, Postgres, the reflector's profiler on the
offline model rules, the privacy service's erasure job.
"""

from __future__ import annotations

import asyncpg
import grpc
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.common.v1 import provenance_pb2
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pr_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from services.profiles.domain import Limits
from services.profiles.service import ProfileService
from services.profiles.store import PostgresProfileStore
from tests.support.app import open_app
from tests.support.erasure_checks import subject_target
from tests.support.grpc_errors import error_info
from tests.support.turns import message, turn

pytestmark = pytest.mark.timeout(300)

NAMES = [
    "diary", "episodes", "skills", "profiles", "reflector", "knowledge", "prefetch", "sessions", "telemetry", "privacy",
]  # fmt: skip


@pytest.fixture
async def app(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_app(make_settings(), dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as a:
        yield a


async def _submit(app, clock, run: str, messages) -> None:  # type: ignore[no-untyped-def]
    reflector = rf_grpc.ReflectorServiceStub(app.channel)
    t = turn(run, now=clock.now(), seat="ana", messages=messages, label="Message from Carla: Slack message")
    await reflector.SubmitTurn(rf_pb.SubmitTurnRequest(turn=t))
    await app.components["reflector"].service.harness.drain()
    clock.advance(seconds=60)


async def _profile(stub, handle: str) -> pr_pb.Profile:  # type: ignore[no-untyped-def]
    resp = await stub.GetProfiles(
        pr_pb.GetProfilesRequest(
            company="acme", observer="ana", subjects=[pr_pb.Subject(handle=handle, platform="slack")]
        )
    )
    [profile] = resp.profiles
    return profile


async def test_a_profile_entry_is_followed_back_to_the_turn_and_the_person_that_taught_it(app, clock):
    stub = pr_grpc.ProfileServiceStub(app.channel)
    await _submit(
        app,
        clock,
        "run-001",
        [message("carla", "Let's go with Postgres for the billing ledger."), message("dave", "Kafka lag is fine.")],
    )
    await _submit(app, clock, "run-002", [message("carla", "Please never page me about staging alerts.")])
    carla = await _profile(stub, "carla")
    resp = await stub.GetProfileProvenance(
        pr_pb.GetProfileProvenanceRequest(company="acme", observer="ana", profile_id=carla.id)
    )
    # One observation per turn that observed her, newest first, each with its own provenance.
    assert [list(o.provenance.turn_ids) for o in resp.observations] == [["run-002"], ["run-001"]]
    for obs in resp.observations:
        prov = obs.provenance
        # Only her: the turn's other sender (dave) is no source of her profile.
        assert [(s.handle, s.platform) for s in prov.subjects] == [("carla", "slack")]
        assert prov.model == "offline-rules" and len(prov.prompt_version) == 16 and prov.writer == "profiler"
        assert prov.work_key == f"work-{prov.turn_ids[0]}"
    # The entries: the decision came from the first turn, the sensitivity from the second.
    origin = {(e.field, e.text): list(e.turn_ids) for e in resp.entries}
    [decision] = [k for k in origin if k[0] == "past_decisions"]
    [care] = [k for k in origin if k[0] == "sensitivities"]
    assert "Postgres" in decision[1] and origin[decision] == ["run-001"]
    assert "staging" in care[1] and origin[care] == ["run-002"]
    # Each traced observation id is one of the observations returned.
    ids = {o.id for o in resp.observations}
    assert all(set(e.observation_ids) <= ids and e.observation_ids for e in resp.entries)
    # The profile's own provenance, as shipped: the person and the last observing turn (now with
    # that observation's model and prompt version).
    assert list(resp.provenance.turn_ids) == [carla.last_turn_id] == ["run-002"]
    assert (
        resp.provenance.model == "offline-rules"
        and resp.provenance.prompt_version == resp.observations[0].provenance.prompt_version
    )
    # Dave's profile rests on his message alone.
    dave = await _profile(stub, "dave")
    d = await stub.GetProfileProvenance(
        pr_pb.GetProfileProvenanceRequest(company="acme", observer="ana", profile_id=dave.id)
    )
    assert [[s.handle for s in o.provenance.subjects] for o in d.observations] == [["dave"]]


async def test_erasing_a_person_removes_what_rests_on_them_from_another_persons_profile(app, clock, dsn):
    stub = pr_grpc.ProfileServiceStub(app.channel)

    def prov(run: str, handle: str) -> provenance_pb2.Provenance:
        return provenance_pb2.Provenance(
            turn_ids=[run], subjects=[er.ErasureSubject(handle=handle, platform="slack")], writer="test"
        )

    dave = pr_pb.Subject(handle="dave", platform="slack")
    # Dave's profile: one observation from his own messages, one derived from Carla's (say, she
    # relayed his preference); neither text names her.
    await stub.UpsertProfile(
        pr_pb.UpsertProfileRequest(
            company="acme", observer="ana", subject=dave, topics=["backups", "zeppelin"], turn_id="run-1",
            provenance=prov("run-1", "dave"),
        )
    )  # fmt: skip
    await stub.UpsertProfile(
        pr_pb.UpsertProfileRequest(
            company="acme", observer="ana", subject=dave, topics=["zeppelin", "airships"],
            sensitivities=["hates long meetings"], turn_id="run-2", provenance=prov("run-2", "carla"),
        )
    )  # fmt: skip
    privacy = pv_grpc.PrivacyServiceStub(app.channel)
    found = await stub.FindRows(
        pr_pb.FindRowsRequest(target=subject_target("carla", "00000000-0000-0000-0000-000000000001"))
    )
    tables = {t.table: t for t in found.report.tables}
    assert tables["profile_observations"].count == 1 and tables["counterparty_profiles"].changed == 1
    resp = await privacy.EraseSubject(
        pv.EraseSubjectRequest(company="acme", subject=er.ErasureSubject(handle="carla", platform="slack"))
    )
    await app.components["privacy"].service.worker.drain()
    erasure = (await privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))).erasure
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED and erasure.verified, erasure.reason
    after = await _profile(stub, "dave")
    # "airships" and the sensitivity rested on her alone: gone. "zeppelin" his own observation
    # also stated: kept. "backups": his.
    assert list(after.topics) == ["zeppelin", "backups"] and list(after.sensitivities) == []
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT subjects, turn_id FROM profile_observations WHERE company = 'acme'")
    finally:
        await conn.close()
    assert [(list(r["subjects"]), r["turn_id"]) for r in rows] == [(["dave"], "run-1")]


async def test_get_profile_provenance_refusals(app):
    stub = pr_grpc.ProfileServiceStub(app.channel)
    created = await stub.UpsertProfile(
        pr_pb.UpsertProfileRequest(
            company="acme", observer="ana", subject=pr_pb.Subject(handle="carla", platform="slack"), topics=["x"]
        )
    )
    pid = created.profile.id

    async def refused(company: str, observer: str, profile_id: str) -> tuple:  # type: ignore[type-arg]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetProfileProvenance(
                pr_pb.GetProfileProvenanceRequest(company=company, observer=observer, profile_id=profile_id)
            )
        return error_info(err.value)

    code, _, bad = await refused("acme", "ana", "not-a-uuid")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and [v.field for v in bad.field_violations] == ["profile_id"]
    code, info, _ = await refused("acme", "ana", "7d0d9a8e-1111-4222-8333-444455556666")
    assert code == grpc.StatusCode.NOT_FOUND and info.reason == "PROFILE_NOT_FOUND"
    # Another observer's, another company's: not found (never told it exists).
    for company, observer in [("acme", "ben"), ("globex", "ana")]:
        code, info, _ = await refused(company, observer, pid)
        assert code == grpc.StatusCode.NOT_FOUND and info.reason == "PROFILE_NOT_FOUND"


async def test_the_postgres_store_bounds_the_history_and_keeps_what_added_each_entry(dsn, clock):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        service = ProfileService(
            store=PostgresProfileStore(pool), clock=clock, events=_NoEvents(), limits=Limits(kept_observations=2)
        )
        subject = ("carla", "", "slack")
        profile, _ = await service.upsert_profile("acme", "ana", subject, "Brief.", [], [], ["kafka"], "run-1")
        for n in range(2, 8):
            clock.advance(seconds=60)
            topics = ["kafka", "billing"] if n == 3 else ["kafka"]
            await service.upsert_profile("acme", "ana", subject, "", [], [], topics, f"run-{n}")
        _, observations, entries = await service.provenance("acme", "ana", str(profile.id))
        # run-1 added the style and kafka, run-3 billing; run-7 and run-6 are the newest two.
        assert [o.source.turn_ids[0] for o in observations] == ["run-7", "run-6", "run-3", "run-1"]
        assert {e.text: e.observations[0].source.turn_ids[0] for e in entries} == {
            "Brief.": "run-1",
            "kafka": "run-1",
            "billing": "run-3",
        }
        assert await pool.fetchval("SELECT count(*) FROM profile_observations") == 4
    finally:
        await pool.close()


class _NoEvents:
    async def emit(self, kind: str, **payload: object) -> None:
        return None
