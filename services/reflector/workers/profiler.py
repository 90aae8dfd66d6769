"""Profiler: one observation pass per distinct sender of the turn's inbound interactions, written
through ProfileService.UpsertProfile into the observing seat's private profile of that sender.

Runs on unsettled turns too (who someone is does not depend on how the turn ended). Never the seat
itself; an agent-to-agent ask, a schedule's fire or a sandbox completion carries no interactions to
profile (they are internal triggers), so such turns are skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import grpc

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from agentlearn.profiles.v1 import profile_service_pb2 as pr_pb
from libs.common.auxmodel import OfflineRules
from libs.common.auxmodel.answers import digest
from libs.common.contract import repeated_string_bounds, string_max_len
from libs.common.erasure import platform_key
from services.reflector.domain import (
    RETRYABLE_FAILURES,
    Interaction,
    Sender,
    Trigger,
    Turn,
    WorkerOutcome,
    WorkerStatus,
)
from services.reflector.workers.base import (
    InvalidOutput,
    WorkerContext,
    WorkerPrompt,
    failure_kind,
    failure_text,
)

__all__ = ["PURPOSE", "Profiler", "context_of", "offline_rule", "register", "subjects_of"]

_log = logging.getLogger(__name__)
PURPOSE = "profiler"
_PROMPT = WorkerPrompt.load(PURPOSE)
_INTERNAL = {Trigger.AGENT_ASK, Trigger.SCHEDULE, Trigger.SANDBOX}

# What UpsertProfile takes, read from its contract (the service refuses past these, never trims):
# the characters of a communication style, and per list the items and an item's characters. The
# prompt states the same numbers (tests/test_reflector_workers.py checks they agree).
STYLE_CHARS = string_max_len(pr_pb.UpsertProfileRequest, "communication_style")
LIST_BOUNDS = {
    f: repeated_string_bounds(pr_pb.UpsertProfileRequest, f) for f in ("past_decisions", "sensitivities", "topics")
}


def subjects_of(turn: Turn) -> list[tuple[Sender, list[Interaction]]]:
    """Each distinct sender with their messages in order (a thread where one person sent four
    messages is one counterparty); the seat itself is never a subject."""
    groups: dict[str, tuple[Sender, list[Interaction]]] = {}
    for item in turn.interactions:
        if not (item.sender.handle or item.sender.external_id) or item.sender.is_seat(turn.seat):
            continue
        groups.setdefault(item.sender.key, (item.sender, []))[1].append(item)
    return list(groups.values())


def context_of(turn: Turn, sender: Sender) -> str:
    """The turn around one sender's messages, as that sender's pass is shown it. The pass rests on
    that sender's messages alone (its provenance names them only, so erasing another sender must
    find nothing of theirs in this profile); the context is what is no other person's words:

    - what woke the turn (its label: what kind of event it was, never what was said);
    - what the agent did (its own account), only when ``sender`` wrote every message of the turn
      that is not the seat's (a sender too anonymous to profile counts as another person). The
      account of a turn several people wrote in restates what each of them asked ("reassigned the
      fix while Carol is on leave"), so there it is left out.

    Never what the turn was asked (describe_turn's "Asked": every sender's messages, the seat's own
    included — the seat's messages quote and answer the others)."""
    lines = [f"Woken by: {turn.label or '(no label)'}"]
    if all(i.sender.key == sender.key for i in turn.interactions if not i.sender.is_seat(turn.seat)):
        lines.append(f"What it did: {turn.what_it_did or '(no account)'}")
    return "\n".join(lines)


def _strings(value: Any, field: str, where: str) -> list[str]:
    """The answer's ``field`` as UpsertProfile takes it: items stripped, blank ones dropped; an item
    past the contract's item bound left out whole, never cut (a clipped decision reads as the whole
    decision: docs/services/profiles.md, "Why refuse rather than trim"); of the rest the model's
    first ``max_items`` (the prompt asks for the most telling first, and the merge keeps the first
    sent newest). A list past the bound sent as it came would be refused whole, and with it the
    sender's style and other lists of the turn."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidOutput(f"{field} must be a list of strings")
    most, longest = LIST_BOUNDS[field]
    items = [v.strip() for v in value if v.strip()]
    kept = [v for v in items if len(v) <= longest]
    if len(kept) < len(items):
        _log.info("profiler: %s: left out %d %s past %d characters", where, len(items) - len(kept), field, longest)
    if len(kept) > most:
        _log.info("profiler: %s: kept the first %d of %d %s", where, most, len(kept), field)
    return kept[:most]


class Profiler:
    name = "profiler"

    def gate(self, turn: Turn) -> str | None:
        if turn.trigger in _INTERNAL:
            return f"internal_trigger_{turn.trigger}"
        if not subjects_of(turn):
            return "no_counterparty"
        return None

    async def run(self, turn: Turn, ctx: WorkerContext) -> WorkerOutcome:
        """One pass per sender, each on its own: one sender's failure (a model that does not answer
        for it, an answer that is unusable, a profile the service refuses) costs neither the senders
        before it nor the ones after. A passing failure leaves the worker to be retried, and the
        retry skips the senders this turn already merged."""
        subjects = subjects_of(turn)
        # On the turn's first pass no earlier attempt can have merged anything: nothing to look up.
        merged = set() if ctx.first_pass else await self._merged_already(turn, ctx, [s for s, _ in subjects])
        written: list[str] = []
        failures: list[tuple[str, BaseException]] = []
        for sender, messages in subjects:
            if sender.key in merged:
                written.append(f"profile:{sender.key}")
                continue
            try:
                if await self._observe(turn, ctx, sender, messages):
                    written.append(f"profile:{sender.key}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The sender by digest: a log line is kept where no erasure of that person reaches.
                _log.warning(
                    "profiler: sender %s on %s not profiled: %s", digest(sender.key), turn.turn_id, failure_text(exc)
                )
                failures.append((sender.key, exc))
        if not failures:
            if not written:
                return WorkerOutcome(self.name, WorkerStatus.NOTHING, detail="nothing to add")
            return WorkerOutcome(self.name, WorkerStatus.WROTE, written=written)
        passing = [(key, exc) for key, exc in failures if failure_kind(exc) in RETRYABLE_FAILURES]
        key, first = (passing or failures)[0]
        # The sender by digest here too: a retrying or dead-lettered reflection logs its failures
        # (services/reflector/harness.py), and a log line is kept where no erasure reaches.
        failure = (
            f"{failure_text(first)} (sender {digest(key)}; {len(failures)} of {len(subjects)} senders not profiled)"
        )
        if passing:
            status = WorkerStatus.RETRYING
        else:
            status = WorkerStatus.WROTE if written else WorkerStatus.FAILED
        return WorkerOutcome(self.name, status, failure=failure[:500], written=written)

    async def _observe(self, turn: Turn, ctx: WorkerContext, sender: Sender, messages: list[Interaction]) -> bool:
        """One sender's observation pass, shown that sender's messages and the turn's
        :func:`context_of` — never the turn described whole (its template has no ``$turn``); True
        when a profile was written."""
        answer, completion = await _PROMPT.ask(
            ctx,
            turn,
            data={"sender": sender.name, "platform": sender.platform, "messages": [m.body for m in messages]},
            max_tokens=500,
            sender=sender.name,
            platform=sender.platform,
            messages="\n".join(f"- {m.body}" for m in messages),
            context=context_of(turn, sender),
        )
        if answer.get("noop") is True:
            return False
        style = answer.get("communication_style") or ""
        if not isinstance(style, str):
            raise InvalidOutput("communication_style must be a string")
        where = f"sender {digest(sender.key)} on {turn.turn_id}"  # logged: the sender by digest
        style = style.strip()
        if len(style) > STYLE_CHARS:  # left out whole, as a list item past its bound
            _log.info(
                "profiler: %s: left out a communication_style of %d characters (%d)", where, len(style), STYLE_CHARS
            )
            style = ""
        lists = {f: _strings(answer.get(f), f, where) for f in LIST_BOUNDS}
        if not style and not any(lists.values()):  # all of it past the bounds: nothing to merge
            return False
        request = pr_pb.UpsertProfileRequest(
            company=turn.company,
            observer=turn.seat,
            subject=pr_pb.Subject(handle=sender.handle, external_id=sender.external_id, platform=sender.platform),
            communication_style=style,
            past_decisions=lists["past_decisions"],
            sensitivities=lists["sensitivities"],
            topics=lists["topics"],
            turn_id=turn.turn_id,
            request_id=turn.write_key(self.name, sender.key),
            # Issue 17: this observation rests on this sender's messages alone (the pass is shown
            # no one else's: context_of), so it names them only.
            provenance=provenance_pb2.Provenance(
                turn_ids=[turn.turn_id],
                work_key=turn.work_key,
                subjects=[
                    erasure_pb2.ErasureSubject(
                        handle=sender.handle, external_id=sender.external_id, platform=sender.platform
                    )
                ],
                model=completion.model,
                prompt_version=_PROMPT.version,
                writer=self.name,
            ),
        )
        await ctx.ports.profiles.upsert_profile(request)
        return True

    async def _merged_already(self, turn: Turn, ctx: WorkerContext, senders: list[Sender]) -> set[str]:
        """Senders whose profile's last merged observation is this turn's (an earlier attempt
        wrote it): no model is asked about them again. Unreadable: none are skipped (the upsert's
        idempotency key still keeps a repeat from counting twice)."""
        if not senders:
            return set()
        try:
            resp = await ctx.ports.profiles.get_profiles(
                pr_pb.GetProfilesRequest(
                    company=turn.company,
                    observer=turn.seat,
                    subjects=[
                        pr_pb.Subject(handle=s.handle, external_id=s.external_id, platform=s.platform)
                        for s in senders[:50]
                    ],
                ),
            )
        except grpc.aio.AioRpcError:
            return set()
        done = set()
        for p in resp.profiles:
            if p.last_turn_id != turn.turn_id:
                continue
            for s in senders:
                if platform_key(s.platform) == p.subject.platform and (s.handle or s.external_id) in (
                    p.subject.handle,
                    p.subject.external_id,
                ):
                    done.add(s.key)
        return done


# ------------------------------------------------------------------------------ the offline rule

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{3,}")
_STOP = set(
    "about above after again also been before being below could does doing down during each from further have "
    "having here hers into itself just more most once only other ours over same should some such than that "
    "their theirs them then there these they this those through under until very what when where which while "
    "will with would your yours please thanks thank hello could can't cannot dont don't going want need like "
    "today tomorrow yesterday week still sure okay heads quick meanwhile anyway maybe really thing things "
    "something anything everything stuff also again soon later back look looks check checked know "
    "think said says tell told make made done doing good great nice fine".split()
)
_DECISION = re.compile(r"\b(let'?s|we'?ll|we will|decided|go with|going with|approved?|ship it)\b", re.I)
_CARE = re.compile(r"\b(don'?t|do not|never|avoid|careful|sensitive|please no|hate|annoy)\b", re.I)
_SENT = re.compile(r"[^.!?\n]+[.!?]?")


def offline_rule(data: Mapping[str, Any]) -> str:
    """A deterministic observation: style from how the messages are written, decisions and
    sensitivities from the sentences that state them, topics from the most frequent words."""
    messages = [m for m in data.get("messages", []) if m and m.strip()]
    if not messages:
        return json.dumps({"noop": True})
    words = [w for m in messages for w in _WORD.findall(m)]
    avg = sum(len(m.split()) for m in messages) / len(messages)
    traits = ["brief" if avg < 15 else "detailed" if avg > 40 else "moderately detailed"]
    if any(re.search(r"^\s*[-*•] ", m, re.M) for m in messages):
        traits.append("uses bullet lists")
    if any(re.search(r"\b(please|thanks|thank you)\b", m, re.I) for m in messages):
        traits.append("polite")
    if any("?" in m for m in messages):
        traits.append("asks direct questions")
    sentences = [s.strip() for m in messages for s in _SENT.findall(m) if s.strip()]
    decisions = [s for s in sentences if _DECISION.search(s)][:5]
    cares = [s for s in sentences if _CARE.search(s)][:5]
    counts = Counter(w.lower() for w in words if w.lower() not in _STOP)
    topics = [w for w, _ in counts.most_common(5)]
    return json.dumps(
        {
            "noop": False,
            "communication_style": f"Writes {', '.join(traits)} messages.",
            "past_decisions": decisions,
            "sensitivities": cares,
            "topics": topics,
        }
    )


def register(rules: OfflineRules) -> None:
    rules.register(PURPOSE, offline_rule)
