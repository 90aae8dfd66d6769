"""Building TurnCompleted events (and raw episodes) for tests and benchmarks."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.reflector.v1 import reflector_service_pb2 as pb

__all__ = ["message", "raw_episode", "ts", "turn", "turn_fields"]


def ts(value: datetime) -> Timestamp:
    """``value`` as a protobuf Timestamp."""
    out = Timestamp()
    out.FromDatetime(value)
    return out


def turn_fields(
    company: str,
    seat: str,
    turn_id: str,
    label: str,
    ask: str,
    what_it_did: str,
    outcome: int,
    end: datetime,
    minutes: float,
) -> dict[str, Any]:
    """What a turn's TurnCompleted and the RecordEpisode request of it both say, under the same
    field names: whose turn, what it was asked and did, how it ended, and the ``minutes`` it ran up
    to ``end``."""
    return {
        "company": company,
        "seat": seat,
        "turn_id": turn_id,
        "label": label,
        "ask": ask,
        "what_it_did": what_it_did,
        "outcome": outcome,
        "start_time": ts(end - timedelta(minutes=minutes)),
        "end_time": ts(end),
    }


def raw_episode(  # type: ignore[no-untyped-def]
    seat: str,
    turn_id: str,
    end: datetime,
    label: str,
    ask: str,
    what: str,
    tools,
    outcome=ep_pb.TURN_OUTCOME_DONE,
    *,
    minutes: float = 1,
    company: str = "acme",
    **fields,
) -> ep_pb.RecordEpisodeRequest:
    """A RecordEpisode request of ``company``'s ``seat``: a turn that ran the ``minutes`` up to
    ``end``, with any other ``fields`` of the request."""
    return ep_pb.RecordEpisodeRequest(
        **turn_fields(company, seat, turn_id, label, ask, what, outcome, end, minutes),
        tool_sequence=list(tools),
        **fields,
    )


def message(sender: str, body: str, platform: str = "slack", **kw) -> pb.InboundInteraction:  # type: ignore[no-untyped-def]
    return pb.InboundInteraction(
        sender=pb.Sender(handle=sender, platform=platform, display_name=sender.title()), body=body, **kw
    )


def turn(
    turn_id: str,
    *,
    now: datetime,
    company: str = "acme",
    seat: str = "ana",
    role: str = "swe",
    outcome: int = pb.TURN_OUTCOME_DONE,
    tools: list[str] | None = None,
    final_round: list[str] | None = None,
    messages: list[pb.InboundInteraction] | None = None,
    label: str = "Message from Bob: Slack message",
    ask: str = "",
    what_it_did: str = "Answered the question.",
    offered: list[tuple[str, str]] | None = None,
    trigger: int = pb.TRIGGER_KIND_MESSAGE,
    self_persisted: bool = False,
    review_outcome: str = "approved",
    minutes: float = 3,
) -> pb.TurnCompleted:
    # ``tools`` is every call the turn made, in order; ``final_round`` the tools of its last round
    # (by default the last call alone): the two lists the engine reports are not the same list.
    tools = ["search_docs", "read_ticket"] if tools is None else tools
    final_round = tools[-1:] if final_round is None else final_round
    return pb.TurnCompleted(
        **turn_fields(company, seat, turn_id, label, ask, what_it_did, outcome, now, minutes),
        work_key=f"work-{turn_id}",
        role=role,
        review_outcome=review_outcome,
        tool_sequence=final_round,
        tools_called=tools,
        offered_skills=[pb.OfferedSkill(id=i, name=n) for i, n in (offered or [])],
        interactions=messages or [],
        self_persisted=self_persisted,
        trigger_kind=trigger,
        conversation_id=f"conv-{seat}",
    )
