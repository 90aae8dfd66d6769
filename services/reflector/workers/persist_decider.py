"""PersistDecider: after a settled turn, decide what (if anything) the seat's diary should keep.

Only on settled turns (done or failed: a self_iterate round is incomplete work); skipped when the
turn already self-persisted through reflect_and_persist. Shown the seat's recent notes and told not
to repeat one. LONG and SHORT are written through DiaryService.WriteNote with an idempotency key,
DOC is logged as a recommendation, NOOP writes nothing. A note over 2,000 characters is skipped and
logged: there is nobody here to ask to tighten it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.auxmodel import OfflineRules, Prompt
from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus
from services.reflector.workers.base import (
    InvalidOutput,
    WorkerContext,
    ask_model,
    describe_turn,
    parse_object,
    prompt_file,
    turn_data,
)

__all__ = ["PURPOSE", "PersistDecider", "offline_rule", "register"]

_log = logging.getLogger(__name__)
PURPOSE = "persist_decider"
_SYSTEM = prompt_file("persist_decider").template
_USER = prompt_file("persist_decider_user")
MAX_TTL_DAYS = 3650


class PersistDecider:
    name = "persist_decider"

    def gate(self, turn: Turn) -> str | None:
        if not turn.outcome.settled:
            return "unsettled"
        if turn.self_persisted:
            return "self_persisted"
        return None

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        recent = await ctx.clients.diary.RecallNotes(
            diary_pb.RecallNotesRequest(
                company=turn.company,
                seat=turn.seat,
                vector_limit=0,
                lexical_limit=0,
                recency_limit=ctx.settings.learning.reflection.recent_notes_shown,
            ),
            timeout=ctx.clients.timeout,
        )
        notes = [c.note.content for c in recent.candidates]
        prompt = Prompt(
            purpose=PURPOSE,
            system=_SYSTEM,
            user=_USER.substitute(
                turn=describe_turn(turn, senders=True), notes="\n".join(f"- {n}" for n in notes) or "(none)"
            ),
            data={**turn_data(turn), "recent_notes": notes},
            max_tokens=600,
            json_output=True,
        )
        answer = parse_object((await ask_model(ctx, turn, PURPOSE, prompt)).text)
        tier = str(answer.get("classification", "")).upper()
        content = str(answer.get("content") or "")
        if tier not in {"LONG", "SHORT", "DOC", "NOOP"}:
            raise InvalidOutput(f"classification {tier!r} is none of LONG, SHORT, DOC, NOOP")
        out = WorkerOutcome(self.name, WorkerStatus.NOTHING, detail=tier)
        ttl_until = None
        if tier == "NOOP":
            pass
        elif tier == "DOC":
            _log.info("persist decider recommends team documentation for %s/%s: %s", turn.company, turn.seat, content)
            out.detail = f"DOC (recommendation logged, nothing written): {content[:200]}"
        elif not content.strip():
            raise InvalidOutput(f"a {tier} note without content")
        elif len(content) > ctx.settings.learning.diary.max_content_chars:
            _log.warning(
                "persist decider note for %s/%s is %d characters (limit %d); skipped",
                turn.company,
                turn.seat,
                len(content),
                ctx.settings.learning.diary.max_content_chars,
            )
            out = WorkerOutcome(
                self.name, WorkerStatus.SKIPPED, gate="note_too_long", detail=f"{tier} note of {len(content)} chars"
            )
        else:
            ttl = 0
            if tier == "SHORT":
                try:
                    ttl = int(answer.get("ttl_days") or 0)
                except (TypeError, ValueError):
                    raise InvalidOutput(f"ttl_days {answer.get('ttl_days')!r} is not a number") from None
                if not 1 <= ttl <= MAX_TTL_DAYS:
                    raise InvalidOutput(f"a SHORT note needs ttl_days in 1..{MAX_TTL_DAYS}, got {ttl}")
            resp = await ctx.clients.diary.WriteNote(
                diary_pb.WriteNoteRequest(
                    company=turn.company,
                    seat=turn.seat,
                    content=content,
                    tier=diary_pb.NOTE_TIER_LONG if tier == "LONG" else diary_pb.NOTE_TIER_SHORT,
                    ttl_days=ttl,
                    source=diary_pb.NOTE_SOURCE_PERSIST_DECIDER,
                    turn_id=turn.turn_id,
                    request_id=f"{turn.turn_id}:{self.name}",
                ),
                timeout=ctx.clients.timeout,
            )
            if resp.note.HasField("expire_time"):
                ttl_until = resp.note.expire_time.ToDatetime().isoformat()
            out = WorkerOutcome(self.name, WorkerStatus.WROTE, written=[f"note:{resp.note.id} {tier}"], detail=tier)
        await ctx.events.emit(
            "persist_decider_completed",
            company=turn.company,
            seat=turn.seat,
            turn_id=turn.turn_id,
            classification=tier,
            ttl_until=ttl_until,
            written=out.status is WorkerStatus.WROTE,
        )
        return out


# ------------------------------------------------------------------------------ the offline rule

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_SITUATIONAL = [
    (re.compile(r"\b(this|next) week\b", re.I), 7),
    (re.compile(r"\b(this|the current|next) sprint\b", re.I), 14),
    (re.compile(r"\b(on vacation|on holiday|out of (the )?office|ooo|on leave)\b", re.I), 14),
    (re.compile(r"\buntil\b", re.I), 14),
    (re.compile(r"\b(freeze|frozen)\b", re.I), 14),
    (re.compile(r"\btoday\b|\btomorrow\b", re.I), 2),
]
_TEAM = re.compile(r"\b(everyone|the whole team|all teams|every repo|all repos|team[- ]wide)\b", re.I)
_PREFER = re.compile(r"\b(?:i|we)(?: would|'d)? (?:really )?(prefer|like|want|need)s? (.+)", re.I)
_ALWAYS = re.compile(r"\b(?:please )?always (.+)", re.I)
_NEVER = re.compile(r"\b(?:please )?(?:never|don't|do not) (.+)", re.I)
_USE = re.compile(r"\b(?:we|our team) (?:use|uses|run|runs) (.+)", re.I)


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _fact(sender: str, sentence: str) -> tuple[str, str, int] | None:
    """(tier, declarative note, ttl_days) from one sentence a person said, or None."""
    s = sentence.strip().rstrip(".!?")
    if len(s) < 8:
        return None
    for pattern, ttl in _SITUATIONAL:
        if pattern.search(s):
            return ("SHORT", f"{sender} said (situational): {s}.", ttl)
    if _TEAM.search(s):
        return ("DOC", f"{sender} stated a team-wide practice: {s}.", 0)
    if m := _PREFER.search(s):
        return ("LONG", f"{sender} {m.group(1).lower()}s {m.group(2).strip()}.", 0)
    if m := _NEVER.search(s):
        return ("LONG", f"{sender} does not want anyone to {m.group(1).strip()}.", 0)
    if m := _ALWAYS.search(s):
        return ("LONG", f"{sender} expects this every time: {m.group(1).strip()}.", 0)
    if m := _USE.search(s):
        return ("LONG", f"{sender}'s team uses {m.group(1).strip()}.", 0)
    return None


_FILLER = re.compile(r",?\s*\b(by the way|btw|thanks|thank you|please|if possible)\s*$", re.I)
_RANK = {"LONG": 0, "SHORT": 1, "DOC": 2}


def offline_rule(data: Mapping[str, Any]) -> str:
    """Deterministic decision from what people said: preferences and practices are LONG facts,
    dated or temporary state is SHORT, team-wide practice is DOC; anything already noted is NOOP.
    One note a turn: the most durable thing said wins (a standing rule over today's plan)."""
    said = [(i["sender"], i["body"]) for i in data.get("interactions", [])]
    if not said and data.get("ask"):
        said = [("The requester", data["ask"])]
    known = {_norm(n) for n in data.get("recent_notes", [])}
    found = []
    for sender, body in said:
        for sentence in _SENTENCE.findall(body or ""):
            fact = _fact(sender, _FILLER.sub("", sentence.strip().rstrip(".!?")))
            if fact is not None:
                found.append(fact)
    fresh = [f for f in found if _norm(f[1]) not in known]
    if not fresh:
        reason = "already noted" if found else "nothing durable was said"
        return json.dumps({"classification": "NOOP", "reason": reason})
    tier, content, ttl = min(fresh, key=lambda f: _RANK[f[0]])
    answer = {"classification": tier, "content": content[:2000], "reason": "stated in the turn"}
    if tier == "SHORT":
        answer["ttl_days"] = ttl
    return json.dumps(answer)


def register(rules: OfflineRules) -> None:
    rules.register(PURPOSE, offline_rule)
