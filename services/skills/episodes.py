"""The episodes the clustered synthesis pass reads, as a port and its gRPC adapter.

The skills service owns no episode rows: it reads them from ``agentlearn.episodes.v1.
EpisodeService`` and stamps the ones a skill was drafted from. Every call carries a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc

from agentlearn.episodes.v1 import episode_service_pb2 as epb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as epb_grpc
from services.skills.domain import MAX_IDS_PER_CALL, Turn

__all__ = ["EpisodeReader", "GrpcEpisodeReader"]

DEADLINE_SECONDS = 30.0
_LIST_PAGE_MAX = 200  # ListEpisodes' documented maximum
_OUTCOME = {epb.TURN_OUTCOME_DONE: "done", epb.TURN_OUTCOME_FAILED: "failed"}


class EpisodeReader(Protocol):
    def seats(self) -> AsyncIterator[tuple[str, str]]:
        """Every (company, seat) with raw rows."""
        ...

    async def recent_settled(self, company: str, seat: str, min_tool_calls: int, limit: int) -> list[Turn]:
        """The seat's newest ``limit`` raw turns that settled (done or failed) with at least
        ``min_tool_calls`` tools, newest first. A compacted row's retained exemplars are not among
        them: the summary already stands for their cluster, so they are not evidence again."""
        ...

    async def mark_consolidated(self, company: str, seat: str, turn_ids: Sequence[str], skill_id: str) -> int:
        """Stamp the source turns of a drafted skill; returns how many rows were stamped."""
        ...

    async def missing(self, company: str, seat: str, turn_ids: Sequence[str]) -> list[str]:
        """The ones of ``turn_ids`` the seat no longer has (an erasure took them, or the lifecycle):
        a pass re-reads its sources with it after its model call, before it writes what it drafted
        from them."""
        ...


def _turn(ep: epb.Episode) -> Turn:
    return Turn(
        turn_id=ep.turn_id,
        tool_sequence=tuple(ep.tool_sequence),
        tools_called=tuple(ep.tools_called),
        label=ep.label,
        ask=ep.ask,
        what_it_did=ep.what_it_did,
        outcome=_OUTCOME.get(ep.outcome, ""),
        end_time=ep.end_time.ToDatetime() if ep.HasField("end_time") else None,
        consolidated_into_skill_id=ep.consolidated_into_skill_id,
        role=ep.role,
        subjects=tuple(ep.subjects),
    )


class GrpcEpisodeReader:
    """EpisodeService over gRPC. The channel is asked for on every call (the all-in-one points
    the name at its own port only once the server is bound)."""

    def __init__(self, channel: Callable[[], grpc.aio.Channel], *, deadline: float = DEADLINE_SECONDS):
        self._channel = channel
        self._deadline = deadline

    def _stub(self) -> epb_grpc.EpisodeServiceStub:
        return epb_grpc.EpisodeServiceStub(self._channel())

    async def seats(self) -> AsyncIterator[tuple[str, str]]:
        token = ""
        while True:
            resp = await self._stub().ListEpisodeSeats(
                epb.ListEpisodeSeatsRequest(page_token=token), timeout=self._deadline
            )
            for ref in resp.seats:
                yield ref.company, ref.seat
            token = resp.next_page_token
            if not token:
                return

    async def recent_settled(self, company: str, seat: str, min_tool_calls: int, limit: int) -> list[Turn]:
        out: list[Turn] = []
        token = ""
        flt = epb.EpisodeFilter(
            kind=epb.EPISODE_KIND_RAW,
            outcomes=[epb.TURN_OUTCOME_DONE, epb.TURN_OUTCOME_FAILED],
            min_tool_calls=min_tool_calls,
            exclude_exemplars=True,
        )
        while len(out) < limit:
            resp = await self._stub().ListEpisodes(
                epb.ListEpisodesRequest(
                    company=company,
                    seat=seat,
                    page_size=min(_LIST_PAGE_MAX, limit - len(out)),
                    page_token=token,
                    filter=flt,
                ),
                timeout=self._deadline,
            )
            out += [_turn(ep) for ep in resp.episodes]
            token = resp.next_page_token
            if not token or not resp.episodes:
                break
        return out[:limit]

    async def mark_consolidated(self, company: str, seat: str, turn_ids: Sequence[str], skill_id: str) -> int:
        marked = 0
        ids = list(turn_ids)
        for i in range(0, len(ids), MAX_IDS_PER_CALL):
            resp = await self._stub().MarkEpisodesConsolidated(
                epb.MarkEpisodesConsolidatedRequest(
                    company=company, seat=seat, turn_ids=ids[i : i + MAX_IDS_PER_CALL], skill_id=skill_id
                ),
                timeout=self._deadline,
            )
            marked += resp.marked_count
        return marked

    async def missing(self, company: str, seat: str, turn_ids: Sequence[str]) -> list[str]:
        # GetEpisode by run id also finds a run folded into a compacted row (still there).
        async def gone(turn_id: str) -> bool:
            try:
                await self._stub().GetEpisode(
                    epb.GetEpisodeRequest(company=company, seat=seat, turn_id=turn_id), timeout=self._deadline
                )
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return True
                raise
            return False

        ids = list(dict.fromkeys(turn_ids))
        found = await asyncio.gather(*(gone(t) for t in ids))
        return [t for t, g in zip(ids, found, strict=True) if g]
