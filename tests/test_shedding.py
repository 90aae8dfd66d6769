"""Load shedding: past the server's (or a company's) limit of concurrent calls a call is refused at
once with RESOURCE_EXHAUSTED, ErrorInfo and a RetryInfo hint, while health checks still answer and
other companies are still served. Real concurrent calls against a real server; no timing: the
test waits on the calls actually being inside the servicer, then on their release."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from agentlearn.privacy.v1 import privacy_service_pb2 as privacy_pb
from agentlearn.privacy.v1 import privacy_service_pb2_grpc as privacy_grpc
from libs.common.config import ServerConfig
from libs.common.grpcserver import Registration, create_server

NOTE = "00000000-0000-0000-0000-000000000001"


class _Held(pb_grpc.DiaryServiceServicer):
    """GetNote parks inside the servicer until released, counting who is inside."""

    def __init__(self) -> None:
        self.inside = 0
        self.changed = asyncio.Condition()
        self.release = asyncio.Event()

    async def GetNote(self, request, context):  # type: ignore[no-untyped-def]
        async with self.changed:
            self.inside += 1
            self.changed.notify_all()
        await self.release.wait()
        return pb.GetNoteResponse(note=pb.Note(id=request.note_id, company=request.company, seat=request.seat))

    async def wait_inside(self, n: int) -> None:
        async with asyncio.timeout(30), self.changed:
            await self.changed.wait_for(lambda: self.inside >= n)


@pytest.fixture
async def held():
    servicer = _Held()
    server, port, _ = await create_server(
        [Registration("agentlearn.diary.v1.DiaryService", pb_grpc.add_DiaryServiceServicer_to_server, servicer)],
        "127.0.0.1:0",
        ServerConfig(max_concurrent_rpcs=4, max_concurrent_rpcs_per_company=2),
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, pb_grpc.DiaryServiceStub(channel), channel
    servicer.release.set()
    await channel.close()
    await server.stop(None)


def _get(stub, company: str):  # type: ignore[no-untyped-def]
    return asyncio.ensure_future(stub.GetNote(pb.GetNoteRequest(company=company, seat="ana", note_id=NOTE), timeout=60))


def _shed(err: grpc.aio.AioRpcError) -> tuple[str, float]:
    status = rpc_status.from_call(err)
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    found = {d.type_url.rsplit("/", 1)[1] for d in status.details}
    assert {"google.rpc.ErrorInfo", "google.rpc.RetryInfo"} <= found
    for d in status.details:
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
        elif d.Is(retry.DESCRIPTOR):
            d.Unpack(retry)
    return info.reason, retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9


async def test_past_the_server_limit_a_call_is_refused_at_once_with_a_retry_hint(held):
    servicer, stub, channel = held
    running = [_get(stub, company) for company in ("a", "a", "b", "b")]
    await servicer.wait_inside(4)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetNote(pb.GetNoteRequest(company="c", seat="ana", note_id=NOTE), timeout=60)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    reason, delay = _shed(exc.value)
    assert reason == "SERVER_OVERLOADED" and delay > 0
    # Health is never shed: an orchestrator must not restart a replica for being busy.
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    servicer.release.set()
    assert len(await asyncio.gather(*running)) == 4
    # Room again once the calls are done.
    assert (await stub.GetNote(pb.GetNoteRequest(company="c", seat="ana", note_id=NOTE))).note.id == NOTE


async def test_one_company_at_its_limit_does_not_starve_another(held):
    servicer, stub, _ = held
    running = [_get(stub, "busy"), _get(stub, "busy")]
    await servicer.wait_inside(2)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await stub.GetNote(pb.GetNoteRequest(company="busy", seat="ana", note_id=NOTE), timeout=60)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _shed(exc.value)[0] == "COMPANY_OVERLOADED"
    other = _get(stub, "quiet")
    await servicer.wait_inside(3)  # the other company's call is inside, not refused
    servicer.release.set()
    await asyncio.gather(*running, other)


async def test_a_burst_is_refused_at_once_not_queued_until_its_deadline(held):
    """400 concurrent calls while 4 are held: the other 396 all finish, refused with a hint,
    without the held ones being released (queued calls would wait for the release)."""
    servicer, stub, _ = held
    burst = [_get(stub, f"c{i % 50}") for i in range(400)]
    await servicer.wait_inside(4)
    pending = set(burst)
    async with asyncio.timeout(30):
        while len(pending) > 4:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    refused = [c.exception() for c in burst if c.done()]
    assert len(refused) == 396
    assert {err.code() for err in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert {_shed(err)[0] for err in refused} == {"SERVER_OVERLOADED"}
    servicer.release.set()
    served = await asyncio.gather(*pending)
    assert [r.note.id for r in served] == [NOTE] * 4


class _HeldExport(privacy_grpc.PrivacyServiceServicer):
    """ExportSeat streams one line, then parks until released, counting who is inside."""

    def __init__(self) -> None:
        self.held = _Held()

    async def ExportSeat(self, request, context):  # type: ignore[no-untyped-def]
        yield privacy_pb.ExportSeatResponse(lines=["{}"])
        async with self.held.changed:
            self.held.inside += 1
            self.held.changed.notify_all()
        await self.held.release.wait()


_add_privacy = privacy_grpc.add_PrivacyServiceServicer_to_server


async def test_a_stream_counts_as_a_call_while_it_streams():
    """ExportSeat (a whole seat read out) holds its company's room for as long as it streams: it
    was never counted, so a company could run any number of exports beside its limit of calls."""
    servicer = _HeldExport()
    server, port, _ = await create_server(
        [
            Registration(
                "agentlearn.privacy.v1.PrivacyService", privacy_grpc.add_PrivacyServiceServicer_to_server, servicer
            )
        ],
        "127.0.0.1:0",
        ServerConfig(max_concurrent_rpcs=4, max_concurrent_rpcs_per_company=2),
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = privacy_grpc.PrivacyServiceStub(channel)

    async def export(company: str) -> list:  # type: ignore[type-arg]
        return [r async for r in stub.ExportSeat(privacy_pb.ExportSeatRequest(company=company, seat="ana"), timeout=60)]

    try:
        running = [asyncio.ensure_future(export("busy")) for _ in range(2)]
        await servicer.held.wait_inside(2)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await export("busy")
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _shed(exc.value)[0] == "COMPANY_OVERLOADED"
        servicer.held.release.set()
        assert [len(lines) for lines in await asyncio.gather(*running)] == [1, 1]
        assert len(await export("busy")) == 1  # room again once they are done
    finally:
        servicer.held.release.set()
        await channel.close()
        await server.stop(None)
