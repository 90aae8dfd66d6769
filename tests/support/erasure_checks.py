"""The attacker's read of an erasure through every read RPC (issue 17's "done when"): shared by the
erasure test that runs in one process and the one that SIGKILLs the privacy service mid-erasure;
and the erasure target of one person, as the owners' FindRows and EraseRows take it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import grpc

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
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc

__all__ = ["assert_forgotten", "export_seat", "read_everything", "subject_target"]


def subject_target(
    handle: str,
    erasure_id: str,
    *,
    names: Sequence[str] = (),
    turn_ids: Sequence[str] = (),
    session_ids: Sequence[str] = (),
) -> er.ErasureTarget:
    """acme's erasure ``erasure_id`` of the person with the slack ``handle``, known by ``names``,
    whose messages the ``turn_ids`` answered and who spoke in the sessions ``session_ids``."""
    return er.ErasureTarget(
        erasure_id=erasure_id,
        company="acme",
        kind=er.ERASURE_KIND_SUBJECT,
        subject=er.ErasureSubject(handle=handle, platform="slack"),
        names=list(names),
        turn_ids=list(turn_ids),
        session_ids=list(session_ids),
    )


async def export_seat(channel: grpc.aio.Channel, company: str, seat: str) -> list[dict]:
    lines = []
    async for chunk in pv_grpc.PrivacyServiceStub(channel).ExportSeat(pv.ExportSeatRequest(company=company, seat=seat)):
        lines += [json.loads(line) for line in chunk.lines]
    return lines


async def read_everything(
    channel: grpc.aio.Channel,
    privacy: grpc.aio.Channel,
    company: str,
    seat: str,
    role: str,
    query: str,
    senders: list[str],
) -> dict[str, str]:
    """What every read RPC returns to ``seat`` for ``query``, as lower-cased text by RPC: recall,
    search (episodes and knowledge), listings (notes, episodes, profiles, skills), a new turn's
    prefetched context with ``senders``, and the seat's export."""
    diary, episodes = d_grpc.DiaryServiceStub(channel), ep_grpc.EpisodeServiceStub(channel)
    out = {
        "recall": await diary.RecallNotes(d_pb.RecallNotesRequest(company=company, seat=seat, query=query)),
        "notes": await diary.ListNotes(d_pb.ListNotesRequest(company=company, seat=seat, page_size=500)),
        "search": await episodes.SearchEpisodes(ep_pb.SearchEpisodesRequest(company=company, seat=seat, query=query)),
        "episodes": await episodes.ListEpisodes(ep_pb.ListEpisodesRequest(company=company, seat=seat, page_size=500)),
        "profiles": await pr_grpc.ProfileServiceStub(channel).ListProfiles(
            pr_pb.ListProfilesRequest(company=company, observer=seat)
        ),
        "skills": await sk_grpc.SkillServiceStub(channel).ListSkills(
            sk_pb.ListSkillsRequest(company=company, seat=seat, include_archived=True)
        ),
        "knowledge": await kn_grpc.KnowledgeServiceStub(channel).SearchPages(
            kn_pb.SearchPagesRequest(reader=kn_pb.Reader(company=company, seat=seat, role=role), query=query)
        ),
        "prefetch": await pf_grpc.PrefetchServiceStub(channel).BuildTurnContext(
            pf_pb.BuildTurnContextRequest(
                company=company,
                seat=seat,
                role=role,
                turn_id=f"check-{uuid.uuid4().hex[:8]}",
                ask=query,
                senders=[pf_pb.Counterparty(handle=s, platform="slack") for s in senders],
            )
        ),
    }
    texts = {name: str(resp).lower() for name, resp in out.items()}
    texts["export"] = json.dumps(await export_seat(privacy, company, seat)).lower()
    return texts


async def assert_forgotten(
    channel: grpc.aio.Channel,
    privacy: grpc.aio.Channel,
    *,
    company: str,
    seats: list[str],
    role: str,
    person: str,
    gone: list[str],
    kept: str,
    kept_in: tuple[str, ...] = ("notes", "episodes", "profiles", "export"),
) -> None:
    """No read RPC returns anything of ``person`` to any seat (their handle, nor ``gone``: words
    only their turns taught), even asked for exactly that; ``kept`` (another person) still reaches
    every seat through the reads named in ``kept_in``."""
    words = [person.lower(), *(w.lower() for w in gone)]
    for seat in seats:
        texts = await read_everything(channel, privacy, company, seat, role, " ".join([person, *gone]), [person, kept])
        leaks = {name: [w for w in words if w in text] for name, text in texts.items()}
        assert not {n: w for n, w in leaks.items() if w}, (seat, leaks)
        for name in kept_in:
            assert kept.lower() in texts[name], (seat, name)
