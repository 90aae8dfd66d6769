"""TelemetryService over gRPC: protobuf in, use-case calls, protobuf out. No rules live here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

from agentlearn.telemetry.v1 import telemetry_service_pb2 as pb
from agentlearn.telemetry.v1 import telemetry_service_pb2_grpc as pb_grpc
from libs.common.erasure_rpcs import ErasureRpcs, pool_erasure
from libs.common.field_copy import to_pb
from libs.common.protoconv import timestamp, when
from libs.common.rpctypes import ServicerContext
from services.telemetry import erasure as _erasure
from services.telemetry.domain import DOMAIN as _ERASURE_DOMAIN
from services.telemetry.domain import BlockTotal, Day, Event, PurposeTotal, SeatActivity, Window
from services.telemetry.service import TelemetryService

__all__ = ["TelemetryServicer"]

M = TypeVar("M", bound=Message)
R = TypeVar("R")
C = TypeVar("C", BlockTotal, PurposeTotal)


def _struct(payload: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    json_format.ParseDict(dict(payload), out, ignore_unknown_fields=True)
    return out


def _event(e: Event) -> pb.Event:
    return to_pb(
        pb.Event, e, "time kind company seat turn_id trace_id span_id", id=str(e.id), payload=_struct(e.payload)
    )


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


def _window(request: Message) -> tuple[datetime | None, datetime | None]:
    """The request's [start_time, end_time), each None when unset (the service picks the default)."""
    return when(request, "start_time"), when(request, "end_time")


def _block(msg: type[M], t: BlockTotal, **day: Any) -> M:
    """A block's counts as a BlockDay (given its ``day_start_time``) or a BlockTotal."""
    return msg(block=t.block, turn_count=t.turns, hit_count=t.hits, hit_rate=t.rate, **day)


def _purpose(msg: type[M], t: PurposeTotal, **day: Any) -> M:
    """A purpose's counts as a PurposeDay (given its ``day_start_time``) or a PurposeTotal."""
    return to_pb(msg, t, "purpose prompt_tokens completion_tokens", call_count=t.calls, **day)


def _by_day(
    response: Callable[..., R],
    day_msg: Callable[..., Any],
    total_msg: Callable[..., Any],
    counts: Callable[..., Any],
    days: Sequence[Day[C]],
    totals: Sequence[C],
    window: Window,
) -> R:
    """A per-day answer: each day's counts, the window's totals (the same counts over the window),
    and the window itself."""
    return response(
        days=[counts(day_msg, d.counts, day_start_time=timestamp(d.day)) for d in days],
        totals=[counts(total_msg, t) for t in totals],
        start_time=timestamp(window.start),
        end_time=timestamp(window.end),
    )


class TelemetryServicer(ErasureRpcs, pb_grpc.TelemetryServiceServicer):
    def __init__(self, service: TelemetryService):
        self._service = service
        self._erasure_calls = pool_erasure(_erasure, lambda: service.store.pool, service, domain=_ERASURE_DOMAIN, pb=pb)

    async def GetPrefetchHitRates(
        self, request: pb.GetPrefetchHitRatesRequest, context: ServicerContext
    ) -> pb.GetPrefetchHitRatesResponse:
        answer = await self._service.hit_rates(request.company, request.seat, *_window(request))
        return _by_day(pb.GetPrefetchHitRatesResponse, pb.BlockDay, pb.BlockTotal, _block, *answer)

    async def GetAuxiliarySpend(
        self, request: pb.GetAuxiliarySpendRequest, context: ServicerContext
    ) -> pb.GetAuxiliarySpendResponse:
        answer = await self._service.spend(request.company, request.seat, *_window(request))
        return _by_day(pb.GetAuxiliarySpendResponse, pb.PurposeDay, pb.PurposeTotal, _purpose, *answer)

    async def ListSeatActivity(
        self, request: pb.ListSeatActivityRequest, context: ServicerContext
    ) -> pb.ListSeatActivityResponse:
        seats, token, total = await self._service.seats(
            request.company,
            request.query,
            *_window(request),
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
            *_window(request),
            request.page_size,
            request.page_token,
        )
        return pb.ListEventsResponse(events=[_event(e) for e in events], next_page_token=token)
