"""The one review call of a learning check: its prompt, the reading of its answer, the citation
rules every candidate must pass, and the offline provider's deterministic rule.

Spec "Evidence and cost": one bounded review call produces project lessons, personal facts and at
most one skill candidate; empty output is valid; every candidate must cite supplied evidence;
personal memories may cite only user messages; tool requests and plan / assistant success claims
cannot alone support a project lesson or skill; no English first-person heuristic.

The offline rule reads only the evidence's structure (labels, statuses, tool names and the user's
explicit ``remember`` action), never its wording, so it behaves the same in every language:

- a project lesson for each succeeded verification record, citing it and the tool results that
  led to it;
- a personal fact for each user message the user asked the agent to remember, citing it alone;
- a skill candidate when succeeded tool results of at least three distinct tools end in a succeeded
  verification: the run, step by step, citing its tool results and the verification.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

from libs.common.auxmodel import Prompt
from libs.common.auxmodel.answers import InvalidOutput, parse_object
from services.sessions.domain import CLAIM_LABELS, Dropped, OutputKind
from services.sessions.evidence import Evidence

__all__ = [
    "PURPOSE",
    "FactCandidate",
    "LessonCandidate",
    "Review",
    "SkillCandidate",
    "Truncated",
    "build_prompt",
    "offline_rule",
    "read_review",
]

PURPOSE = "session_review"
_PROMPTS = Path(__file__).resolve().parent / "prompts"
_SYSTEM = Template((_PROMPTS / "session_review.system.md").read_text())
_USER = Template((_PROMPTS / "session_review.user.md").read_text())
SKILL_NAME_MAX = 100
SKILL_SUMMARY_MAX = 1000


class Truncated(InvalidOutput):
    """The answer was cut off at its token budget."""


@dataclass(frozen=True)
class LessonCandidate:
    text: str
    refs: tuple[str, ...]


@dataclass(frozen=True)
class FactCandidate:
    text: str
    refs: tuple[str, ...]


@dataclass(frozen=True)
class SkillCandidate:
    name: str
    summary: str
    body: str
    refs: tuple[str, ...]
    tool_sequence: tuple[str, ...] = ()


@dataclass
class Review:
    """What survives the citation rules, and what was dropped with its reason."""

    lessons: list[LessonCandidate] = field(default_factory=list)
    facts: list[FactCandidate] = field(default_factory=list)
    skill: SkillCandidate | None = None
    dropped: list[Dropped] = field(default_factory=list)
    proposed: int = 0
    """Candidates the answer held, dropped ones included."""


@dataclass(frozen=True)
class Limits:
    max_lessons: int
    max_facts: int
    lesson_chars: int
    fact_chars: int


def describe_trigger(trigger: str, plan_revision: int, newly_done: Sequence[str], turn_id: str) -> str:
    if trigger == "plan_steps_done":
        return f"plan steps newly done in revision {plan_revision}: {', '.join(newly_done) or '(none)'}"
    if trigger == "plan_completed":
        return f"the plan became complete in revision {plan_revision}"
    if trigger == "substantial_turn":
        return f"a successful substantial turn ({turn_id})"
    return "a person asked to check recent work"


def _render(evidence: Evidence) -> str:
    lines = []
    for item in evidence.items:
        meta = [item.label]
        if item.tool:
            meta.append(f"tool={item.tool}")
        if item.source:
            meta.append(f"source={item.source}")
        if item.status:
            meta.append(f"status={item.status}")
        if item.remember:
            meta.append("user asked to remember this")
        when = f" {item.time.isoformat()}" if item.time else ""
        lines.append(f"[{item.ref}] ({', '.join(meta)}){when}\n{item.text}")
    return "\n\n".join(lines) or "(none)"


def build_prompt(
    *,
    check_id: str,
    session_id: str,
    workspace: str,
    trigger: str,
    evidence: Evidence,
    limits: Limits,
    max_tokens: int,
) -> Prompt:
    return Prompt(
        purpose=PURPOSE,
        system=_SYSTEM.substitute(
            max_lessons=limits.max_lessons,
            max_facts=limits.max_facts,
            lesson_chars=limits.lesson_chars,
            fact_chars=limits.fact_chars,
        ),
        user=_USER.substitute(
            check_id=check_id,
            session_id=session_id,
            workspace=workspace,
            trigger=trigger,
            evidence=_render(evidence),
        ),
        data={
            "check_id": check_id,
            "workspace": workspace,
            "evidence": [i.to_data() for i in evidence.items],
            "max_lessons": limits.max_lessons,
            "max_facts": limits.max_facts,
        },
        max_tokens=max_tokens,
        json_output=True,
    )


# ------------------------------------------------------------------------------ reading the answer


def _refs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidOutput(f"{where}.evidence is not a list of ids")
    out: list[str] = []
    for v in value:
        v = v.strip().strip("[]")
        if v and v not in out:
            out.append(v)
    return tuple(out)


def _items(answer: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = answer.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidOutput(f"{key} is not a list of objects")
    return value


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidOutput(f"{where}.{key} is not text")
    return value.strip()


def read_review(text: str, completion_tokens: int, max_tokens: int, evidence: Evidence, limits: Limits) -> Review:
    """The answer read and every candidate held to the citation rules.

    Raises :class:`Truncated` for an answer cut at its budget that does not parse, and
    ``InvalidOutput`` for one that is not the object asked for. A well-formed answer with nothing
    in it is a valid, empty review."""
    try:
        answer = parse_object(text)
    except InvalidOutput as err:
        if completion_tokens >= max_tokens:
            raise Truncated(f"the answer stopped at its {max_tokens}-token budget: {err}") from err
        raise
    known = {"project_lessons", "personal_facts", "skill_candidate"}
    if not known & set(answer) and answer:
        # Its keys counted, not quoted: a model's keys are its text too (it may key a fact by a name).
        raise InvalidOutput(f"the answer has none of {sorted(known)} ({len(answer)} other keys)")
    by_ref = evidence.by_ref()
    review = Review()

    def cited(refs: tuple[str, ...], kind: OutputKind) -> tuple[str, ...] | None:
        """The candidate's evidence (as the session's ids), or None after recording why it is dropped."""
        source_ids = tuple(by_ref[r].source_id for r in refs if r in by_ref)
        if not refs:
            review.dropped.append(Dropped(kind, "cites no evidence"))
            return None
        unknown = [r for r in refs if r not in by_ref]
        if unknown:
            review.dropped.append(
                Dropped(kind, f"cites evidence it was not given: {', '.join(unknown[:5])}", source_ids)
            )
            return None
        labels = {by_ref[r].label for r in refs}
        if kind is OutputKind.PERSONAL_FACT:
            if labels != {"user_message"}:
                review.dropped.append(Dropped(kind, "a personal fact may cite only user messages", source_ids))
                return None
        elif labels <= CLAIM_LABELS:
            review.dropped.append(
                Dropped(
                    kind,
                    "cites only claims (assistant messages, tool requests, plan steps), which cannot alone support it",
                    source_ids,
                )
            )
            return None
        return source_ids

    def take(
        key: str,
        field: str,
        kind: OutputKind,
        noun: str,
        plural: str,
        max_chars: int,
        limit_phrase: str,
        max_count: int,
        kept: list[Any],
        make: Callable[[str, tuple[str, ...]], Any],
    ) -> None:
        """The lessons or the facts of the answer: each cited by evidence, with text, within its
        length and the per-check count, else dropped with why (never trimmed)."""
        for i, item in enumerate(_items(answer, key)):
            review.proposed += 1
            where = f"{key}[{i}]"
            refs = _refs(item.get("evidence"), where)
            body = _text(item, field, where)
            ids = cited(refs, kind)
            if ids is None:
                continue
            if not body:
                review.dropped.append(Dropped(kind, f"the {noun} has no text", ids))
            elif len(body) > max_chars:
                why = f"the {noun} is {len(body)} characters; {limit_phrase} {max_chars} (never trimmed)"
                review.dropped.append(Dropped(kind, why, ids))
            elif len(kept) >= max_count:
                review.dropped.append(Dropped(kind, f"more than {max_count} {plural} in one check", ids))
            else:
                kept.append(make(body, refs))

    take(
        "project_lessons", "lesson", OutputKind.PROJECT_LESSON, "lesson", "lessons",
        limits.lesson_chars, "at most", limits.max_lessons, review.lessons, LessonCandidate,
    )  # fmt: skip
    take(
        "personal_facts", "fact", OutputKind.PERSONAL_FACT, "fact", "personal facts",
        limits.fact_chars, "a note holds at most", limits.max_facts, review.facts, FactCandidate,
    )  # fmt: skip

    skills = answer.get("skill_candidate")
    if isinstance(skills, dict):
        skills = [skills]
    elif skills is None:
        skills = []
    if not isinstance(skills, list) or not all(isinstance(s, dict) for s in skills):
        raise InvalidOutput("skill_candidate is neither null nor an object")
    for i, item in enumerate(skills):
        review.proposed += 1
        where = f"skill_candidate[{i}]"
        refs = _refs(item.get("evidence"), where)
        ids = cited(refs, OutputKind.SKILL_PROPOSAL)
        if ids is None:
            continue
        if i > 0:
            review.dropped.append(Dropped(OutputKind.SKILL_PROPOSAL, "at most one skill candidate per check", ids))
            continue
        name, summary, body = (_text(item, k, where) for k in ("name", "summary", "body"))
        # A skill rests on what its tools returned: tool requests are claims of intent and cannot
        # alone support one (spec "Evidence and cost"; the prompt asks for "the tool_result items
        # of the run"), so only the cited tool results make its tool sequence.
        tools = tuple(
            by_ref[r].tool
            for r in sorted(refs, key=lambda r: by_ref[r].seq)
            if by_ref[r].label == "tool_result" and by_ref[r].tool
        )
        if not (name and summary and body):
            review.dropped.append(Dropped(OutputKind.SKILL_PROPOSAL, "a skill needs a name, a summary and a body", ids))
        elif len(name) > SKILL_NAME_MAX or "\n" in name or len(summary) > SKILL_SUMMARY_MAX:
            review.dropped.append(
                Dropped(
                    OutputKind.SKILL_PROPOSAL,
                    f"the name must be one line of at most {SKILL_NAME_MAX} characters and the summary at most "
                    f"{SKILL_SUMMARY_MAX}",
                    ids,
                )
            )
        elif not tools:
            review.dropped.append(
                Dropped(
                    OutputKind.SKILL_PROPOSAL,
                    "a skill needs the tool run it was distilled from (it cites no tool result)",
                    ids,
                )
            )
        else:
            review.skill = SkillCandidate(name, summary, body, refs, tools)
    return review


# ------------------------------------------------------------------------------ the offline rule


def _first_line(text: str, limit: int) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "tool"


def offline_rule(data: Mapping[str, Any]) -> str:
    """The review with no model: structure only (see the module docstring). Always follows the
    citation rules it is held to."""
    items = list(data.get("evidence", []))
    lessons: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    since: list[Mapping[str, Any]] = []  # succeeded tool results since the last verification
    run: list[Mapping[str, Any]] = []  # every succeeded tool result, in order
    skill: dict[str, Any] | None = None
    for item in items:
        label = item.get("label")
        if label == "tool_result" and item.get("status") == "succeeded":
            since.append(item)
            run.append(item)
        elif label == "verification":
            if item.get("status") == "succeeded":
                what = item.get("tool") or "verification"
                line = _first_line(item.get("text", ""), 300)
                tools = list(dict.fromkeys(t.get("tool") or "tool" for t in since))
                after = f" — after {', '.join(tools)}" if tools else ""
                lessons.append(
                    {
                        "lesson": f"Verified with {what}: {line}{after}.",
                        "evidence": [item["id"], *(t["id"] for t in since)],
                    }
                )
                distinct = list(dict.fromkeys(t.get("tool") or "tool" for t in run))
                if skill is None and len(distinct) >= 3:
                    steps = [
                        f"{n}. Run `{t.get('tool') or 'tool'}` — as recorded: {_first_line(t.get('text', ''), 160)}"
                        for n, t in enumerate(run, 1)
                    ]
                    steps.append(f"{len(run) + 1}. Verify with `{what}` — as recorded: {line}")
                    name = f"{_slug(distinct[0])}-to-{_slug(what)}"[:SKILL_NAME_MAX]
                    skill = {
                        "name": name,
                        "summary": f"The verified run: {' → '.join(distinct)}, then {what}.",
                        "body": f"# {name}\n\nA procedure that worked end to end in a session:\n\n" + "\n".join(steps),
                        "evidence": [*(t["id"] for t in run), item["id"]],
                    }
            since = []
        elif label == "user_message" and item.get("remember"):
            text = (item.get("text") or "").strip()
            if text:
                facts.append({"fact": text, "evidence": [item["id"]]})
    return json.dumps(
        {
            "project_lessons": lessons[: int(data.get("max_lessons", 5))],
            "personal_facts": facts[: int(data.get("max_facts", 5))],
            "skill_candidate": skill,
        }
    )
