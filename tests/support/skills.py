"""Building and sending skill requests for tests and benchmarks: one place that knows a
CreateSkill request's shape, so a test names only what it is about."""

from __future__ import annotations

from collections.abc import Sequence

from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from agentlearn.skills.v1 import skill_service_pb2_grpc as sk_grpc

__all__ = ["create_skill", "skill_request"]


def skill_request(
    seat: str,
    name: str,
    summary: str,
    body: str,
    tools: Sequence[str],
    source_turn_ids: Sequence[str],
    *,
    company: str = "acme",
    **extra: object,
) -> sk_pb.CreateSkillRequest:
    """A CreateSkill request of a skill ``seat`` learned from one turn (the single trigger):
    ``source_turn_ids`` names it; ``extra`` sets or overrides any other request field."""
    fields: dict[str, object] = {
        "company": company,
        "seat": seat,
        "name": name,
        "summary": summary,
        "body": body,
        "tool_sequence": list(tools),
        "trigger": sk_pb.SKILL_TRIGGER_SINGLE,
        "source_turn_ids": list(source_turn_ids),
    }
    fields.update(extra)
    return sk_pb.CreateSkillRequest(**fields)  # type: ignore[arg-type]  # field names checked by protobuf at run time


async def create_skill(
    stub: sk_grpc.SkillServiceStub,
    name: str,
    tools: Sequence[str],
    *,
    seat: str = "ana",
    company: str = "acme",
    summary: str | None = None,
    body: str | None = None,
    source_turn_ids: Sequence[str] | None = None,
    **extra: object,
) -> sk_pb.Skill:
    """CreateSkill for ``company``/``seat`` with the defaults the skills' integration tests share (a
    single-turn skill drafted from the turn ``run-<name>``); returns the created skill."""
    request = skill_request(
        seat,
        name,
        f"Use for {name}" if summary is None else summary,
        f"# {name}\n" if body is None else body,
        tools,
        [f"run-{name}"] if source_turn_ids is None else source_turn_ids,
        company=company,
        **extra,
    )
    return (await stub.CreateSkill(request)).skill
