"""ProfileService over gRPC: protobuf in, domain calls, protobuf out. No rules live here."""

from __future__ import annotations

from agentlearn.profiles.v1 import profile_service_pb2 as pb
from agentlearn.profiles.v1 import profile_service_pb2_grpc as pb_grpc
from libs.common.erasure import report_to_proto as erasure_report
from libs.common.erasure import target_from_proto as erasure_target
from libs.common.protoconv import timestamp
from libs.common.rpctypes import ServicerContext
from services.profiles import erasure as _erasure
from services.profiles.domain import DOMAIN as _ERASURE_DOMAIN
from services.profiles.domain import Profile
from services.profiles.service import ProfileService, SubjectRef

__all__ = ["ProfileServicer", "profile_to_pb"]


def _ref(subject: pb.Subject) -> SubjectRef:
    return (subject.handle, subject.external_id, subject.platform)


def profile_to_pb(profile: Profile) -> pb.Profile:
    return pb.Profile(
        id=str(profile.id),
        company=profile.company,
        observer=profile.observer,
        subject=pb.Subject(
            handle=profile.subject.handle or "",
            external_id=profile.subject.external_id or "",
            platform=profile.subject.platform,
        ),
        communication_style=profile.communication_style,
        past_decisions=list(profile.past_decisions),
        sensitivities=list(profile.sensitivities),
        topics=list(profile.topics),
        observation_count=profile.observation_count,
        create_time=timestamp(profile.create_time),
        update_time=timestamp(profile.update_time),
        last_turn_id=profile.last_turn_id or "",
    )


class ProfileServicer(pb_grpc.ProfileServiceServicer):
    def __init__(self, service: ProfileService):
        self._service = service

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

    async def EraseRows(self, request: pb.EraseRowsRequest, context: ServicerContext) -> pb.EraseRowsResponse:
        target = erasure_target(request.target, domain=_ERASURE_DOMAIN)
        report = await _erasure.erase(self._service.store.pool, target, self._service.clock.now())
        return pb.EraseRowsResponse(report=erasure_report(report))

    async def FindRows(self, request: pb.FindRowsRequest, context: ServicerContext) -> pb.FindRowsResponse:
        target = erasure_target(request.target, domain=_ERASURE_DOMAIN)
        return pb.FindRowsResponse(report=erasure_report(await _erasure.find(self._service.store.pool, target)))

    async def GetProfileProvenance(
        self, request: pb.GetProfileProvenanceRequest, context: ServicerContext
    ) -> pb.GetProfileProvenanceResponse:
        found = await _erasure.provenance(
            self._service.store.pool, request.company, request.observer, request.profile_id
        )
        return pb.GetProfileProvenanceResponse(provenance=found)
