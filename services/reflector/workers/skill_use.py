"""SkillUse: every skill the turn's prompt offered is marked used (spec: "Being offered is being
used"), through SkillService.MarkSkillsUsed with an idempotency key."""

from __future__ import annotations

from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus
from services.reflector.workers.base import WorkerContext

__all__ = ["SkillUse"]


class SkillUse:
    name = "skill_use"

    def gate(self, turn: Turn) -> str | None:
        return None if turn.offered_skills else "no_skills_offered"

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        from agentlearn.skills.v1 import skill_service_pb2 as sk_pb

        resp = await ctx.ports.skills.mark_used(
            sk_pb.MarkSkillsUsedRequest(
                company=turn.company,
                seat=turn.seat,
                skill_ids=[s.id for s in turn.offered_skills],
                turn_id=turn.turn_id,
                request_id=f"{turn.turn_id}:{self.name}",
            ),
        )
        if resp.marked_count == 0:
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail="no offered skill is live any more")
        return WorkerOutcome(
            self.name, WorkerStatus.WROTE, written=[f"skill_uses:{resp.marked_count}"], detail="marked used"
        )
