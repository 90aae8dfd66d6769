"""Building skill requests for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

from agentlearn.skills.v1 import skill_service_pb2 as sk_pb

__all__ = ["skill_request"]


def skill_request(
    seat: str,
    name: str,
    summary: str,
    body: str,
    tools: Sequence[str],
    source_turn_ids: Sequence[str],
    *,
    company: str = "acme",
) -> sk_pb.CreateSkillRequest:
    """A CreateSkill request of a skill ``seat`` learned from one turn (the single trigger):
    ``source_turn_ids`` names it."""
    return sk_pb.CreateSkillRequest(
        company=company,
        seat=seat,
        name=name,
        summary=summary,
        body=body,
        tool_sequence=list(tools),
        trigger=sk_pb.SKILL_TRIGGER_SINGLE,
        source_turn_ids=list(source_turn_ids),
    )
