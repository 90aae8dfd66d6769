"""In-memory fakes of the reflector workers' ports (services/reflector/workers/ports.py).

Each keeps the state its service would and answers with that service's own messages, following the
behaviour the workers rely on (idempotency keys, a work key collapsing a redelivered run, a name
taken answering ALREADY_EXISTS as a status). Every request is also kept in ``calls`` so a test can
say what a worker asked. No Postgres, no model, no gRPC server: the workers run in microseconds.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.message import Message

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.auxmodel import AuxiliaryModel, OfflineRules, build_providers
from libs.common.clock import Clock, ManualClock
from libs.common.config import Settings
from libs.common.field_copy import to_pb
from libs.common.grpcserver import rpc_error
from libs.common.outcomes import TurnOutcome
from libs.common.protoconv import timestamp
from services.reflector.domain import Interaction, OfferedSkill, Sender, Trigger, Turn
from services.reflector.workers import persist_decider, refiner, synthesizer
from services.reflector.workers.base import WorkerContext
from services.reflector.workers.ports import WorkerPorts
from tests.unit.fakes.events import RecordedEvents as FakeEvents


@dataclass(frozen=True)
class _Status:
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()


def _status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a wire call with this status raises in its caller (what the adapters pass on)."""
    return rpc_error(_Status(code, details))


@dataclass
class FakeDiary:
    clock: Clock
    notes: list[diary_pb.Note] = field(default_factory=list)
    calls: list[Message] = field(default_factory=list)
    _by_request: dict[str, diary_pb.Note] = field(default_factory=dict)

    def seed(self, company: str, seat: str, content: str) -> None:
        self.notes.append(diary_pb.Note(id=str(uuid.uuid4()), company=company, seat=seat, content=content))

    async def recall_notes(self, request: diary_pb.RecallNotesRequest) -> diary_pb.RecallNotesResponse:
        self.calls.append(request)
        mine = [n for n in self.notes if n.company == request.company and n.seat == request.seat]
        newest = list(reversed(mine))[: request.recency_limit]
        return diary_pb.RecallNotesResponse(candidates=[diary_pb.RecallCandidate(note=n) for n in newest])

    def delete(self, note_id: str) -> None:
        """An operator's DeleteNote (or an erasure): the note goes, its key stays spent."""
        self.notes = [n for n in self.notes if n.id != note_id]

    async def write_note(self, request: diary_pb.WriteNoteRequest) -> diary_pb.WriteNoteResponse:
        self.calls.append(request)
        if request.request_id and request.request_id in self._by_request:
            first = self._by_request[request.request_id]
            if all(n.id != first.id for n in self.notes):  # the key outlives its note
                return diary_pb.WriteNoteResponse(created=False, note_removed=True)
            return diary_pb.WriteNoteResponse(note=first, created=False)
        note = to_pb(diary_pb.Note, request, "company seat content tier source turn_id", id=str(uuid.uuid4()))
        if request.ttl_days:
            note.expire_time.CopyFrom(timestamp(self.clock.now() + timedelta(days=request.ttl_days)))
        self.notes.append(note)
        if request.request_id:
            self._by_request[request.request_id] = note
        return diary_pb.WriteNoteResponse(note=note, created=True)


@dataclass
class FakeEpisodes:
    episodes: dict[str, ep_pb.Episode] = field(default_factory=dict)
    """By turn id."""
    calls: list[Message] = field(default_factory=list)

    async def record_episode(self, request: ep_pb.RecordEpisodeRequest) -> ep_pb.RecordEpisodeResponse:
        self.calls.append(request)
        if request.turn_id in self.episodes:
            return ep_pb.RecordEpisodeResponse(episode=self.episodes[request.turn_id], created=False)
        for ep in self.episodes.values():
            if request.work_key and ep.company == request.company and ep.work_key == request.work_key:
                return ep_pb.RecordEpisodeResponse(episode=ep, collapsed=True)
        ep = to_pb(
            ep_pb.Episode,
            request,
            "company seat turn_id label ask outcome tool_sequence work_key",
            id=str(uuid.uuid4()),
        )
        self.episodes[request.turn_id] = ep
        return ep_pb.RecordEpisodeResponse(episode=ep, created=True)

    async def mark_consolidated(
        self, request: ep_pb.MarkEpisodesConsolidatedRequest
    ) -> ep_pb.MarkEpisodesConsolidatedResponse:
        self.calls.append(request)
        marked = 0
        for turn_id in request.turn_ids:
            ep = self.episodes.get(turn_id)
            if ep is not None and ep.company == request.company and not ep.consolidated_into_skill_id:
                ep.consolidated_into_skill_id = request.skill_id
                marked += 1
        return ep_pb.MarkEpisodesConsolidatedResponse(marked_count=marked)


@dataclass
class FakeSkills:
    """A seat's catalogue. The candidate gate answers as the service does, the cap first:
    CATALOGUE_FULL at ``max_skills`` live skills, else DUPLICATE for a skill (archived included)
    with the same tool set (the service's Jaccard at its threshold of 1.0, the strictest case); the
    duplicate is named under either verdict."""

    max_skills: int = 50
    skills: dict[str, sk_pb.Skill] = field(default_factory=dict)
    calls: list[Message] = field(default_factory=list)
    uses: dict[str, int] = field(default_factory=dict)
    _requests: set[str] = field(default_factory=set)

    def seed(self, company: str, seat: str, name: str, tools: list[str], *, archived: bool = False) -> sk_pb.Skill:
        skill = sk_pb.Skill(
            id=str(uuid.uuid4()),
            company=company,
            seat=seat,
            name=name,
            summary=f"{name} summary",
            body=f"# {name}",
            tool_sequence=tools,
            trigger=sk_pb.SKILL_TRIGGER_CLUSTERED,
            state=sk_pb.SKILL_STATE_ARCHIVED if archived else sk_pb.SKILL_STATE_ACTIVE,
            version=1,
        )
        self.skills[skill.id] = skill
        return skill

    def _live(self, company: str, seat: str) -> list[sk_pb.Skill]:
        return [
            s
            for s in self.skills.values()
            if s.company == company and s.seat == seat and s.state != sk_pb.SKILL_STATE_ARCHIVED
        ]

    async def list_skills(self, request: sk_pb.ListSkillsRequest) -> sk_pb.ListSkillsResponse:
        self.calls.append(request)
        mine = self._live(request.company, request.seat)
        start = int(request.page_token or 0)
        page = mine[start : start + request.page_size]
        more = start + request.page_size < len(mine)
        return sk_pb.ListSkillsResponse(
            skills=page, next_page_token=str(start + request.page_size) if more else "", total_size=len(mine)
        )

    async def get_skill(self, request: sk_pb.GetSkillRequest) -> sk_pb.GetSkillResponse:
        self.calls.append(request)
        for s in self.skills.values():
            if s.company == request.company and (s.id == request.skill_id or s.name == request.skill_name):
                return sk_pb.GetSkillResponse(skill=s)
        raise _status(grpc.StatusCode.NOT_FOUND, "no such skill")

    async def check_candidate(self, request: sk_pb.CheckSkillCandidateRequest) -> sk_pb.CheckSkillCandidateResponse:
        self.calls.append(request)
        live = self._live(request.company, request.seat)
        out = sk_pb.CheckSkillCandidateResponse(
            gate=sk_pb.CANDIDATE_GATE_OPEN, live_skill_count=len(live), max_skills=self.max_skills
        )
        same = [s for s in self.skills.values() if s.company == request.company and s.seat == request.seat]
        for s in same:
            if set(s.tool_sequence) == set(request.tool_set):
                out.gate = sk_pb.CANDIDATE_GATE_DUPLICATE
                out.duplicate.CopyFrom(sk_pb.SkillMatch(id=s.id, name=s.name, similarity=1.0, state=s.state))
                break
        if len(live) >= self.max_skills:
            out.gate = sk_pb.CANDIDATE_GATE_CATALOGUE_FULL
        return out

    async def create_skill(self, request: sk_pb.CreateSkillRequest) -> sk_pb.CreateSkillResponse:
        self.calls.append(request)
        if any(
            s.company == request.company and s.seat == request.seat and s.name == request.name
            for s in self.skills.values()
        ):
            raise _status(grpc.StatusCode.ALREADY_EXISTS, f"a skill named {request.name} exists")
        skill = to_pb(
            sk_pb.Skill,
            request,
            "company seat name summary body tool_sequence trigger cluster_size source_turn_ids",
            id=str(uuid.uuid4()),
            state=sk_pb.SKILL_STATE_ACTIVE,
            version=1,
        )
        self.skills[skill.id] = skill
        return sk_pb.CreateSkillResponse(skill=skill)

    async def append_observation(
        self, request: sk_pb.AppendSkillObservationRequest
    ) -> sk_pb.AppendSkillObservationResponse:
        self.calls.append(request)
        skill = self.skills[request.skill_id]
        if skill.state == sk_pb.SKILL_STATE_ARCHIVED:
            return sk_pb.AppendSkillObservationResponse(
                skill=skill, skipped=True, skip_reason=sk_pb.OBSERVATION_SKIP_REASON_ARCHIVED
            )
        if request.request_id not in self._requests:
            self._requests.add(request.request_id)
            skill.body += f"\n- {request.observation}"
            skill.version += 1
        return sk_pb.AppendSkillObservationResponse(skill=skill)

    async def mark_used(self, request: sk_pb.MarkSkillsUsedRequest) -> sk_pb.MarkSkillsUsedResponse:
        self.calls.append(request)
        if request.request_id in self._requests:
            return sk_pb.MarkSkillsUsedResponse(already_applied=True)
        self._requests.add(request.request_id)
        marked = 0
        for skill_id in request.skill_ids:
            skill = self.skills.get(skill_id)
            if skill is not None and skill.state != sk_pb.SKILL_STATE_ARCHIVED:
                self.uses[skill_id] = self.uses.get(skill_id, 0) + 1
                marked += 1
        return sk_pb.MarkSkillsUsedResponse(marked_count=marked)


@dataclass
class FakeProfiles:
    """Kept for the port's completeness: the profiler still calls its stub (another change)."""

    calls: list[Message] = field(default_factory=list)

    async def upsert_profile(self, request: pr_pb.UpsertProfileRequest) -> pr_pb.UpsertProfileResponse:
        self.calls.append(request)
        return pr_pb.UpsertProfileResponse()

    async def get_profiles(self, request: pr_pb.GetProfilesRequest) -> pr_pb.GetProfilesResponse:
        self.calls.append(request)
        return pr_pb.GetProfilesResponse()


@dataclass
class Harness:
    """A worker context on fakes: the offline provider answers every prompt with the workers' own
    registered rules (the default ``providers.llm``), so a worker's whole decision runs offline."""

    ctx: WorkerContext
    diary: FakeDiary
    episodes: FakeEpisodes
    skills: FakeSkills
    profiles: FakeProfiles
    events: FakeEvents
    clock: ManualClock


def worker_harness(now: datetime, *, settings: Settings | None = None, first_pass: bool = False) -> Harness:
    settings = settings or Settings()
    clock = ManualClock(now)
    rules = OfflineRules()
    for module in (persist_decider, synthesizer, refiner):
        module.register(rules)
    aux = AuxiliaryModel(settings, build_providers(settings, rules), None, None, clock)
    diary, episodes, skills, profiles, events = (
        FakeDiary(clock),
        FakeEpisodes(),
        FakeSkills(),
        FakeProfiles(),
        FakeEvents(),
    )
    ctx = WorkerContext(
        settings=settings,
        aux=aux,
        clients=None,  # type: ignore[arg-type]  # the workers under test call ports only; a stub use fails loudly
        events=events,
        clock=clock,
        ports=WorkerPorts(diary, episodes, skills, profiles),
        first_pass=first_pass,
    )
    return Harness(ctx, diary, episodes, skills, profiles, events, clock)


def make_turn(
    *,
    said: str = "",
    sender: str = "bob",
    outcome: TurnOutcome = TurnOutcome.DONE,
    tools: tuple[str, ...] = (),
    offered: tuple[OfferedSkill, ...] = (),
    end_time: datetime | None = None,
    turn_id: str = "run-1",
    work_key: str = "",
    self_persisted: bool = False,
    label: str = "message from bob",
) -> Turn:
    """A turn as the reflector reads one: ``said`` by ``sender`` to seat ``agent-1`` of ``acme``."""
    end = end_time or datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    interactions = (Interaction(Sender(sender, "", "slack"), said, end),) if said else ()
    return Turn(
        turn_id=turn_id,
        work_key=work_key,
        company="acme",
        seat="agent-1",
        role="support",
        label=label,
        ask=said,
        what_it_did="answered",
        outcome=outcome,
        review_outcome="",
        tool_sequence=tools[-1:],
        tools_called=tools,
        offered_skills=offered,
        interactions=interactions,
        self_persisted=self_persisted,
        trigger=Trigger.MESSAGE,
        start_time=end - timedelta(minutes=1),
        end_time=end,
    )
