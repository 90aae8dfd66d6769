"""A person's erasure and a skill's versions: once it SUCCEEDED, no version record (the live row's
number, change, reason, key and provenance, nor a kept version's) says anything of hers, and a later
version cannot carry a leftover into the kept history."""

from __future__ import annotations

import asyncpg
import pytest

from agentlearn.common.v1 import erasure_pb2 as er
from agentlearn.common.v1.provenance_pb2 import Provenance
from agentlearn.privacy.v1 import privacy_service_pb2 as pv
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk
from tests.support.app import open_app
from tests.support.skills import skill_request
from tests.support.turns import message, turn
from tests.test_privacy import NAMES, Env

pytestmark = pytest.mark.timeout(300)

EXT = "U07XK9Q2"
CARLA = er.ErasureSubject(handle="carla", external_id=EXT, platform="slack")
BOB = er.ErasureSubject(handle="bob", platform="slack")
SEAT = {"company": "acme", "seat": "ana"}
BASE = "# {n}\n\n1. Read the issue.\n2. Open the PR.\n"
# What of hers the skills service was given: her name, her run, her work key, her words.
HERS = ["carla", "run-c2", "work-run-c2", "euro"]


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):  # type: ignore[no-untyped-def]
    settings = make_settings(companies={"acme": {"roles": {"swe": {"knowledge_containers": ["team"]}}}})
    async with open_app(settings, dsn, names=NAMES, clock=clock, embedder=local_embedder, index=edge_index) as app:
        yield Env(app)


async def _submit(env: Env, clock, run: str, msg: rf_pb.InboundInteraction) -> None:  # type: ignore[no-untyped-def]
    """A real turn, so the erasure's collection step knows which runs are hers."""
    await env.reflector.SubmitTurn(
        rf_pb.SubmitTurnRequest(turn=turn(run, now=clock.now(), messages=[msg], tools=["x_tool"]))
    )
    await env.harness.drain()
    clock.advance(seconds=60)


def _carla(body: str) -> rf_pb.InboundInteraction:
    sender = rf_pb.Sender(handle="carla", external_id=EXT, platform="slack", display_name="Carla")
    return rf_pb.InboundInteraction(sender=sender, body=body)


async def _skills_rows_naming(dsn: str, word: str) -> list[str]:
    """Every skills row whose any column (as text) holds ``word``: the attacker's view."""
    conn = await asyncpg.connect(dsn)
    try:
        found = []
        for table in ("synthesized_skills", "synthesized_skill_versions", "skill_practice_bullets", "skill_proposals"):
            n = await conn.fetchval(f"SELECT count(*) FROM {table} t WHERE t::text ILIKE $1", f"%{word}%")
            if n:
                found.append(f"{table}: {n}")
        return found
    finally:
        await conn.close()


async def _erase(env: Env, request_id: str = "") -> pv.Erasure:
    resp = await env.privacy.EraseSubject(
        pv.EraseSubjectRequest(
            company="acme",
            subject=er.ErasureSubject(handle="carla", platform="slack"),
            names=["Carla Moreno"],
            request_id=request_id,
        )
    )
    await env.worker.drain()
    got = await env.privacy.GetErasure(pv.GetErasureRequest(company="acme", erasure_id=resp.erasure.id))
    return got.erasure


async def test_no_version_record_of_a_skill_keeps_her_words_runs_or_name(env, dsn, clock):  # type: ignore[no-untyped-def]
    await _submit(env, clock, "run-b1", message("bob", "please open the PR for the ticket"))
    await _submit(env, clock, "run-c1", _carla("please open the PR for the billing ticket"))
    await _submit(env, clock, "run-b2", message("bob", "open the PR again"))
    await _submit(env, clock, "run-c2", _carla("open the PR for the euro export"))

    async def create(name: str) -> sk.Skill:
        tools = [name.replace("-", "_") + "_a", name.replace("-", "_") + "_b"]
        prov = Provenance(subjects=[BOB, CARLA], model="m", prompt_version="p", writer="synthesizer")
        req = skill_request(
            "ana", name, f"use for {name}", BASE.format(n=name), tools, ["run-b1", "run-c1"],
            trigger=sk.SKILL_TRIGGER_CLUSTERED, cluster_size=2, provenance=prov,
        )  # fmt: skip
        return (await env.skills.CreateSkill(req)).skill

    async def observe(skill_id: str, run: str, who: er.ErasureSubject, text: str) -> None:
        await env.skills.AppendSkillObservation(
            sk.AppendSkillObservationRequest(
                **SEAT, skill_id=skill_id, kind=sk.OBSERVATION_KIND_OBSERVED, observation=text, turn_id=run,
                request_id=f"{run}:refiner",
                provenance=Provenance(
                    turn_ids=[run], work_key=f"work-{run}", subjects=[who], model="j", writer="refiner"
                ),
            )
        )  # fmt: skip

    # 1: Bob's observation, then hers (as the refiner sends it): hers is the live version.
    observed = await create("zz-observed")
    await observe(observed.id, "run-b2", BOB, "link the issue")
    await observe(observed.id, "run-c2", CARLA, "check the euro rounding rule first")
    # 2: a refinement in her turn is the live version.
    refined = await create("zz-refined-by-her")
    await env.skills.RefineSkill(
        sk.RefineSkillRequest(
            **SEAT, skill_name="zz-refined-by-her",
            body=BASE.format(n="zz-refined-by-her") + "3. Round euros half-even.\n",
            reason="the billing export rounds euros half-even", turn_id="run-c2", request_id="run-c2:call-9",
        )
    )  # fmt: skip
    # 3: Bob's refinement whose reason names her.
    named = await create("zz-reason-names-her")
    await env.skills.RefineSkill(
        sk.RefineSkillRequest(
            **SEAT, skill_name="zz-reason-names-her", body=BASE.format(n="zz-reason-names-her") + "3. Wait for CI.\n",
            reason="Carla Moreno asked for a CI wait", turn_id="run-b2", request_id="run-b2:call-3",
            provenance=Provenance(subjects=[BOB]),
        )
    )  # fmt: skip
    for word in HERS:  # the seeding put every part of her in
        assert await _skills_rows_naming(dsn, word), word

    erasure = await _erase(env)
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED
    for word in HERS:
        assert await _skills_rows_naming(dsn, word) == [], word

    # Each live version that rested on her gave way, record and all, to the version before it.
    async def versions(skill: sk.Skill) -> list[tuple[int, int, str, bool]]:
        got = await env.skills.ListSkillVersions(sk.ListSkillVersionsRequest(**SEAT, skill_id=skill.id))
        return [(v.version, v.change, v.reason, v.current) for v in got.versions]

    assert await versions(observed) == [
        (2, sk.SKILL_CHANGE_OBSERVATION_APPENDED, "- Observed in practice: link the issue", True),
        (1, sk.SKILL_CHANGE_CREATED, "", False),
    ]
    assert await versions(refined) == [(1, sk.SKILL_CHANGE_CREATED, "", True)]
    assert await versions(named) == [(1, sk.SKILL_CHANGE_CREATED, "", True)]
    prov = await env.skills.GetSkillProvenance(sk.GetSkillProvenanceRequest(**SEAT, skill_id=observed.id))
    assert [(v.version, list(v.provenance.turn_ids), v.provenance.work_key) for v in prov.versions] == [
        (2, ["run-b2"], "work-run-b2"),
        (1, ["run-b1"], ""),
    ]

    # A later version supersedes the live row: nothing of hers moves into the kept history, and a
    # second erasure finds nothing left in skills.
    await observe(observed.id, "run-b3", BOB, "tag the reviewer")
    for word in HERS:
        assert await _skills_rows_naming(dsn, word) == [], word
    again = await _erase(env, request_id="second")
    assert again.state == pv.ERASURE_STATE_SUCCEEDED
    assert [list(r.tables) for r in again.reports if r.owner == "skills"] in ([], [[]])


async def test_a_shared_bullets_work_key_goes_with_her_run(env, dsn, clock):  # type: ignore[no-untyped-def]
    """A kept observation from her turn and Bob's: it stays (Bob's too), without her run or its work key."""
    await _submit(env, clock, "run-b1", message("bob", "please open the PR for the ticket"))
    await _submit(env, clock, "run-c2", _carla("open the PR for the release"))
    req = skill_request(
        "ana", "zz-shared", "use for zz-shared", BASE.format(n="zz-shared"), ["zz_a", "zz_b"], ["run-b1"],
        provenance=Provenance(subjects=[BOB], writer="synthesizer"),
    )  # fmt: skip
    skill = (await env.skills.CreateSkill(req)).skill
    await env.skills.AppendSkillObservation(
        sk.AppendSkillObservationRequest(
            **SEAT, skill_id=skill.id, kind=sk.OBSERVATION_KIND_OBSERVED, observation="link the issue",
            turn_id="run-b1", request_id="run-b1:refiner",
            provenance=Provenance(turn_ids=["run-b1", "run-c2"], work_key="work-run-c2", subjects=[BOB, CARLA]),
        )
    )  # fmt: skip

    erasure = await _erase(env)
    assert erasure.state == pv.ERASURE_STATE_SUCCEEDED
    prov = await env.skills.GetSkillProvenance(sk.GetSkillProvenanceRequest(**SEAT, skill_id=skill.id))
    assert [b.text for b in prov.bullets] == ["- Observed in practice: link the issue"]
    assert [(list(b.provenance.turn_ids), b.provenance.work_key) for b in prov.bullets] == [(["run-b1"], "")]
    for word in HERS:
        assert await _skills_rows_naming(dsn, word) == [], word
