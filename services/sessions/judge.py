"""The memory judge of the session learning checks' personal facts.

Spec "Writes and isolation": personal facts use the existing memory judge. The judge is the
persist decider's (services/reflector/workers/persist_decider.py and its prompt): the tiers LONG /
SHORT (with a time to live) / DOC / NOOP, declarative facts rather than instructions, and never a
repeat of a note the seat already has (it is shown the seat's recent notes). Here it judges the
facts a review found — one call for all of a check's facts, so a check stays bounded — where the
persist decider judges a turn.

Its offline rule is not the persist decider's: that one reads English first-person sentences
("I prefer ...") out of what people said, and the learning checks use no such heuristic. Here the
fact was already found (and cited to the user's own message) by the review, so the rule keeps it
as a LONG note unless the seat already has it (normalized text).

How an answer's tier and time to live are read is shared with the PersistDecider
(libs/common/memory_tiers.py); the prompt and the offline rule stay apart (above).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from libs.common.auxmodel import Prompt
from libs.common.auxmodel.answers import InvalidOutput, parse_object
from libs.common.memory_tiers import read_tier, read_ttl_days

__all__ = ["PURPOSE", "Verdict", "build_prompt", "normalize", "offline_rule", "read_verdicts"]

PURPOSE = "session_memory_judge"
_PROMPTS = Path(__file__).resolve().parent / "prompts"
_SYSTEM = (_PROMPTS / "memory_judge.system.md").read_text()
_USER = Template((_PROMPTS / "memory_judge.user.md").read_text())


def normalize(text: str) -> str:
    """Case, punctuation and spacing do not make a fact new."""
    return " ".join(re.findall(r"\w+", text.casefold()))


@dataclass(frozen=True)
class Verdict:
    tier: str  # LONG | SHORT | DOC | NOOP
    content: str
    ttl_days: int
    reason: str


def build_prompt(facts: Sequence[str], recent_notes: Sequence[str]) -> Prompt:
    listed = "\n".join(f"[F{i}] {fact}" for i, fact in enumerate(facts, 1))
    notes = "\n".join(f"- {n}" for n in recent_notes) or "(none)"
    return Prompt(
        purpose=PURPOSE,
        system=_SYSTEM,
        user=_USER.substitute(facts=listed, notes=notes),
        data={
            "facts": [{"id": f"F{i}", "fact": f} for i, f in enumerate(facts, 1)],
            "recent_notes": list(recent_notes),
        },
        max_tokens=300 + 250 * len(facts),
        json_output=True,
    )


def read_verdicts(text: str, count: int) -> dict[int, Verdict]:
    """Verdicts by fact index (1-based). A fact the answer does not judge has no entry; a verdict
    that is not one of the four tiers, or a SHORT one without a usable time to live, is invalid."""
    answer = parse_object(text)
    verdicts = answer.get("verdicts")
    if not isinstance(verdicts, list):
        raise InvalidOutput("verdicts is not a list")
    out: dict[int, Verdict] = {}
    for v in verdicts:
        if not isinstance(v, dict):
            raise InvalidOutput("a verdict is not an object")
        ref = str(v.get("id", "")).strip().strip("[]")
        # ASCII digits only, and few: int() refuses "²" (a digit to isdigit) and strings past its
        # digit limit, and an answer must be "invalid", never an exception its caller does not expect.
        digits = ref[1:]
        if not ref.startswith("F") or not (digits.isascii() and digits.isdigit() and len(digits) <= 9):
            continue
        if not 1 <= int(digits) <= count:
            continue
        tier = read_tier(v)
        ttl = read_ttl_days(v, tier)
        content = v.get("content")
        out[int(digits)] = Verdict(
            tier, content.strip() if isinstance(content, str) else "", ttl, str(v.get("reason") or "")
        )
    return out


def offline_rule(data: Mapping[str, Any]) -> str:
    """Keep each fact as a LONG note, verbatim, unless the seat already has it (normalized)."""
    known = {normalize(n) for n in data.get("recent_notes", [])}
    verdicts = []
    for f in data.get("facts", []):
        if normalize(f["fact"]) in known:
            verdicts.append({"id": f["id"], "classification": "NOOP", "reason": "already noted"})
        else:
            verdicts.append(
                {"id": f["id"], "classification": "LONG", "content": f["fact"], "reason": "stated by the user"}
            )
    return json.dumps({"verdicts": verdicts})
