"""The evidence one learning check reads: bounded, labelled, redacted, capped.

Spec "Evidence and cost": records at or before the trigger only — at most 8 chat messages, 8
verification records and 100 execution events (the newest of each), plus the milestone's plan
evidence. Every excerpt is redacted first (``redaction.redact``), then capped at 2,400 characters,
within a 40,000-character budget for the whole check: the plan evidence is placed first (the
newly done steps before the others, the plan taking at most half the budget), then the records
newest first until the budget is spent; older records are omitted. The review sees them oldest
first.

Each item carries a label. Tool results, verification records and user messages can support a
candidate; assistant messages, tool requests and plan steps are claims (``domain.CLAIM_LABELS``)
and cannot alone support a project lesson or a skill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime

from libs.common.config import EvidenceConfig
from services.sessions.domain import Event, EventKind, PlanStep
from services.sessions.redaction import redact

__all__ = ["Evidence", "EvidenceItem", "assemble", "cap"]

_LABEL = {
    EventKind.USER_MESSAGE: "user_message",
    EventKind.ASSISTANT_MESSAGE: "assistant_claim",
    EventKind.TOOL_REQUEST: "tool_request",
    EventKind.TOOL_RESULT: "tool_result",
    EventKind.VERIFICATION: "verification",
}
_MIN_CUT = 200
"""A record that fits the remaining budget only cut below this many characters is omitted instead:
a sliver says nothing a reviewer could cite."""


@dataclass(frozen=True)
class EvidenceItem:
    ref: str
    """The id the review cites: ``E<seq>`` for an event, ``P<n>`` for a plan step."""
    source_id: str
    """The session's own id: the event id, or ``plan:<revision>:<step id>``."""
    label: str
    text: str
    """Redacted, then capped."""
    time: datetime | None = None
    tool: str = ""
    source: str = ""
    status: str = ""
    remember: bool = False
    seq: int = 0

    def to_data(self) -> dict[str, object]:
        """The item as the offline rules read it."""
        return {
            "id": self.ref,
            "label": self.label,
            "text": self.text,
            "tool": self.tool,
            "source": self.source,
            "status": self.status,
            "remember": self.remember,
        }


@dataclass
class Evidence:
    items: list[EvidenceItem] = field(default_factory=list)
    chat_messages: int = 0
    verification_records: int = 0
    execution_events: int = 0
    plan_steps: int = 0
    omitted_records: int = 0
    truncated_excerpts: int = 0
    redactions: int = 0
    total_chars: int = 0

    def by_ref(self) -> dict[str, EvidenceItem]:
        return {i.ref: i for i in self.items}

    def summary(self) -> dict[str, int]:
        """Every count (each field but the items): the receipt's evidence summary."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "items"}


def cap(text: str, limit: int) -> tuple[str, bool]:
    """``text`` within ``limit`` characters: its head and its tail around a marker naming how many
    characters were left out (a log's summary is usually at its end, its command at its start)."""
    if len(text) <= limit:
        return text, False
    room = limit
    for _ in range(3):  # the marker's length depends on the count it names: settle it
        note = f" … [{len(text) - room} characters omitted] … "
        room = max(0, limit - len(note))
    note = f" … [{len(text) - room} characters omitted] … "
    if len(note) >= limit:
        return text[:limit], True
    head = room * 2 // 3
    tail = room - head
    return text[:head] + note + (text[len(text) - tail :] if tail else ""), True


def assemble(
    chat: Sequence[Event],
    verification: Sequence[Event],
    execution: Sequence[Event],
    totals: dict[str, int],
    plan_revision: int,
    plan: Sequence[PlanStep],
    newly_done: Sequence[str],
    config: EvidenceConfig,
) -> Evidence:
    """The check's evidence from the newest records of each kind (already bounded by the store)
    and the milestone's plan revision. ``totals`` counts every record at or before the trigger,
    per kind (``chat``, ``verification``, ``execution``), so what the bounds left out is reported."""
    out = Evidence()
    newly = set(newly_done)
    budget = config.total_chars

    def prepare(text: str) -> tuple[str, bool, int]:
        red = redact(text)
        capped, cut = cap(red.text, config.excerpt_chars)
        return capped, cut, red.count

    plan_items: list[EvidenceItem] = []
    for n, step in enumerate(plan, 1):
        mark = " (newly done in this revision)" if step.id in newly else ""
        text, cut, redactions = prepare(f"[{step.status}]{mark} {step.title}")
        plan_items.append(
            EvidenceItem(
                ref=f"P{n}",
                source_id=f"plan:{plan_revision}:{step.id}",
                label="plan_claim",
                text=text,
                status=str(step.status),
            )
        )
        out.truncated_excerpts += cut
        out.redactions += redactions

    events = sorted([*chat, *verification, *execution], key=lambda e: e.seq, reverse=True)
    kept: list[EvidenceItem] = []
    # The plan goes first, but it may take at most half the budget, and the steps this milestone
    # newly marked done go before the rest: a plan of hundreds of steps must neither crowd out the
    # newest records (only older records may be omitted) nor the step the check is about. What the
    # plan leaves of its half is the records'.
    plan_room = budget // 2
    first = [i for i, step in enumerate(plan) if step.id in newly]
    rest = [i for i, step in enumerate(plan) if step.id not in newly]
    placed: set[int] = set()
    for index in first + rest:
        item = plan_items[index]
        if len(item.text) > plan_room:
            out.omitted_records += 1
            continue
        plan_room -= len(item.text)
        budget -= len(item.text)
        placed.add(index)
        out.plan_steps += 1
    kept.extend(item for index, item in enumerate(plan_items) if index in placed)  # in step order
    full = False
    for event in events:  # newest first: what the budget leaves out is the oldest
        if full:
            # Once a record is left out, every older one is too: a short old record must not
            # stand in the evidence where a newer one that did not fit was dropped.
            out.omitted_records += 1
            continue
        text, cut, redactions = prepare(event.text)
        if len(text) > budget:
            if budget < _MIN_CUT:
                out.omitted_records += 1
                full = True
                continue
            text, _ = cap(text, budget)
            cut = True
        budget -= len(text)
        out.truncated_excerpts += cut
        out.redactions += redactions
        kept.append(
            EvidenceItem(
                ref=f"E{event.seq}",
                source_id=event.event_id,
                label=_LABEL[event.kind],
                text=text,
                time=event.event_time,
                tool=event.tool_name,
                source=event.source,
                status="" if str(event.status) == "unspecified" else str(event.status),
                remember=event.remember,
                seq=event.seq,
            )
        )
        if event.kind in (EventKind.USER_MESSAGE, EventKind.ASSISTANT_MESSAGE):
            out.chat_messages += 1
        elif event.kind is EventKind.VERIFICATION:
            out.verification_records += 1
        else:
            out.execution_events += 1
    out.omitted_records += (
        max(0, totals.get("chat", 0) - len(chat))
        + max(0, totals.get("verification", 0) - len(verification))
        + max(0, totals.get("execution", 0) - len(execution))
    )
    plan_kept = [i for i in kept if i.label == "plan_claim"]
    events_kept = sorted((i for i in kept if i.label != "plan_claim"), key=lambda i: i.seq)
    out.items = plan_kept + events_kept
    out.total_chars = sum(len(i.text) for i in out.items)
    return out
