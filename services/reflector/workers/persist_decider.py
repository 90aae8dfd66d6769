"""PersistDecider: after a settled turn, decide what (if anything) the seat's diary should keep.

Only on settled turns (done or failed: a self_iterate round is incomplete work); skipped when the
turn already self-persisted through reflect_and_persist (the turn's flag says so, or the call is
among its tools). Shown the seat's recent notes and told not to repeat one. LONG and SHORT are
written through DiaryService.WriteNote with an idempotency key, DOC is logged as a recommendation,
NOOP writes nothing — and the decision defaults to NOOP: an answer that names no tier is one. A
note over 2,000 characters is skipped and logged: there is nobody here to ask to tighten it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.auxmodel import OfflineRules
from libs.common.auxmodel.answers import described
from libs.common.memory_tiers import MAX_TTL_DAYS, read_tier, read_ttl_days
from services.reflector.domain import Turn, WorkerOutcome, WorkerStatus, turn_fields
from services.reflector.workers.base import (
    InvalidOutput,
    WorkerContext,
    WorkerPrompt,
    turn_data,
)
from services.reflector.workers.provenance import provenance_of

__all__ = ["PURPOSE", "PersistDecider", "offline_rule", "register", "self_persisted"]

_log = logging.getLogger(__name__)
PURPOSE = "persist_decider"
_PROMPT = WorkerPrompt.load(PURPOSE)
_IN_FLIGHT = "reflect_and_persist"
"""The builtin through which the executor persists a note itself, mid-turn."""


def self_persisted(turn: Turn) -> bool:
    """The turn already wrote to the diary in flight (spec: "the executor called
    reflect_and_persist"): the engine's flag, or the call among the turn's tools — every call, or
    the final round's. Either signal is enough: an engine that reports the call but not the flag
    must not get the same fact noted twice."""
    return turn.self_persisted or _IN_FLIGHT in turn.tools_called or _IN_FLIGHT in turn.tool_sequence


class PersistDecider:
    name = "persist_decider"

    def gate(self, turn: Turn) -> str | None:
        if not turn.outcome.settled:
            return "unsettled"
        if self_persisted(turn):
            return "self_persisted"
        return None

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        recent = await ctx.ports.diary.recall_notes(
            diary_pb.RecallNotesRequest(
                company=turn.company,
                seat=turn.seat,
                vector_limit=0,
                lexical_limit=0,
                recency_limit=ctx.settings.learning.reflection.recent_notes_shown,
            ),
        )
        notes = [c.note.content for c in recent.candidates]
        said = (turn.end_time or ctx.clock.now()).date().isoformat()
        answer, completion = await _PROMPT.ask(
            ctx,
            turn,
            data={**turn_data(turn), "recent_notes": notes},
            max_tokens=600,
            senders=True,
            notes="\n".join(f"- {n}" for n in notes) or "(none)",
            date=said,
        )
        tier = self._tier(answer, turn)
        content = str(answer.get("content") or "")
        out = WorkerOutcome(self.name, WorkerStatus.NOTHING, detail=tier)
        ttl_until = None
        if tier == "NOOP":
            pass
        elif tier == "DOC":
            # The spec's "logs the recommendation": that one was made, on which turn, and which (by
            # length and digest); its text (which names people) stays in the worker's detail.
            _log.info(
                "persist decider recommends team documentation for %s/%s on %s (%s)",
                turn.company,
                turn.seat,
                turn.turn_id,
                described(content),
            )
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
            ttl = read_ttl_days(answer, tier)
            if tier == "SHORT":
                ttl = self._days_left(turn, ctx, ttl)
            if ttl < 0:
                # Situational state that stopped being true before the turn was reflected (a
                # vacation that already ended): nothing to remember.
                _log.info("persist decider note for %s/%s already over; skipped", turn.company, turn.seat)
                out = WorkerOutcome(
                    self.name, WorkerStatus.SKIPPED, gate="already_over", detail=f"{tier}: {content[:200]}"
                )
                await self._completed(turn, ctx, tier, None, False)
                return out
            resp = await ctx.ports.diary.write_note(
                diary_pb.WriteNoteRequest(
                    company=turn.company,
                    seat=turn.seat,
                    content=content,
                    tier=diary_pb.NOTE_TIER_LONG if tier == "LONG" else diary_pb.NOTE_TIER_SHORT,
                    ttl_days=ttl,
                    source=diary_pb.NOTE_SOURCE_PERSIST_DECIDER,
                    turn_id=turn.turn_id,
                    request_id=turn.write_key(self.name),
                    provenance=provenance_of(turn, self.name, completion.model, _PROMPT.version),
                ),
            )
            if resp.note_removed:
                # A redelivery of a turn whose note was deleted since: the diary writes
                # nothing again (the key outlives the note), and nothing is recorded as written.
                out = WorkerOutcome(
                    self.name, WorkerStatus.SKIPPED, gate="note_removed", detail=f"{tier}: deleted since"
                )
                await self._completed(turn, ctx, tier, None, False)
                return out
            if resp.note.HasField("expire_time"):
                ttl_until = resp.note.expire_time.ToDatetime().isoformat()
            out = WorkerOutcome(self.name, WorkerStatus.WROTE, written=[f"note:{resp.note.id} {tier}"], detail=tier)
        await self._completed(turn, ctx, tier, ttl_until, out.status is WorkerStatus.WROTE)
        return out

    @staticmethod
    def _tier(answer: Mapping[str, Any], turn: Turn) -> str:
        """The answer's tier, read by the rules the session judge reads it by (``read_tier``), and
        NOOP when it names none of the four (spec: the decision "Defaults to NOOP"): an answer with
        no classification, or one outside the tiers, asks for nothing to be persisted, so nothing
        is, and the worker is done rather than failed. An answer that is no JSON object never gets
        here — it is ``invalid_output``, as for every worker: a broken model or endpoint, not a
        decision, which NOOP would hide. A tier that is named but not filled in (a LONG note with no
        content, a SHORT one with no days) is ``invalid_output`` too: the model did decide to keep
        something, and nothing can be kept from what it wrote."""
        try:
            return read_tier(answer)
        except InvalidOutput as exc:
            _log.warning("persist decider answer for %s/%s names no tier, NOOP: %s", turn.company, turn.seat, exc)
            return "NOOP"

    @staticmethod
    def _days_left(turn: Turn, ctx: WorkerContext, ttl_days: int) -> int:
        """A SHORT note's days counted from the turn (when it was said), as the diary's TTL counts
        from the write: a reflection that runs late (a retry, a backlog) must not stretch situational
        state past its end. -1 when it has already ended."""
        said = turn.end_time or ctx.clock.now()
        left = (said + timedelta(days=ttl_days) - ctx.clock.now()).total_seconds()
        if left <= 0:
            return -1
        return min(MAX_TTL_DAYS, max(1, math.ceil(left / 86400)))

    @staticmethod
    async def _completed(turn: Turn, ctx: WorkerContext, tier: str, ttl_until: str | None, written: bool) -> None:
        await ctx.events.emit(
            "persist_decider_completed",
            **turn_fields(turn),
            classification=tier,
            ttl_until=ttl_until,
            written=written,
        )


# ------------------------------------------------------------------------------ the offline rule
#
# The rules the spec gives the model, kept with no model at all: NOOP unless something durable was
# said; one tier (LONG / SHORT with the days it stays true / DOC / NOOP); DECLARATIVE facts about
# the people and their work, never instructions to the agent and never a quote of what was said;
# no repeat of a recent note, a paraphrase included; only what people said in this turn (never the
# seat's own messages); a note is never trimmed (past the limit the worker skips it and logs it).

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_SITUATIONAL = re.compile(
    r"\b(this|next) week\b|\b(this|the current|next) sprint\b|\bon vacation\b|\bon holiday\b"
    r"|\bout of (the )?office\b|\booo\b|\bon leave\b|\buntil\b|\b(through|thru|till) (the \d|\d{4}-|[a-z]{3,9} \d)"
    r"|\bfreeze\b|\bfrozen\b|\btoday\b|\btomorrow\b|\bawaiting\b|\bpending review\b",
    re.I,
)
_DEFAULT_SHORT_DAYS = 14
"""A situational statement that names no end lasts this long from when it was said."""
_TEAM = re.compile(r"\b(everyone|the whole team|all teams|every repo|all repos|team[- ]wide)\b", re.I)
_PREFER = re.compile(r"^(i|we)(?: (would)|'(d))? (?:really )?(prefer|like|want|need)s? (.+)$", re.I)
_ALWAYS = re.compile(r"^(?:please )?always (.+)$", re.I)
_NEVER = re.compile(r"^(?:please )?(?:never|don't|do not) (.+)$", re.I)
_USE = re.compile(r"^(we|our team) (use|uses|run|runs|deploy|deploys|work|works) (.+)$", re.I)
_LEAD = re.compile(
    r"^(?:(?:heads up|fyi|btw|by the way|also|ok|okay|so|and|hi|hey|hello|thanks|thank you)\b[\s,:;!-]*)+", re.I
)
_FILLER = re.compile(r",?\s*\b(by the way|btw|thanks|thank you|please|if possible)\s*$", re.I)
_CONSEQUENCE = re.compile(r"\s*(?:,|;|—| - )\s*(?:so|and so|which means|therefore)\b.*$", re.I)
_RANK = {"LONG": 0, "SHORT": 1, "DOC": 2}
_WORD = re.compile(r"[a-z0-9]+")
_STOP = set(
    "a an the and or but of to in on at for with from by is are was were be been being it its this that "
    "these those i me my we our you your he she they them their his her as so do does did not no would "
    "over than".split()
)
_PARAPHRASE = 0.6
"""Content-word Jaccard at or above which a fact repeats a recent note (a paraphrase is a repeat)."""
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_UNTIL = r"(?:until|till|through|thru|to)"


def _norm(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def _content_words(text: str) -> frozenset[str]:
    """The words that carry a note's meaning, crudely stemmed (a plural or third-person "s" off),
    so "prefers weekly digests" and "would prefer a weekly digest" are compared word for word."""
    words = (w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1)
    return frozenset(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words)


def _repeats(fact: str, known: list[frozenset[str]], exact: set[str]) -> bool:
    if _norm(fact) in exact:
        return True
    words = _content_words(fact)
    return any(words and k and len(words & k) / len(words | k) >= _PARAPHRASE for k in known)


def _third_person(text: str, sender: str, seat: str, *, sentence: bool = False) -> str:
    """What someone said, restated about them: "I'm on leave" by Bob is "Bob is on leave"; "you"
    is the seat the message was addressed to."""
    seat = seat or "the agent"
    swaps = [
        (r"\bI'm\b|\bI am\b", f"{sender} is"),
        (r"\bI've\b|\bI have\b", f"{sender} has"),
        (r"\bI'll\b|\bI will\b", f"{sender} will"),
        (r"\bI'd\b|\bI would\b", f"{sender} would"),
        (r"\bI was\b", f"{sender} was"),
        (r"\bI\b", sender),
        (r"\b[Mm]y\b", f"{sender}'s"),
        (r"\b[Mm]e\b", sender),
        (r"\b[Mm]yself\b", sender),
        (r"\b[Ww]e're\b|\b[Ww]e are\b", f"{sender}'s team is"),
        (r"\b[Ww]e've\b|\b[Ww]e have\b", f"{sender}'s team has"),
        (r"\b[Ww]e'll\b|\b[Ww]e will\b", f"{sender}'s team will"),
        (r"\b[Ww]e\b", f"{sender}'s team"),
        (r"\b[Oo]ur\b", f"{sender}'s team's"),
        (r"\b[Uu]s\b", f"{sender}'s team"),
        (r"\b[Yy]ou're\b|\b[Yy]ou are\b", f"{seat} is"),
        (r"\b[Yy]our\b", f"{seat}'s"),
        (r"\b[Yy]ou\b", seat),
    ]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    return text[:1].upper() + text[1:] if sentence else text


def _until(sentence: str, said: date) -> date | None:
    """The last day a situational statement names ("until the 20th", "through 2026-05-10",
    "until May 10", "this week", "today"), counted from the day it was said."""
    s = sentence.lower()
    if m := re.search(rf"\b{_UNTIL} (\d{{4}})-(\d{{2}})-(\d{{2}})\b", s):
        try:
            return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        except ValueError:
            return None
    if m := re.search(rf"\b{_UNTIL} ([a-z]{{3}})[a-z]* (\d{{1,2}})(?:st|nd|rd|th)?\b", s):
        month = _MONTHS.get(m.group(1))
        if month is not None:
            for year in (said.year, said.year + 1):
                try:
                    day = date(year, month, int(m.group(2)))
                except ValueError:
                    return None
                if day >= said:
                    return day
    if m := re.search(rf"\b{_UNTIL} the (\d{{1,2}})(?:st|nd|rd|th)\b", s):
        n = int(m.group(1))
        year, month = said.year, said.month
        for _ in range(3):  # this month, else the next that has the day
            try:
                day = date(year, month, n)
                if day >= said:
                    return day
            except ValueError:
                pass
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        return None
    if re.search(r"\btoday\b", s):
        return said
    if re.search(r"\btomorrow\b", s):
        return said + timedelta(days=1)
    if re.search(r"\bthis week\b", s):
        return said + timedelta(days=6 - said.weekday())
    if re.search(r"\bnext week\b", s):
        return said + timedelta(days=13 - said.weekday())
    return None


def _fact(sender: str, sentence: str, seat: str, said: date) -> tuple[str, str, int] | None:
    """(tier, declarative note, ttl_days from the day it was said) from one sentence a person said,
    or None when it states nothing durable."""
    s = _FILLER.sub("", _LEAD.sub("", sentence.strip()).strip().rstrip(".!?")).strip()
    if len(s) < 8:
        return None
    if _SITUATIONAL.search(s):
        until = _until(s, said)
        ttl = (until - said).days + 1 if until is not None else _DEFAULT_SHORT_DAYS
        note = f"{_third_person(s, sender, seat, sentence=True)} (said {said.isoformat()})."
        return ("SHORT", note, max(1, ttl))
    if _TEAM.search(s):
        return ("DOC", f"{sender} describes a team-wide practice: {_third_person(s, sender, seat)}.", 0)
    if m := _PREFER.match(s):
        who = sender if m.group(1).lower() == "i" else f"{sender}'s team"
        verb = m.group(4).lower()
        rest = _third_person(_CONSEQUENCE.sub("", m.group(5)).strip(), sender, seat)
        if m.group(2) or m.group(3):
            return ("LONG", f"{who} would {verb} {rest}.", 0)
        return ("LONG", f"{who} {verb}s {rest}.", 0)
    if m := _NEVER.match(s):
        return ("LONG", f"{sender} does not want anyone to {_third_person(m.group(1), sender, seat)}.", 0)
    if m := _ALWAYS.match(s):
        return (
            "LONG",
            f"{sender} expects {seat or 'the agent'} to {_third_person(m.group(1), sender, seat)} every time.",
            0,
        )
    if m := _USE.match(s):
        rest = _CONSEQUENCE.sub("", m.group(3)).strip()
        verb = m.group(2).lower()
        verb = verb if verb.endswith("s") else f"{verb}s"
        return ("LONG", f"{sender}'s team {verb} {_third_person(rest, sender, seat)}.", 0)
    return None


def _said_on(data: Mapping[str, Any]) -> date:
    end = data.get("end_time")
    if end:
        try:
            return datetime.fromisoformat(end).date()
        except ValueError:
            pass
    return datetime.now(UTC).date()


def offline_rule(data: Mapping[str, Any]) -> str:
    """Deterministic decision from what people said: preferences and practices are LONG facts,
    dated or temporary state is SHORT (its days counted from when it was said), team-wide practice
    is DOC; anything already noted, paraphrases included, is NOOP. One note a turn: the most durable
    thing said wins (a standing rule over today's plan). The seat's own messages are not facts
    about anyone it works with."""
    seat = data.get("seat", "")
    said = [(i["sender"], i["body"]) for i in data.get("interactions", []) if not i.get("sender_is_seat")]
    if not said and not data.get("interactions") and data.get("ask"):
        said = [("The requester", data["ask"])]
    recent = list(data.get("recent_notes", []))
    exact = {_norm(n) for n in recent}
    known = [_content_words(n) for n in recent]
    day = _said_on(data)
    found = []
    for sender, body in said:
        for sentence in _SENTENCE.findall(body or ""):
            fact = _fact(sender, sentence, seat, day)
            if fact is not None:
                found.append(fact)
    fresh = [f for f in found if not _repeats(f[1], known, exact)]
    if not fresh:
        reason = "already noted" if found else "nothing durable was said"
        return json.dumps({"classification": "NOOP", "reason": reason})
    tier, content, ttl = min(fresh, key=lambda f: _RANK[f[0]])
    # Whole, never trimmed: a note past the limit is the worker's to skip and log.
    answer: dict[str, Any] = {"classification": tier, "content": content, "reason": "stated in the turn"}
    if tier == "SHORT":
        answer["ttl_days"] = ttl
    return json.dumps(answer)


def register(rules: OfflineRules) -> None:
    rules.register(PURPOSE, offline_rule)
