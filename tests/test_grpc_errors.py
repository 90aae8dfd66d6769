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


class _Listing:
    """A downstream listing RPC for ExportSeat: one page of notes, or the failure it is given;
    every request it was sent recorded."""

    def __init__(self, failure: Exception | None = None):
        self.failure = failure
        self.requests: list[object] = []

    async def __call__(self, request, timeout=None):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        if self.failure is not None:
            raise self.failure
        from agentlearn.diary.v1 import diary_service_pb2 as d_pb

        return d_pb.ListNotesResponse(notes=[d_pb.Note(id="n1", content="kept")])


async def _note_provenance(request, timeout=None):  # type: ignore[no-untyped-def]
    """GetNoteProvenance: where each exported note came from (a turn)."""
    from agentlearn.common.v1 import provenance_pb2
    from agentlearn.diary.v1 import diary_service_pb2 as d_pb

    return d_pb.GetNoteProvenanceResponse(provenance=provenance_pb2.Provenance(turn_ids=["t1"]))


class _Owner:
    def __init__(self, **rpcs: _Listing):
        for name, rpc in rpcs.items():
            setattr(self, name, rpc)


class _ExportClients:
    """The owners ExportSeat reads: the diary answers one page (and its provenance), the episodes
    fail with ``failure``."""

    timeout = 5.0

    def __init__(self, failure: Exception | None = None):
        self.notes = _Listing()
        self.episodes_listing = _Listing(failure)
        self.diary = _Owner(ListNotes=self.notes, GetNoteProvenance=_note_provenance)
        self.episodes = _Owner(ListEpisodes=self.episodes_listing)


async def _export(clients: _ExportClients, request) -> tuple[list, grpc.aio.AioRpcError | None]:  # type: ignore[no-untyped-def]
    """What ExportSeat streams for ``request`` before it ends, and the error it ends with (None: OK)."""
    from agentlearn.privacy.v1 import privacy_service_pb2_grpc as pv_grpc
    from services.privacy.servicer import PrivacyServicer

    server, port, _ = await create_server([Registration.of(PrivacyServicer(None, clients))], "127.0.0.1:0")  # type: ignore[arg-type]
    got: list = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                async for chunk in pv_grpc.PrivacyServiceStub(channel).ExportSeat(request, timeout=10):
                    got.append(chunk)
            except grpc.aio.AioRpcError as err:
                return got, err
    finally:
        await server.stop(None)
    return got, None


async def test_a_streaming_call_is_checked_against_its_contract_before_its_handler_runs():
    from agentlearn.privacy.v1 import privacy_service_pb2 as pv

    clients = _ExportClients()
    got, err = await _export(clients, pv.ExportSeatRequest(company="", seat="ana"))
    assert got == [] and err is not None
    code, info, bad = error_info(err)
    assert (code, info.reason, info.domain) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_REQUIRED",
        "privacy.agentlearn.dev",
    )
    assert [v.field for v in bad.field_violations] == ["company"]
    assert clients.notes.requests == []  # refused before any owner was asked


async def test_a_downstream_refusal_mid_stream_ends_it_with_that_refusal_not_unknown():
    from agentlearn.privacy.v1 import privacy_service_pb2 as pv
    from libs.common.errors import FailedPrecondition
    from libs.common.grpcserver import rpc_error, status_of

    refusal = FailedPrecondition.of_field(
        "seat", "SEAT_FROZEN", "seat ana is frozen", domain="episodes.agentlearn.dev", seat="ana"
    )
    got, err = await _export(
        _ExportClients(rpc_error(status_of(refusal))), pv.ExportSeatRequest(company="acme", seat="ana")
    )
    # The notes page and their provenance, sent before the refusal.
    assert len(got) == 2 and '"kept"' in got[0].lines[0] and '"note_provenance"' in got[1].lines[0]
    assert err is not None
    code, info, bad = error_info(err)
    assert (code, info.reason, info.domain, info.metadata["seat"]) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "SEAT_FROZEN",
        "episodes.agentlearn.dev",
        "ana",
    )
    assert err.details() == "seat ana is frozen" and bad.field_violations[0].field == "seat"


async def test_a_downstream_that_did_not_answer_mid_stream_is_its_code_with_error_info():
    from agentlearn.privacy.v1 import privacy_service_pb2 as pv

    unreached = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connection refused", None
    )
    _, err = await _export(_ExportClients(unreached), pv.ExportSeatRequest(company="acme", seat="ana"))
    assert err is not None
    code, info, _ = error_info(err)
    assert (code, info.reason, info.domain) == (
        grpc.StatusCode.UNAVAILABLE,
        "DOWNSTREAM_UNAVAILABLE",
        "privacy.agentlearn.dev",
    )
    # A store that cannot be reached mid-stream is UNAVAILABLE, as in a unary call.
    _, err = await _export(_ExportClients(ConnectionRefusedError()), pv.ExportSeatRequest(company="acme", seat="ana"))
    assert err is not None
    code, info, _ = error_info(err)
    assert (code, info.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")


class _RefusedDownstream(pb_grpc.DiaryServiceServicer):
    """A handler that lets another service's refusal escape, as a unary call."""

    async def GetNote(self, request, context):  # type: ignore[no-untyped-def]
        from libs.common.errors import NotFound
        from libs.common.grpcserver import rpc_error, status_of

        raise rpc_error(status_of(NotFound.of_field("skill_id", "SKILL_NOT_FOUND", "no such skill", domain="skills.x")))


async def test_a_downstream_refusal_escaping_a_unary_handler_is_that_refusal_not_internal():
    server, port, _ = await create_server([Registration.of(_RefusedDownstream())], "127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await pb_grpc.DiaryServiceStub(channel).GetNote(
                    pb.GetNoteRequest(company="acme", seat="ana", note_id="00000000-0000-0000-0000-000000000001")
                )
            code, info, bad = error_info(exc.value)
            assert (code, info.reason, info.domain) == (grpc.StatusCode.NOT_FOUND, "SKILL_NOT_FOUND", "skills.x")
            assert bad.field_violations[0].field == "skill_id"
    finally:
        await server.stop(None)
