"""ProfileService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

import asyncpg

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from agentlearn.profiles.v1 import profile_service_pb2 as pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pb_grpc
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.field_copy import from_pb, to_pb
from libs.common.rpctypes import ServicerContext
from services.profiles import erasure as _erasure
from services.profiles.domain import DOMAIN as _ERASURE_DOMAIN
from services.profiles.domain import ObservationRecord, ObservationSource, Profile
from services.profiles.service import ProfileService, SubjectRef

__all__ = ["ProfileServicer", "observation_to_pb", "profile_to_pb", "source_from_pb", "source_to_pb"]


_SUBJECT_FIELDS = "handle external_id platform"
_SOURCE_FIELDS = "turn_ids work_key model prompt_version writer"
"""An observation's provenance fields that the proto and the domain name alike."""


def _ref(subject: pb.Subject) -> SubjectRef:
    return (subject.handle, subject.external_id, subject.platform)


def profile_to_pb(profile: Profile) -> pb.Profile:
    return to_pb(
        pb.Profile,
        profile,
        "id company observer communication_style past_decisions sensitivities topics observation_count create_time"
        " update_time last_turn_id",
        subject=to_pb(pb.Subject, profile.subject, _SUBJECT_FIELDS),
    )


def source_from_pb(msg: provenance_pb2.Provenance) -> ObservationSource | None:
    """The caller's provenance of an observation; None when it sent none."""
    if msg.ByteSize() == 0:
        return None
    return from_pb(
        ObservationSource,
        msg,
        _SOURCE_FIELDS,
        subjects=tuple((s.handle, s.external_id, s.platform) for s in msg.subjects),
    )


def source_to_pb(source: ObservationSource) -> provenance_pb2.Provenance:
    return to_pb(
        provenance_pb2.Provenance,
        source,
        _SOURCE_FIELDS,
        subjects=[erasure_pb2.ErasureSubject(handle=h, external_id=e, platform=p) for h, e, p in source.subjects],
    )


def observation_to_pb(obs: ObservationRecord) -> pb.ProfileObservation:
    return to_pb(
        pb.ProfileObservation,
        obs,
        "id observe_time communication_style past_decisions sensitivities topics",
        provenance=source_to_pb(obs.source),
    )


class ProfileServicer(ErasureRpcs, pb_grpc.ProfileServiceServicer):
    def __init__(self, service: ProfileService, pool: asyncpg.Pool):
        self._service = service
        # The erasure reads and writes the tables directly (libs.common.erasure), beside the port.
        self._erasure_calls = pool_erasure(_erasure, lambda: pool, service, domain=_ERASURE_DOMAIN, pb=pb)

    async def UpsertProfile(
        self, request: pb.UpsertProfileRequest, context: ServicerContext
    ) -> pb.UpsertProfileResponse:
        profile, created = await self._service.upsert_profile(
            request.company,
            request.observer,
            _ref(request.subject),
            request.communication_style,
            list(request.past_decisions),
            list(request.sensitivities),
            list(request.topics),
            request.turn_id,
            request.request_id,
            source_from_pb(request.provenance),
        )
        return pb.UpsertProfileResponse(profile=profile_to_pb(profile), created=created)

    async def GetProfiles(self, request: pb.GetProfilesRequest, context: ServicerContext) -> pb.GetProfilesResponse:
        profiles = await self._service.get_profiles(
            request.company, request.observer, [_ref(s) for s in request.subjects]
        )
        return pb.GetProfilesResponse(profiles=[profile_to_pb(p) for p in profiles])

    async def ListProfiles(self, request: pb.ListProfilesRequest, context: ServicerContext) -> pb.ListProfilesResponse:
        profiles, token, total = await self._service.list_profiles(
            request.company, request.observer, request.page_size, request.page_token
        )
        return pb.ListProfilesResponse(
            profiles=[profile_to_pb(p) for p in profiles], next_page_token=token, total_size=total
        )

    # ------------------------------------------------------------------ erasure (issue 17)

    async def GetProfileProvenance(
        self, request: pb.GetProfileProvenanceRequest, context: ServicerContext
    ) -> pb.GetProfileProvenanceResponse:
        profile, observations, entries = await self._service.provenance(
            request.company, request.observer, request.profile_id
        )
        # The profile's own provenance, as before: the person, the last observing turn; with the
        # model, prompt version and work key of that turn's observation when it was recorded.
        summary = provenance_pb2.Provenance(
            turn_ids=[profile.last_turn_id] if profile.last_turn_id else [],
            subjects=[to_pb(erasure_pb2.ErasureSubject, profile.subject, _SUBJECT_FIELDS)],
            writer="profiler",
        )
        last = next((o for o in observations if profile.last_turn_id in o.source.turn_ids), None)
        if last is not None:
            summary.work_key = last.source.work_key
            summary.model = last.source.model
            summary.prompt_version = last.source.prompt_version
            summary.writer = last.source.writer or summary.writer
        return pb.GetProfileProvenanceResponse(
            provenance=summary,
            observations=[observation_to_pb(o) for o in observations],
            entries=[
                pb.ProfileEntry(
                    field=e.field,
                    text=e.text,
                    observation_ids=[str(o.id) for o in e.observations],
                    turn_ids=[o.source.turn_ids[0] if o.source.turn_ids else "" for o in e.observations],
                )
                for e in entries
            ],
        )
