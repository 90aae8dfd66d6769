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
                # A request the contract accepts, so the servicer's bug is what answers.
                await pb_grpc.DiaryServiceStub(channel).GetNote(
                    pb.GetNoteRequest(company="acme", seat="ana", note_id="00000000-0000-0000-0000-000000000001")
                )
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


async def test_a_nul_character_anywhere_is_the_callers_mistake_naming_the_field(make_settings, dsn, clock, edge_index):
    from agentlearn.common.v1 import embedding_pb2
    from tests.support.app import open_app

    async with open_app(make_settings(), dsn, names=["diary"], clock=clock, embedder=None, index=edge_index) as app:
        stub = pb_grpc.DiaryServiceStub(app.channel)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.WriteNote(
                pb.WriteNoteRequest(company="acme", seat="ana", content="a\x00b", tier=pb.NOTE_TIER_LONG)
            )
        code, info, bad = error_info(exc.value)
        assert (code, info.reason, info.domain) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "diary.agentlearn.dev",
        )
        assert bad.field_violations[0].field == "content"
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.RecallNotes(
                pb.RecallNotesRequest(
                    company="acme",
                    seat="ana",
                    query="q",
                    query_embedding=embedding_pb2.Embedding(values=[1.0], model="m\x00"),
                )
            )
        assert error_info(exc.value)[2].field_violations[0].field == "query_embedding.model"
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.MarkNotesUsed(
                pb.MarkNotesUsedRequest(
                    company="acme", seat="ana", note_ids=["00000000-0000-0000-0000-000000000001", "y\x00"]
                )
            )
        assert error_info(exc.value)[2].field_violations[0].field == "note_ids[1]"


async def test_a_store_that_cannot_be_reached_is_unavailable_not_internal(make_settings, dsn, clock, edge_index):
    from tests.support.app import open_app

    async with open_app(make_settings(), dsn, names=["diary"], clock=clock, embedder=None, index=edge_index) as app:
        await app.infra.pool.close()  # the database goes away
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await pb_grpc.DiaryServiceStub(app.channel).ListNotes(pb.ListNotesRequest(company="acme", seat="ana"))
        code, info, _ = error_info(exc.value)
        assert (code, info.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
