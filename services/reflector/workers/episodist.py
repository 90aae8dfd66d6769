"""Episodist: one episode row per turn, through EpisodeService.RecordEpisode (idempotent on the run
id, so a redone reflection stores one row; and one row per work key, so a redelivered trigger's
second execution is collapsed into the first's row)."""

from __future__ import annotations

from typing import cast

from agentlearn.common.v1 import erasure_pb2
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from libs.common.outcomes import TurnOutcome, to_proto
from libs.common.protoconv import timestamp
from libs.common.run_ids import label_without_run_id
from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus
from services.reflector.workers.base import WorkerContext

__all__ = ["Episodist"]


def _outcome(outcome: TurnOutcome) -> ep_pb.TurnOutcome:
    """The turn's outcome as the episodes' enum, through the one table (libs.common.outcomes),
    whose numbers are that enum's."""
    return cast("ep_pb.TurnOutcome", to_proto("episodes", outcome))


def _label(turn: Turn) -> str:
    """The waking event's label, which names a schedule, never a fire: a run id the engine left in
    it is taken out (two fires of one schedule must read alike), and a turn without a label is named
    by its trigger."""
    # Only where the id is a word of its own, the rule RecordEpisode refuses by: run id 512 is not
    # taken out of "review PR #5120 on POC-512"'s "#5120" (which would read "review PR # 0 on POC").
    label = label_without_run_id(turn.label, turn.turn_id)
    return label or f"({turn.trigger} turn)"


def _subjects(turn: Turn) -> list[str]:
    """The senders' identifiers, every one the engine gave: a sender's handle AND external id when
    both came (as the diary's and the profiles' provenance record them). With only one, an erasure
    naming the person by the other would not find the row once the turn's own payload is gone."""
    return sorted({x for i in turn.interactions for x in (i.sender.handle, i.sender.external_id) if x})


def _senders(turn: Turn) -> list[erasure_pb2.ErasureSubject]:
    """The same senders one per person, each identifier in its own field, in the order they spoke:
    what the episode's provenance answers (flat, ``subjects`` cannot say which identifier is a handle
    and which an external id). Every sender SubmitTurn accepts is one (``ErasureSubject`` takes what
    a ``Sender`` takes: a one-letter handle, a platform with a space), so none is left out."""
    seen: dict[tuple[str, str, str], erasure_pb2.ErasureSubject] = {}
    for inter in turn.interactions:
        s = inter.sender
        if s.handle or s.external_id:
            seen.setdefault(
                (s.handle, s.external_id, s.platform),
                erasure_pb2.ErasureSubject(handle=s.handle, external_id=s.external_id, platform=s.platform),
            )
    return list(seen.values())


class Episodist:
    name = "episodist"

    def gate(self, turn: Turn) -> str | None:
        if turn.start_time is None or turn.end_time is None:
            # SubmitTurn refuses such a turn; only one queued before it did reaches here, and its
            # record names why it has no episode.
            return "no_times"
        return None

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        request = ep_pb.RecordEpisodeRequest(
            company=turn.company,
            seat=turn.seat,
            turn_id=turn.turn_id,
            work_item=turn.work_item,
            label=_label(turn),
            ask=turn.asked,
            what_it_did=turn.what_it_did,
            outcome=_outcome(turn.outcome),
            review_outcome=turn.review_outcome,
            tool_sequence=list(turn.tool_sequence),
            tools_called=list(turn.tools_called),
            skills_used=[s.id for s in turn.offered_skills],
            conversation_id=turn.conversation_id,
            start_time=timestamp(turn.start_time),
            end_time=timestamp(turn.end_time),
            subjects=_subjects(turn),
            senders=_senders(turn),
            role=turn.role,
            work_key=turn.work_key,
        )
        resp = await ctx.ports.episodes.record_episode(request)
        if resp.collapsed:
            # A redelivered trigger: its work already has a row (the first run's); this run is
            # filed under it rather than counted as a second turn.
            return WorkerOutcome(
                self.name,
                WorkerStatus.NOTHING,
                detail=f"work {turn.work_key} already recorded (run {resp.episode.turn_id}): collapsed into it",
            )
        return WorkerOutcome(
            self.name,
            WorkerStatus.WROTE,
            written=[f"episode:{resp.episode.id}"],
            detail="recorded" if resp.created else "already recorded",
        )
