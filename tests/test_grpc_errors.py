"""Every refusal is a rich status; an unexpected exception is INTERNAL and nothing else."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.grpcserver import Registration, create_server
from tests.support.grpc_errors import error_info


class _Exploding(pb_grpc.DiaryServiceServicer):
    """A servicer with a bug: what a caller sees must be INTERNAL with no internals."""

    async def GetNote(self, request, context):  # type: ignore[no-untyped-def]
        raise RuntimeError("secret internals")


async def test_an_unexpected_exception_is_internal_and_says_nothing_of_itself():
    server, port, _ = await create_server(
        [Registration("agentlearn.diary.v1.DiaryService", pb_grpc.add_DiaryServiceServicer_to_server, _Exploding())],
        "127.0.0.1:0",
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await pb_grpc.DiaryServiceStub(channel).GetNote(pb.GetNoteRequest())
            code, info, _ = error_info(exc.value)
            assert code == grpc.StatusCode.INTERNAL and info.reason == "INTERNAL"
            assert "secret" not in exc.value.details()
            # Health answers per service and overall.
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "agentlearn.diary.v1.DiaryService"):
                resp = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)
