"""The clustered pass's one model call: the prompt (files in ``prompts/``), the structured data the
offline rule answers from, the rule itself, and the parse that drops a draft with a gap.

The offline rule makes the system learn with no model at all: from the cluster's data alone it
writes a SKILL.md whose steps are the representative run's tools in order and whose "When to use"
quotes what the member turns were woken by and asked.

Each member reaches the prompt with its ask and its account whole, never cut: a pattern inferred
from a text's first few hundred bytes is the text's opening and none of what the turn was for. A
member's two texts are bounded together by ``learning.episodes.summary_input_bytes``; past it the
longer one (or both, when neither fits alone) is named by its size instead — ``[ask of N bytes not
shown]`` — so the model knows there was one and how big it was, rather than reading a fragment as
the whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.common.auxmodel import Attribution, AuxiliaryModel, Prompt, Stage
from libs.common.auxmodel.background_call import background_completion, json_object
from libs.common.offline_draft import ClusterUsage
from libs.common.prompt_files import PromptFiles, cluster_fields, render_run
from services.skills.domain import NAME_MAX_CHARS, Cluster, Turn

__all__ = ["PURPOSE", "ClusterDrafter", "Draft", "cluster_data", "offline_rule", "parse_draft"]

PURPOSE = "skill_synthesis_clustered"
PROMPTS = Path(__file__).parent / "prompts"
MEMBERS_SHOWN = 8
"""Turns rendered into the prompt; the rest are counted, not shown."""
MEMBER_TEXT_BYTES = 11_000
"""The default bound on one member's ask and account together (learning.episodes.
summary_input_bytes); past it a text is named by its size rather than shown."""
QUOTE_CHARS = 160
"""The offline rule's "Asked like" quotes: an ask longer than this is not quoted."""
WATCH_QUOTE_CHARS = 600
"""The offline rule's "Watch out" quotes: a failed run's account up to this is quoted whole;
a longer one is pointed at by its turn and size (learning.EpisodeAccountBytes)."""
MAX_TOKENS = 2000
_PROMPT = PromptFiles(PROMPTS, PURPOSE, MAX_TOKENS)


@dataclass(frozen=True)
class Draft:
    name: str
    summary: str
    body: str
    model: str = ""
    """The model that drafted it (its provenance, issue 17)."""
    prompt_version: str = ""
    """The digest of the prompt's text it was drafted from."""


def _line(text: str) -> str:
    """The text on one line: its whitespace runs folded into single spaces, nothing dropped."""
    return " ".join(text.split())


def _shown(ask: str, account: str, bound: int) -> tuple[bool, bool]:
    """Which of a member's two texts the prompt shows whole: both when together they fit
    ``bound`` bytes; else the shorter alone when it fits; else neither. A text not shown is named
    by its size, never cut."""
    a, d = len(ask.encode()), len(account.encode())
    if a + d <= bound:
        return True, True
    if a <= d:
        return a <= bound, False
    return False, d <= bound


def _member(t: Turn, bound: int) -> dict[str, Any]:
    ask_shown, account_shown = _shown(t.ask, t.what_it_did, bound)
    return {
        "turn_id": t.turn_id,
        "woken_by": t.label,
        "asked": _line(t.ask) if ask_shown else "",
        "asked_not_shown_bytes": 0 if ask_shown else len(t.ask.encode()),
        "what_it_did": _line(t.what_it_did) if account_shown else "",
        "what_it_did_not_shown_bytes": 0 if account_shown else len(t.what_it_did.encode()),
        "outcome": t.outcome,
        "tool_sequence": list(t.run),
    }


def cluster_data(
    cluster: Cluster, representative: Turn, max_body_chars: int, member_text_bytes: int = MEMBER_TEXT_BYTES
) -> dict[str, Any]:
    """The question as structured inputs (what the offline rule reads). ``member_text_bytes``
    bounds one member's ask and account together (see the module docstring)."""
    members = [representative, *[m for m in cluster.members if m is not representative]]
    return {
        "cluster_size": cluster.size,
        "done_count": sum(1 for m in cluster.members if m.outcome == "done"),
        "failed_count": sum(1 for m in cluster.members if m.outcome == "failed"),
        "representative": list(representative.run),
        "members": [_member(m, member_text_bytes) for m in members[:MEMBERS_SHOWN]],
        "labels": [m.label for m in cluster.members if m.label],
        "max_body_chars": max_body_chars,
    }


_MEMBER_TEXTS = (("asked", "asked", "ask"), ("what it did", "what_it_did", "account"))


def _render_member(i: int, m: Mapping[str, Any]) -> str:
    heading = [f"Turn {i} ({m['outcome'] or 'settled'}):", f"  woken by: {m['woken_by'] or '(no label)'}"]
    return render_run(heading, m, _MEMBER_TEXTS)


def prompt_version() -> str:
    """The prompt's version: a digest of its files' text, so a draft says which prompt wrote it."""
    digest = hashlib.sha256()
    for part in ("system", "user"):
        digest.update((PROMPTS / f"{PURPOSE}.{part}.md").read_bytes())
    return digest.hexdigest()[:16]


def build_prompt(data: Mapping[str, Any]) -> Prompt:
    return _PROMPT.build(
        data,
        **cluster_fields(data, MEMBERS_SHOWN, _render_member),
        cluster_size=data["cluster_size"],
        max_body_chars=data["max_body_chars"],
    )


# ------------------------------------------------------------------------------- offline rule


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "tool"


def _failed_once(m: Mapping[str, Any]) -> str:
    """A failed member for the "Watch out" section: its account whole, or where to read it."""
    account = m.get("what_it_did") or ""
    if account and len(account) <= WATCH_QUOTE_CHARS:
        return f"- A run like this failed once: {account}"
    size = len(account.encode()) or int(m.get("what_it_did_not_shown_bytes") or 0)
    if size:
        return f"- A run like this failed once (turn {m['turn_id']}; its account of {size} bytes is on the episode)."
    return f"- A run like this failed once (turn {m['turn_id']})."


def offline_rule(data: Mapping[str, Any]) -> str:
    """A deterministic SKILL.md from the cluster alone: the run's tools in order, the kinds of work
    it was done for, and how often it ended done."""
    tools: list[str] = list(data["representative"])
    distinct = sorted(set(tools))
    digest = hashlib.sha1("\x1f".join(distinct).encode()).hexdigest()[:6]
    first, last = _slug(tools[0]), _slug(tools[-1])
    stem = first if first == last else f"{first}-to-{last}"
    name = f"{stem[: NAME_MAX_CHARS - 20]}-routine-{digest}"
    usage = ClusterUsage.of(data, QUOTE_CHARS)
    size, done = int(data["cluster_size"]), int(data["done_count"])
    summary = (
        f"Run {' → '.join(tools[:4])}{' → …' if len(tools) > 4 else ''} for {usage.kind} (done {done} of {size} times)"
    )
    failed = [m for m in data["members"] if m.get("outcome") == "failed"]
    body_lines = [
        "---",
        f"name: {name}",
        f"description: {summary}",
        "---",
        "",
        f"# {stem.replace('-', ' ').capitalize()} routine",
        "",
        f"A procedure this agent ran the same way in {size} settled turns ({done} done).",
        "",
        *usage.sections(tools, "turns"),
    ]
    if failed:
        body_lines += [
            "",
            "## Watch out",
            "",
            *[_failed_once(m) for m in failed[:2]],
        ]
    return json.dumps({"name": name, "summary": summary[:200], "body": "\n".join(body_lines) + "\n"})


# ------------------------------------------------------------------------------------ parsing


def parse_draft(text: str) -> Draft | None:
    """The draft, or None when the answer is not an object with a name, a summary and a body.
    A draft with a gap is dropped rather than written with it."""
    obj = json_object(text)
    if obj is None:
        return None
    name, summary, body = (obj.get(k) for k in ("name", "summary", "body"))
    if not (isinstance(name, str) and isinstance(summary, str) and isinstance(body, str)):
        return None
    if not (name.strip() and summary.strip() and body.strip()):
        return None
    return Draft(name=name.strip(), summary=" ".join(summary.split()), body=body)


class ClusterDrafter:
    """Asks the auxiliary model for one draft, charged to the seat as background work, through
    the seat's role's own llm_auxiliary chain."""

    def __init__(self, aux: AuxiliaryModel, member_text_bytes: int = MEMBER_TEXT_BYTES):
        self._aux = aux
        self.member_text_bytes = member_text_bytes

    def data(self, cluster: Cluster, representative: Turn, max_body_chars: int) -> dict[str, Any]:
        return cluster_data(cluster, representative, max_body_chars, self.member_text_bytes)

    async def draft(
        self, company: str, seat: str, data: Mapping[str, Any], role: str | None = None
    ) -> tuple[Draft | None, str]:
        """(draft, outcome): outcome is "drafted", "dropped" (a gap or not JSON),
        "no_auxiliary_model" (the role's chain names no provider: nothing asked, nothing charged)
        or the failure."""
        completion, failure = await background_completion(
            self._aux, Attribution(company, seat, Stage.BACKGROUND, PURPOSE, role=role or None), build_prompt(data)
        )
        if completion is None:
            return None, failure
        draft = parse_draft(completion.text)
        if draft is None:
            return None, "dropped"
        return dataclasses.replace(draft, model=completion.model, prompt_version=prompt_version()), "drafted"
