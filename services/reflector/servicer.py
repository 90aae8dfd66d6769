"""ReflectorService over gRPC: protobuf in, use cases, protobuf out."""

from __future__ import annotations

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.errors import InvalidArgument
from libs.common.field_copy import to_pb
from libs.common.rpctypes import ServicerContext
from services.reflector import erasure as _erasure
from services.reflector.domain import DOMAIN, WorkerStatus
from services.reflector.domain import DOMAIN as _ERASURE_DOMAIN
from services.reflector.service import ReflectorService
from services.reflector.store import ReflectionRecord

__all__ = ["ReflectorServicer", "reflection_to_pb"]

_STATE = {
    "queued": pb.REFLECTION_STATE_QUEUED,
    "running": pb.REFLECTION_STATE_RUNNING,
    "completed": pb.REFLECTION_STATE_COMPLETED,
    "gated": pb.REFLECTION_STATE_GATED,
    "deferred": pb.REFLECTION_STATE_DEFERRED,
    "retrying": pb.REFLECTION_STATE_RETRYING,
    "dead_lettered": pb.REFLECTION_STATE_DEAD_LETTERED,
    "erased": pb.REFLECTION_STATE_ERASED,
}
_STATUS = enum_to_pb(WorkerStatus, pb.WorkerStatus, "WORKER_STATUS")


def reflection_to_pb(r: ReflectionRecord) -> pb.Reflection:
    return to_pb(
        pb.Reflection,
        r,
        "turn_id company seat gate submit_time complete_time attempts reason next_attempt_time",
        state=_STATE.get(r.state, pb.REFLECTION_STATE_UNSPECIFIED),
        workers=[
            to_pb(pb.WorkerOutcome, w, "worker gate failure written detail duration_ms", status=_STATUS[w.status])
            for w in r.workers
        ],
    )


class ReflectorServicer(ErasureRpcs, pb_grpc.ReflectorServiceServicer):
    def __init__(self, service: ReflectorService):
        self._service = service
        self._erasure_calls = pool_erasure(_erasure, lambda: service.store.pool, service, domain=_ERASURE_DOMAIN, pb=pb)

    async def SubmitTurn(self, request: pb.SubmitTurnRequest, context: ServicerContext) -> pb.SubmitTurnResponse:
        if not request.HasField("turn"):
            raise InvalidArgument("turn is required", reason="FIELD_REQUIRED", domain=DOMAIN, field="turn")
        queued, state = await self._service.submit(request.turn)
        return pb.SubmitTurnResponse(
            turn_id=request.turn.turn_id, queued=queued, state=_STATE.get(state, pb.REFLECTION_STATE_UNSPECIFIED)
        )

    async def GetReflection(
        self, request: pb.GetReflectionRequest, context: ServicerContext
    ) -> pb.GetReflectionResponse:
        record = await self._service.get(request.company, request.seat, request.turn_id)
        return pb.GetReflectionResponse(reflection=reflection_to_pb(record))

    async def ListReflections(
        self, request: pb.ListReflectionsRequest, context: ServicerContext
    ) -> pb.ListReflectionsResponse:
        records, token, total = await self._service.list(
            request.company, request.seat, request.page_size, request.page_token
        )
        return pb.ListReflectionsResponse(
            reflections=[reflection_to_pb(r) for r in records], next_page_token=token, total_size=total
        )
