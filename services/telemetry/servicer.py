"""TelemetryService over gRPC: protobuf in, use-case calls, protobuf out. No rules live here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

from agentlearn.telemetry.v1 import telemetry_service_pb2 as pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as pb_grpc
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.field_copy import to_pb
from libs.common.protoconv import timestamp, when
from libs.common.rpctypes import ServicerContext
from services.telemetry import erasure as _erasure
from services.telemetry.domain import DOMAIN as _ERASURE_DOMAIN
from services.telemetry.domain import Event, SeatActivity
from services.telemetry.service import TelemetryService

__all__ = ["TelemetryServicer"]


def _struct(payload: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    json_format.ParseDict(dict(payload), out, ignore_unknown_fields=True)
    return out


def _event(e: Event) -> pb.Event:
    return to_pb(pb.Event, e, "time kind company seat turn_id trace_id", id=str(e.id), payload=_struct(e.payload))


def _seat(s: SeatActivity) -> pb.SeatActivity:
    return to_pb(
        pb.SeatActivity,
        s,
        "company seat auxiliary_tokens last_event_time",
        event_count=s.events,
        turn_count=s.turns,
        prefetch_count=s.prefetches,
        auxiliary_call_count=s.auxiliary_calls,
    )


class TelemetryServicer(ErasureRpcs, pb_grpc.TelemetryServiceServicer):
    def __init__(self, service: TelemetryService):
        self._service = service
        self._erasure_calls = pool_erasure(
            _erasure, lambda: service.store.pool, lambda: service.clock.now(), domain=_ERASURE_DOMAIN, pb=pb
        )

    async def GetPrefetchHitRates(
        self, request: pb.GetPrefetchHitRatesRequest, context: ServicerContext
    ) -> pb.GetPrefetchHitRatesResponse:
        days, totals, window = await self._service.hit_rates(
            request.company, request.seat, when(request, "start_time"), when(request, "end_time")
        )
        return pb.GetPrefetchHitRatesResponse(
            days=[
                pb.BlockDay(
                    day_start_time=timestamp(d.day),
                    block=d.block,
                    turn_count=d.turns,
                    hit_count=d.hits,
                    hit_rate=d.rate,
                )
                for d in days
            ],
            totals=[
                pb.BlockTotal(block=t.block, turn_count=t.turns, hit_count=t.hits, hit_rate=t.rate) for t in totals
            ],
            start_time=timestamp(window.start),
            end_time=timestamp(window.end),
        )

    async def GetAuxiliarySpend(
        self, request: pb.GetAuxiliarySpendRequest, context: ServicerContext
    ) -> pb.GetAuxiliarySpendResponse:
        days, totals, window = await self._service.spend(
            request.company, request.seat, when(request, "start_time"), when(request, "end_time")
        )
        return pb.GetAuxiliarySpendResponse(
            days=[
                pb.PurposeDay(
                    day_start_time=timestamp(d.day),
                    purpose=d.purpose,
                    call_count=d.calls,
                    prompt_tokens=d.prompt_tokens,
                    completion_tokens=d.completion_tokens,
                )
                for d in days
            ],
            totals=[
                pb.PurposeTotal(
                    purpose=t.purpose,
                    call_count=t.calls,
                    prompt_tokens=t.prompt_tokens,
                    completion_tokens=t.completion_tokens,
                )
                for t in totals
            ],
            start_time=timestamp(window.start),
            end_time=timestamp(window.end),
        )

    async def ListSeatActivity(
        self, request: pb.ListSeatActivityRequest, context: ServicerContext
    ) -> pb.ListSeatActivityResponse:
        seats, token, total = await self._service.seats(
            request.company,
            request.query,
            when(request, "start_time"),
            when(request, "end_time"),
            request.page_size,
            request.page_token,
        )
        return pb.ListSeatActivityResponse(seats=[_seat(s) for s in seats], next_page_token=token, total_size=total)

    async def ListEvents(self, request: pb.ListEventsRequest, context: ServicerContext) -> pb.ListEventsResponse:
        events, token = await self._service.events(
            request.company,
            request.seat,
            list(request.kinds),
            request.turn_id,
            when(request, "start_time"),
            when(request, "end_time"),
            request.page_size,
            request.page_token,
        )
        return pb.ListEventsResponse(events=[_event(e) for e in events], next_page_token=token)
