"""A skill created over the CreateSkill RPC, with the defaults the skills' integration tests share
(a single-turn skill drafted from the turn ``run-<name>``), so a test names only what it is about."""

from __future__ import annotations

from collections.abc import Sequence

from agentlearn.skills.v1 import skill_service_pb2 as pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as pb_grpc

__all__ = ["create_skill"]


async def create_skill(
    stub: pb_grpc.SkillServiceStub,
    name: str,
    tools: Sequence[str],
    *,
    seat: str = "ana",
    company: str = "acme",
    **fields: object,
) -> pb.Skill:
    """CreateSkill for ``company``/``seat``; ``fields`` set or override any other request field."""
    fields.setdefault("summary", f"Use for {name}")
    fields.setdefault("body", f"# {name}\n")
    fields.setdefault("trigger", pb.SKILL_TRIGGER_SINGLE)
    fields.setdefault("source_turn_ids", [f"run-{name}"])
    request = pb.CreateSkillRequest(company=company, seat=seat, name=name, tool_sequence=list(tools), **fields)  # type: ignore[arg-type]
    return (await stub.CreateSkill(request)).skill
