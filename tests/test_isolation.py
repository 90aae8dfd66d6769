"""Tenant isolation, tried as an attacker would: two companies x two seats, every RPC of every
contract, with and without tokens.

Part one is generic — every RPC a server mounts, discovered from the descriptors, so a new RPC is
covered the day it ships: no token is UNAUTHENTICATED; a token of another company, or bound to
another seat or user, is PERMISSION_DENIED, identical whether or not the rows exist; the right
token is never refused for its identity (for an RPC that reads every seat's or user's rows of the
company, the right token is one bound to the company alone).

Part two is about data: each seat's rows carry a marker word of their own; a seat-bound token asks,
in a shuffled order (the seed is printed), for every id, run id, name and query of the other seats
through every read and write that takes one. It gets NOT_FOUND or an answer without another seat's
marker, and nothing of another seat changes.
"""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory, text_format
from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as ep_grpc
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kn_pb
from agentlearn.knowledge.v1 import knowledge_service_pb2_grpc as kn_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pf_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc as pf_grpc
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as prof_grpc
from agentlearn.reflector.v1 import reflector_service_pb2 as rf_pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as rf_grpc
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as skill_grpc
from libs.common.auth import INTERNAL_HEADER, SCOPES, required_scope
from tests.support.app import open_app
from tests.support.skills import skill_request
from tests.support.turns import raw_episode, turn_fields

COMPANIES = ("acme", "globex")
SEATS = ("ana", "ben")
IDENTITY = ("company", "seat", "observer", "user")
COMPANY_WIDE = {
    "agentlearn.episodes.v1.EpisodeService.ListEpisodeSeats",
    "agentlearn.knowledge.v1.KnowledgeService.GetDraftProvenance",
    "agentlearn.privacy.v1.PrivacyService.EraseCompany",
    "agentlearn.privacy.v1.PrivacyService.EraseSubject",
    "agentlearn.prefetch.v1.KnowledgeService.GetPage",  # the deprecated alias: an operator's read
    "agentlearn.sessions.v1.SessionService.GetLessonProvenance",
}
"""RPCs that reach every seat's or user's rows of the company: a token bound to one is refused."""


@pytest.fixture
async def app(make_settings, dsn, clock, local_embedder, edge_index):
    settings = make_settings(
        company_defaults={"roles": {"swe": {"knowledge_containers": ["eng"]}}},
    )
    async with open_app(settings, dsn, clock=clock, embedder=local_embedder, index=edge_index, auth_mode="tokens") as a:
        yield a


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


# ------------------------------------------------------------------------------------ every RPC


def _mounted_methods(app) -> list[Any]:  # type: ignore[no-untyped-def]
    pool = descriptor_pool.Default()
    methods = []
    for component in app.components.values():
        for reg in component.registrations:
            methods += list(pool.FindServiceByName(reg.service_name).methods)
    assert len(methods) > 40
    return methods


def _identity_fields(descriptor: Any, depth: int = 0) -> list[tuple[str, ...]]:
    """Paths of every company / seat / observer / user string field a request can carry."""
    paths: list[tuple[str, ...]] = []
    for fd in descriptor.fields:
        if fd.type == fd.TYPE_STRING and not fd.is_repeated and fd.name in IDENTITY:
            paths.append((fd.name,))
        elif (
            fd.type == fd.TYPE_MESSAGE
            and not fd.is_repeated
            and depth < 2
            and fd.message_type.full_name != Timestamp.DESCRIPTOR.full_name
        ):
            paths += [(fd.name, *rest) for rest in _identity_fields(fd.message_type, depth + 1)]
    return paths


def _request(method: Any, values: dict[str, str]) -> Any:
    msg = message_factory.GetMessageClass(method.input_type)()
    for path in _identity_fields(method.input_type):
        target = msg
        for part in path[:-1]:
            target = getattr(target, part)
        setattr(target, path[-1], values["seat" if path[-1] == "observer" else path[-1]])
    return msg


async def _call(app, method: Any, request: Any, metadata: Any) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    response_class = message_factory.GetMessageClass(method.output_type)
    stub = app.channel.unary_unary(
        f"/{method.containing_service.full_name}/{method.name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_class.FromString,
    )
    try:
        await stub(request, metadata=metadata, timeout=30)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        return err.code()


async def test_every_rpc_refuses_strangers_and_other_tenants_before_reading(app):
    every_scope = [s for s in SCOPES if s != "admin"]
    acme_ana, _ = await app.infra.tokens.issue("acme", every_scope, seat="ana", user="ann")
    acme_ana_admin, _ = await app.infra.tokens.issue("acme", ["admin"], seat="ana", user="ann")
    acme, _ = await app.infra.tokens.issue("acme", every_scope)
    acme_admin, _ = await app.infra.tokens.issue("acme", ["admin"])
    own = {"company": "acme", "seat": "ana", "user": "ann"}
    strangers = [
        {"company": "globex", "seat": "ana", "user": "ann"},  # another company
        {"company": "acme", "seat": "ben", "user": "ann"},  # another seat of its company
        {"company": "acme", "seat": "ana", "user": "bob"},  # another user
    ]
    checked = 0
    for method in _mounted_methods(app):
        fields = {path[-1] for path in _identity_fields(method.input_type)}
        assert "company" in fields, f"{method.full_name} names no company: it could not be scoped"
        code = await _call(app, method, _request(method, own), None)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method.full_name, code)
        for other in strangers:
            names_it = (
                (other["seat"] != "ana" and fields & {"seat", "observer"})
                or (other["user"] != "ann" and "user" in fields)
                or other["company"] != "acme"
            )
            if not names_it:
                continue
            code = await _call(app, method, _request(method, other), _bearer(acme_ana))
            assert code == grpc.StatusCode.PERMISSION_DENIED, (method.full_name, other, code)
            checked += 1
        own_token = (
            acme_ana_admin
            if required_scope(f"/{method.containing_service.full_name}/{method.name}") == "admin"
            else acme_ana
        )
        if method.full_name in COMPANY_WIDE:
            # Every seat's or user's rows: refused to a token bound to one, served to the company's.
            company_token = acme_admin if own_token == acme_ana_admin else acme
            request = _request(method, own)
            if "page_id" in method.input_type.fields_by_name:
                request.page_id = str(uuid.uuid4())  # a valid request: refused for the token alone
            if method.full_name.endswith("PrivacyService.EraseSubject"):
                request.subject.handle = "dave"
            code = await _call(app, method, request, _bearer(own_token))
            assert code == grpc.StatusCode.PERMISSION_DENIED, (method.full_name, code)
            assert await _call(app, method, request, _bearer(company_token)) not in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.INTERNAL,
            ), method.full_name
            own_token = company_token
        code = await _call(app, method, _request(method, own), _bearer(own_token))
        assert code not in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.INTERNAL,
        ), (
            method.full_name,
            code,
        )
    assert checked > 40


# ------------------------------------------------------------------------------------ the data


def _marker(company: str, seat: str) -> str:
    return f"zq{company}{seat}marker"


async def _seed(app, clock) -> dict[tuple[str, str], dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Through the owners, as a service: each seat gets a note, an episode, a skill, a profile, a
    reflection and each company a page, all carrying the seat's (or company's) marker."""
    internal = ((INTERNAL_HEADER, app.infra.internal_secret),)
    diary = diary_grpc.DiaryServiceStub(app.channel)
    episodes = ep_grpc.EpisodeServiceStub(app.channel)
    skills = skill_grpc.SkillServiceStub(app.channel)
    profiles = prof_grpc.ProfileServiceStub(app.channel)
    knowledge = kn_grpc.KnowledgeServiceStub(app.channel)
    reflector = rf_grpc.ReflectorServiceStub(app.channel)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for company, seat in itertools.product(COMPANIES, SEATS):
        m = _marker(company, seat)
        clock.advance(seconds=1)
        note = (
            await diary.WriteNote(
                diary_pb.WriteNoteRequest(
                    company=company,
                    seat=seat,
                    content=f"Billing export digest {m} goes out Mondays",
                    tier=diary_pb.NOTE_TIER_LONG,
                ),
                metadata=internal,
            )
        ).note
        turn_id = f"run-{company}-{seat}"
        # The turn the episode records and the reflector is then told about (it skipped).
        label, ask = "Task assigned: billing export", f"Run the billing export digest {m}"
        tools, end = ["billing.export", "slack.post"], clock.now() - timedelta(minutes=1)  # ran the 4 minutes before
        did = f"Exported billing {m} and posted the digest"
        recorded = raw_episode(
            seat,
            turn_id,
            end,
            label,
            ask,
            did,
            tools,
            ep_pb.TURN_OUTCOME_DONE,
            minutes=4,
            company=company,
            tools_called=tools,
            conversation_id=f"conv-{m}",
        )
        episode = (await episodes.RecordEpisode(recorded, metadata=internal)).episode
        summary, body = f"Export billing and post the digest {m}", f"# billing digest\n\n1. export {m}\n"
        learned = skill_request(seat, f"billing-digest-{seat}", summary, body, tools, [turn_id], company=company)
        skill = (await skills.CreateSkill(learned, metadata=internal)).skill
        await profiles.UpsertProfile(
            prof_pb.UpsertProfileRequest(
                company=company,
                observer=seat,
                subject=prof_pb.Subject(handle="bob", platform="slack"),
                communication_style=f"Terse {m}",
            ),
            metadata=internal,
        )
        await reflector.SubmitTurn(
            rf_pb.SubmitTurnRequest(
                turn=rf_pb.TurnCompleted(
                    role="swe",
                    **turn_fields(
                        company, seat, turn_id, label, ask, "Exported billing", rf_pb.TURN_OUTCOME_SKIPPED, end, 4
                    ),
                )
            ),
            metadata=internal,
        )
        rows[(company, seat)] = {"note": note.id, "episode": episode.id, "turn": turn_id, "skill": skill}
    for company in COMPANIES:
        page = (
            await knowledge.UpsertPage(
                kn_pb.UpsertPageRequest(
                    company=company,
                    container="eng",
                    title="Billing export runbook",
                    body=f"How to run the billing export digest {_marker(company, 'page')}.",
                ),
                metadata=internal,
            )
        ).page
        for seat in SEATS:
            rows[(company, seat)]["page"] = page.id
    await app.components["reflector"].service.harness.drain()
    return rows


def _clean(response: Any, foreign: list[str], echo: str, where: str) -> None:
    """No other seat's marker in ``response`` (the caller's own query, echoed back, aside)."""
    text = text_format.MessageToString(response).replace(echo, "")
    leaked = [m for m in foreign if m in text]
    assert not leaked, f"{where} shows {leaked}"


async def _not_found(call: Any, where: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), (
        f"{where}: {err.value.code()}"
    )


async def test_no_seat_reaches_another_seats_rows_by_id_run_id_name_or_query(app, clock):
    rows = await _seed(app, clock)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"isolation seed {seed}")
    ch = app.channel
    diary, episodes = diary_grpc.DiaryServiceStub(ch), ep_grpc.EpisodeServiceStub(ch)
    skills, profiles = skill_grpc.SkillServiceStub(ch), prof_grpc.ProfileServiceStub(ch)
    knowledge, reflector = kn_grpc.KnowledgeServiceStub(ch), rf_grpc.ReflectorServiceStub(ch)
    prefetch, builtins = pf_grpc.PrefetchServiceStub(ch), pf_grpc.BuiltinServiceStub(ch)
    internal = ((INTERNAL_HEADER, app.infra.internal_secret),)

    pairs = [(me, other) for me in rows for other in rows if me != other]
    rng.shuffle(pairs)
    for (company, seat), (o_company, o_seat) in pairs:
        token, _ = await app.infra.tokens.issue(company, ["memory:read", "memory:write"], seat=seat)
        md = _bearer(token)
        mine = {"company": company, "seat": seat}
        theirs = rows[(o_company, o_seat)]
        foreign = [_marker(c, s) for (c, s) in rows if (c, s) != (company, seat)] + [
            _marker(c, "page") for c in COMPANIES if c != company
        ]

        skill = theirs["skill"]
        id_calls = [
            (diary.GetNote(diary_pb.GetNoteRequest(**mine, note_id=theirs["note"]), metadata=md), "GetNote"),
            (diary.DeleteNote(diary_pb.DeleteNoteRequest(**mine, note_id=theirs["note"]), metadata=md), "DeleteNote"),
            (
                episodes.GetEpisode(ep_pb.GetEpisodeRequest(**mine, episode_id=theirs["episode"]), metadata=md),
                "GetEpisode",
            ),
            (
                episodes.GetEpisode(ep_pb.GetEpisodeRequest(**mine, turn_id=theirs["turn"]), metadata=md),
                "GetEpisode(turn)",
            )
            if (company, seat) != (o_company, o_seat)
            else None,
            (skills.GetSkill(skill_pb.GetSkillRequest(**mine, skill_id=skill.id), metadata=md), "GetSkill"),
            (skills.UseSkill(skill_pb.UseSkillRequest(**mine, skill_id=skill.id), metadata=md), "UseSkill"),
            (
                skills.RefineSkill(
                    skill_pb.RefineSkillRequest(**mine, skill_id=skill.id, body="# hijacked\n"), metadata=md
                ),
                "RefineSkill",
            ),
            (skills.ArchiveSkill(skill_pb.ArchiveSkillRequest(**mine, skill_id=skill.id), metadata=md), "ArchiveSkill"),
            (skills.PinSkill(skill_pb.PinSkillRequest(**mine, skill_id=skill.id), metadata=md), "PinSkill"),
            (
                skills.ListSkillVersions(skill_pb.ListSkillVersionsRequest(**mine, skill_id=skill.id), metadata=md),
                "ListSkillVersions",
            ),
            (
                knowledge.GetPage(
                    kn_pb.GetPageRequest(
                        reader=kn_pb.Reader(company=company, seat=seat, role="swe"), page_id=theirs["page"]
                    ),
                    metadata=md,
                ),
                "GetPage",
            )
            if o_company != company
            else None,
        ]
        if o_company != company or o_seat != seat:
            id_calls.append(
                (
                    reflector.GetReflection(rf_pb.GetReflectionRequest(**mine, turn_id=theirs["turn"]), metadata=md),
                    "GetReflection",
                )
            )
        calls = [c for c in id_calls if c is not None]
        rng.shuffle(calls)
        for call, what in calls:
            await _not_found(call, f"seed {seed}: {company}/{seat} {what}")
        theirs_ref = diary_pb.GetNoteRequest(company=o_company, seat=o_seat, note_id=theirs["note"])
        uses = (await diary.GetNote(theirs_ref, metadata=internal)).note.use_count
        marked = await diary.MarkNotesUsed(
            diary_pb.MarkNotesUsedRequest(**mine, note_ids=[theirs["note"]]), metadata=md
        )
        assert marked.marked_count == 0
        assert (await diary.GetNote(theirs_ref, metadata=internal)).note.use_count == uses
        consolidated = await episodes.MarkEpisodesConsolidated(
            ep_pb.MarkEpisodesConsolidatedRequest(**mine, turn_ids=[theirs["turn"]], skill_id=str(uuid.uuid4())),
            metadata=md,
        )
        assert consolidated.marked_count == 0

        query = f"billing export digest {_marker(o_company, o_seat)}"
        reads = [
            (diary.RecallNotes(diary_pb.RecallNotesRequest(**mine, query=query), metadata=md), "RecallNotes"),
            (diary.ListNotes(diary_pb.ListNotesRequest(**mine), metadata=md), "ListNotes"),
            (episodes.SearchEpisodes(ep_pb.SearchEpisodesRequest(**mine, query=query), metadata=md), "SearchEpisodes"),
            (episodes.ListEpisodes(ep_pb.ListEpisodesRequest(**mine), metadata=md), "ListEpisodes"),
            (skills.ListSkills(skill_pb.ListSkillsRequest(**mine), metadata=md), "ListSkills"),
            (
                profiles.ListProfiles(prof_pb.ListProfilesRequest(company=company, observer=seat), metadata=md),
                "ListProfiles",
            ),
            (
                profiles.GetProfiles(
                    prof_pb.GetProfilesRequest(
                        company=company, observer=seat, subjects=[prof_pb.Subject(handle="bob", platform="slack")]
                    ),
                    metadata=md,
                ),
                "GetProfiles",
            ),
            (reflector.ListReflections(rf_pb.ListReflectionsRequest(**mine), metadata=md), "ListReflections"),
            (
                prefetch.BuildTurnContext(
                    pf_pb.BuildTurnContextRequest(
                        **mine,
                        role="swe",
                        turn_id=f"t-{uuid.uuid4().hex[:6]}",
                        ask=query,
                        senders=[pf_pb.Counterparty(handle="bob", platform="slack")],
                    ),
                    metadata=md,
                ),
                "BuildTurnContext",
            ),
            (
                builtins.QueryEpisodes(pf_pb.QueryEpisodesRequest(**mine, query=query), metadata=md),
                "QueryEpisodes",
            ),
            (
                builtins.RefreshMemory(
                    pf_pb.RefreshMemoryRequest(
                        **mine, role="swe", turn_id=f"r-{uuid.uuid4().hex[:6]}", context_hint=query
                    ),
                    metadata=md,
                ),
                "RefreshMemory",
            ),
            (
                builtins.SearchKnowledge(pf_pb.SearchKnowledgeRequest(**mine, role="swe", query=query), metadata=md),
                "SearchKnowledge",
            ),
        ]
        rng.shuffle(reads)
        for call, what in reads:
            _clean(await call, foreign, query, f"seed {seed}: {company}/{seat} {what}")

    # Nothing of anyone changed: every note is still there, and every skill is at its first
    # version, in its first state and unpinned.
    for (company, seat), r in rows.items():
        await diary.GetNote(diary_pb.GetNoteRequest(company=company, seat=seat, note_id=r["note"]), metadata=internal)
        skill = (
            await skills.GetSkill(
                skill_pb.GetSkillRequest(company=company, seat=seat, skill_id=r["skill"].id), metadata=internal
            )
        ).skill
        assert (skill.version, skill.pinned, skill.body, skill.state) == (
            r["skill"].version,
            False,
            r["skill"].body,
            r["skill"].state,
        )
