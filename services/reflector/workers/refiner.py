"""Refiner (auto path): after a settled turn that was offered skills, one auxiliary call over the
whole offered catalogue picks at most one skill and one bullet ("Observed in practice" after a
success, "Counter-example" after a failure), or NOOP — the expected answer.

Never on self_iterate (work the agent judged incomplete). Only skills that still exist: the offered
ids are intersected with the live catalogue, so an archived skill is not resurrected, and a turn
whose skills are all gone costs no model call. A name the model invents is dropped rather than
matched onto the nearest skill. Left unbuilt when refinement is off (see bootstrap).

An observation longer than the skill service takes (AppendSkillObservation's contract) is left out
whole, never clipped: a clip lands mid-step and a reader takes the fragment for the whole lesson
(spec: refused, never truncated). The auto path has no model to hand the refusal back to, so the
turn's outcome is SKIPPED with the reason, and the log names the size, not the text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from libs.common.auxmodel import OfflineRules
from libs.common.contract import string_max_len
from libs.common.outcomes import TurnOutcome
from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus
from services.reflector.workers.base import (
    InvalidOutput,
    WorkerContext,
    WorkerPrompt,
    turn_data,
)
from services.reflector.workers.provenance import provenance_of

if TYPE_CHECKING:  # the stubs load lazily in run(), as before
    from agentlearn.skills.v1 import skill_service_pb2 as sk_pb

__all__ = ["PURPOSE", "Refiner", "offline_rule", "register"]

PURPOSE = "refiner"
_PROMPT = WorkerPrompt.load(PURPOSE)
_log = logging.getLogger(__name__)


class Refiner:
    name = "refiner"

    def __init__(self, on_success: bool, on_failure: bool):
        self._on_success = on_success
        self._on_failure = on_failure

    def gate(self, turn: Turn) -> str | None:
        if not turn.outcome.settled:
            return "unsettled"
        if not turn.offered_skills:
            return "no_skills_used"
        if turn.outcome is TurnOutcome.DONE and not self._on_success:
            return "auto_refine_on_success_off"
        if turn.outcome is TurnOutcome.FAILED and not self._on_failure:
            return "auto_refine_on_failure_off"
        return None

    async def _live(self, turn: Turn, ctx: WorkerContext) -> list[sk_pb.Skill]:
        from agentlearn.skills.v1 import skill_service_pb2 as sk_pb

        wanted = {s.id for s in turn.offered_skills}
        live, token = [], ""
        while True:
            page = await ctx.ports.skills.list_skills(
                sk_pb.ListSkillsRequest(
                    company=turn.company, seat=turn.seat, page_size=200, page_token=token, view=sk_pb.SKILL_VIEW_FULL
                ),
            )
            live += [s for s in page.skills if s.id in wanted]
            token = page.next_page_token
            if not token:
                return live

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        from agentlearn.skills.v1 import skill_service_pb2 as sk_pb

        live = await self._live(turn, ctx)
        if not live:
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail="no offered skill is live; no model call")
        catalogue = "\n\n".join(f"### {s.name}\n{s.summary}\n\n{s.body}" for s in live)
        answer, completion = await _PROMPT.ask(
            ctx,
            turn,
            data={
                **turn_data(turn),
                "skills": [{"name": s.name, "tool_sequence": list(s.tool_sequence)} for s in live],
            },
            max_tokens=300,
            skills=catalogue,
        )
        if answer.get("noop") is True or not answer.get("skill"):
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail="NOOP")
        by_name = {s.name: s for s in live}
        skill = by_name.get(str(answer["skill"]))
        if skill is None:
            return WorkerOutcome(
                self.name, WorkerStatus.NOTHING, detail=f"dropped: invented skill name {answer['skill']!r}"[:300]
            )
        observation = " ".join(str(answer.get("observation") or "").split())
        if not observation:
            raise InvalidOutput("an observation without text")
        limit = string_max_len(sk_pb.AppendSkillObservationRequest, "observation")
        if len(observation) > limit:
            _log.info(
                "refiner: %s/%s turn %s: observation for skill %s is %d characters (limit %d); left out",
                turn.company,
                turn.seat,
                turn.turn_id,
                skill.id,
                len(observation),
                limit,
            )
            return WorkerOutcome(
                self.name,
                WorkerStatus.SKIPPED,
                gate="observation_too_long",
                detail=f"{skill.name}: observation of {len(observation)} characters (limit {limit})"[:300],
            )
        kind = (
            sk_pb.OBSERVATION_KIND_OBSERVED
            if turn.outcome is TurnOutcome.DONE
            else sk_pb.OBSERVATION_KIND_COUNTER_EXAMPLE
        )
        resp = await ctx.ports.skills.append_observation(
            sk_pb.AppendSkillObservationRequest(
                company=turn.company,
                seat=turn.seat,
                skill_id=skill.id,
                kind=kind,
                observation=observation,
                turn_id=turn.turn_id,
                request_id=f"{turn.turn_id}:{self.name}",
                # Issue 17: the bullet's turn, its senders, the model and prompt that wrote it.
                provenance=provenance_of(turn, self.name, completion.model, _PROMPT.version),
            ),
        )
        if resp.skipped:
            reason = sk_pb.ObservationSkipReason.Name(resp.skip_reason)
            return WorkerOutcome(self.name, WorkerStatus.SKIPPED, gate=reason.lower(), detail=skill.name)
        return WorkerOutcome(
            self.name, WorkerStatus.WROTE, written=[f"skill:{skill.id} v{resp.skill.version}"], detail=skill.name
        )


# ------------------------------------------------------------------------------ the offline rule


def offline_rule(data: Mapping[str, Any]) -> str:
    """NOOP unless the turn clearly taught a skill something: a failure of a turn that ran a skill's
    tools is a counter-example; a success that needed a tool the skill does not name is an
    observation. Picks the skill whose tools the turn overlapped most."""
    turn_tools = set(data.get("tools_called") or [])
    best, overlap = None, 0
    for skill in data.get("skills", []):
        n = len(turn_tools & set(skill.get("tool_sequence") or []))
        if n > overlap:
            best, overlap = skill, n
    if best is None:
        return json.dumps({"noop": True})
    # The rule's own bullet stays within the observation bound (1,000): a label may be 1,000
    # characters and a turn may call many tools, and a bullet past the bound is left out whole,
    # so the rule writes its parts short rather than losing the lesson.
    label = _short(str(data.get("label") or ""), _LABEL_CHARS)
    if data.get("outcome") == "failed":
        lines = (data.get("what_it_did") or "it failed").strip().splitlines() or ["it failed"]
        tail = _short(lines[0], _TAIL_CHARS)
        return json.dumps({"noop": False, "skill": best["name"], "observation": f"{label}: {tail}"})
    extra = sorted(turn_tools - set(best.get("tool_sequence") or []))
    if not extra:
        return json.dumps({"noop": True})
    named = extra[:_EXTRA_TOOLS]
    more = f" and {len(extra) - len(named)} more" if len(extra) > len(named) else ""
    tools = _short(", ".join(named), _TAIL_CHARS) + more
    return json.dumps(
        {
            "noop": False,
            "skill": best["name"],
            "observation": f"also needed {tools} when woken by {label}",
        }
    )


_LABEL_CHARS = 200
_TAIL_CHARS = 300
_EXTRA_TOOLS = 10


def _short(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, cut at a word with a mark that it was cut (the offline
    rule's own wording, not the person's lesson: shortening it loses no step)."""
    if len(text) <= limit:
        return text
    head = text[: limit - 2]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + " …"


def register(rules: OfflineRules) -> None:
    rules.register(PURPOSE, offline_rule)
