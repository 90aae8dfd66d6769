"""Synthesizer (single-turn induction): a settled turn that made ≥ min_tool_calls tool calls is
offered to the auxiliary model, which drafts a skill or declines (the ordinary answer).

The gates that must close BEFORE any model call (a draft made only to be discarded is money spent
for nothing) are the skills service's: SkillService.CheckSkillCandidate answers the per-seat cap and
the tool-SET Jaccard duplicate check. A draft without a name, summary or body is dropped.

One definition on both sides: the gate is asked about the turn's tool set (``Turn.tool_set``, the
set of every tool the turn called) and the skill stores the run that set comes from
(``Turn.tool_run``), so CreateSkill's own duplicate check compares exactly what the gate compared —
a turn the gate lets through is never one CreateSkill then refuses for its tools, and a turn that
called the same tools as a skill's source is a duplicate however its final round ended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import grpc

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.skills.v1 import skill_service_pb2 as sk_pb
from libs.common.auxmodel import OfflineRules
from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus
from services.reflector.workers.base import (
    EpisodePending,
    WorkerContext,
    WorkerPrompt,
    turn_data,
)
from services.reflector.workers.provenance import provenance_of

__all__ = ["PURPOSE", "Synthesizer", "offline_rule", "register"]

PURPOSE = "synthesizer"
MAX_RUN = 500
"""The longest run a skill stores (SkillService's ``tool_sequence`` bound): a longer turn would be
drafted and then refused, so it is not offered to the model."""
_PROMPT = WorkerPrompt.load(PURPOSE)


class Synthesizer:
    name = "synthesizer"

    def __init__(self, min_tool_calls: int):
        self._min = min_tool_calls

    def gate(self, turn: Turn) -> str | None:
        if not turn.outcome.settled:
            return "unsettled"
        if len(turn.tool_run) < self._min:
            return "below_min_tool_calls"
        if len(turn.tool_run) > MAX_RUN:
            return "tool_run_too_long"
        return None

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        check = await ctx.ports.skills.check_candidate(
            sk_pb.CheckSkillCandidateRequest(company=turn.company, seat=turn.seat, tool_set=sorted(turn.tool_set)),
        )
        if check.gate != sk_pb.CANDIDATE_GATE_OPEN:
            if check.HasField("duplicate") and not ctx.first_pass:
                # The duplicate may be this very turn's draft, written by an attempt that stopped
                # before its source episode was stamped: then finish the stamp, draft nothing. (On
                # the turn's first pass no attempt came before: nothing to look up.)
                mine = await self._own_skill(turn, ctx, skill_id=check.duplicate.id)
                if mine is not None:
                    return await self._stamped(turn, ctx, *mine)
            gate = sk_pb.CandidateGate.Name(check.gate).removeprefix("CANDIDATE_GATE_").lower()
            detail = ""
            if check.HasField("duplicate"):
                archived = check.duplicate.state == sk_pb.SKILL_STATE_ARCHIVED
                detail = f"duplicates {check.duplicate.name}" + (" (archived)" if archived else "")
            return WorkerOutcome(self.name, WorkerStatus.SKIPPED, gate=gate, detail=detail)
        draft, completion = await _PROMPT.ask(
            ctx, turn, data=turn_data(turn), max_tokens=1500, tools=", ".join(turn.tool_run)
        )
        if draft.get("decline") is True:
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail=f"declined: {draft.get('reason', '')}"[:300])
        name, summary, body = (str(draft.get(k) or "").strip() for k in ("name", "summary", "body"))
        missing = [k for k, v in (("name", name), ("summary", summary), ("body", body)) if not v]
        if missing:
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail=f"draft dropped: no {', '.join(missing)}")
        try:
            resp = await ctx.ports.skills.create_skill(
                sk_pb.CreateSkillRequest(
                    company=turn.company,
                    seat=turn.seat,
                    name=name,
                    summary=summary,
                    body=body,
                    tool_sequence=list(turn.tool_run),
                    trigger=sk_pb.SKILL_TRIGGER_SINGLE,
                    cluster_size=1,
                    source_turn_ids=[turn.turn_id],
                    # Issue 17: the draft's turn, its senders, the model and prompt that wrote it.
                    provenance=provenance_of(turn, self.name, completion.model, _PROMPT.version),
                ),
            )
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            mine = await self._own_skill(turn, ctx, skill_name=name)
            if mine is not None:  # this very turn wrote it before a crash: the redo stamps it
                return await self._stamped(turn, ctx, *mine)
            return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail=f"draft dropped: {err.details()}"[:300])
        return await self._stamped(turn, ctx, resp.skill.id, name)

    async def _stamped(self, turn: Turn, ctx: WorkerContext, skill_id: str, name: str) -> WorkerOutcome:
        """Stamp the turn's episode with the skill drafted from it (spec: "it stamps
        consolidated_into_skill_id on each source row"), so the lifecycle drops it after the grace
        and no pass offers it as evidence again. The episodist runs first; if it has not recorded
        the episode yet (it failed for a passing reason this attempt), this worker is retried with
        it rather than finish with the source unstamped for good. An episodist that failed for good
        (or whose gate closed) never will: the draft then stands unstamped, and its detail says why."""
        resp = await ctx.ports.episodes.mark_consolidated(
            ep_pb.MarkEpisodesConsolidatedRequest(
                company=turn.company, seat=turn.seat, turn_ids=[turn.turn_id], skill_id=skill_id
            ),
        )
        written = [f"skill:{skill_id} {name}"]
        if resp.marked_count:
            return WorkerOutcome(self.name, WorkerStatus.WROTE, written=[*written, "episode stamped"], detail="drafted")
        if "episodist" in ctx.settings.learning.reflection.workers:
            episodist = ctx.outcomes.get("episodist")
            if episodist is None or episodist.retryable:
                # The skill by id, not its name (the model's text): the harness logs a retried failure.
                raise EpisodePending(
                    f"the episode of {turn.turn_id} is not recorded yet; skill {skill_id} waits to stamp it"
                )
            # The episodist is done with this turn and left no episode (it failed for good, or its
            # gate closed): no retry would bring one, so the draft stands unstamped rather than the
            # turn being retried until it is dead-lettered.
            why = episodist.failure or episodist.gate or episodist.detail or str(episodist.status)
            return WorkerOutcome(
                self.name,
                WorkerStatus.WROTE,
                written=written,
                detail=f"drafted (episode never recorded, left unstamped: episodist {episodist.status}: {why})"[:300],
            )
        return WorkerOutcome(self.name, WorkerStatus.WROTE, written=written, detail="drafted (no episode to stamp)")

    async def _own_skill(
        self, turn: Turn, ctx: WorkerContext, *, skill_id: str = "", skill_name: str = ""
    ) -> tuple[str, str] | None:
        """(id, name) of the named skill when this turn drafted it, else None."""
        try:
            got = await ctx.ports.skills.get_skill(
                sk_pb.GetSkillRequest(company=turn.company, seat=turn.seat, skill_id=skill_id, skill_name=skill_name),
            )
        except grpc.aio.AioRpcError:
            return None
        if turn.turn_id in got.skill.source_turn_ids and got.skill.trigger == sk_pb.SKILL_TRIGGER_SINGLE:
            return got.skill.id, got.skill.name
        return None


# ------------------------------------------------------------------------------ the offline rule

_WORD = re.compile(r"[a-z][a-z0-9]+")
_STOP = set("the a an to of for and or on in at by with from me my our your please can could would you".split())


def offline_rule(data: Mapping[str, Any]) -> str:
    """Drafts only from a done turn that used at least three distinct tools (a real procedure);
    declines everything else. The name comes from the ask's words, the steps from the turn's run
    (every call in order, the run the skill stores)."""
    tools = list(data.get("tool_run") or data.get("tools_called") or data.get("tool_sequence") or [])
    distinct = list(dict.fromkeys(tools))
    if data.get("outcome") != "done" or len(distinct) < 3:
        return json.dumps({"decline": True, "reason": "not a reusable procedure"})
    source = (data.get("asked") or data.get("label") or "").lower()
    words = [w for w in _WORD.findall(source) if w not in _STOP][:4] or ["procedure"]
    name = "-".join(words)[:80]
    title = " ".join(words).capitalize()
    steps = "\n".join(f"{n}. Call `{tool}`." for n, tool in enumerate(tools or distinct, start=1))
    asked = (data.get("asked") or "").strip().splitlines()[0:1]
    body = (
        f"# {title}\n\n"
        f'## When to use\n\nWhen asked something like: "{asked[0] if asked else data.get("label", "")}" '
        f"(woken by: {data.get('label', '')}).\n\n"
        f"## Steps\n\n{steps}\n\n"
        f"## Checks\n\nThe turn this was drafted from ended done: {data.get('what_it_did', '')}\n"
    )
    summary = f"Run {', '.join(distinct[:5])} to {' '.join(words)}."
    return json.dumps({"decline": False, "name": name, "summary": summary, "body": body})


def register(rules: OfflineRules) -> None:
    rules.register(PURPOSE, offline_rule)
