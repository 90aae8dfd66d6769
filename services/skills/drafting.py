"""The clustered pass's one model call: the prompt (files in ``prompts/``), the structured data the
offline rule answers from, the rule itself, and the parse that drops a draft with a gap.

The offline rule makes the system learn with no model at all: from the cluster's data alone it
writes a SKILL.md whose steps are the representative run's tools in order and whose "When to use"
quotes what the member turns were woken by and asked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from libs.common.auxmodel import (
    Attribution,
    AttributionMissing,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    NoAuxiliaryModel,
    Prompt,
    Stage,
)
from services.skills.domain import NAME_MAX_CHARS, Cluster, Turn

__all__ = ["PURPOSE", "ClusterDrafter", "Draft", "cluster_data", "offline_rule", "parse_draft"]

_log = logging.getLogger(__name__)

PURPOSE = "skill_synthesis_clustered"
PROMPTS = Path(__file__).parent / "prompts"
MEMBERS_SHOWN = 8
"""Turns rendered into the prompt; the rest are counted, not shown."""
FIELD_EXCERPT_CHARS = 600
"""An ask or account past this is cut in the prompt and marked (learning.EpisodeAccountBytes)."""
MAX_TOKENS = 2000


@dataclass(frozen=True)
class Draft:
    name: str
    summary: str
    body: str


def _excerpt(text: str, limit: int = FIELD_EXCERPT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rstrip() + " … [cut]"


def _member(t: Turn) -> dict[str, Any]:
    return {
        "turn_id": t.turn_id,
        "woken_by": t.label,
        "asked": _excerpt(t.ask),
        "what_it_did": _excerpt(t.what_it_did),
        "outcome": t.outcome,
        "tool_sequence": list(t.tool_sequence),
    }


def cluster_data(cluster: Cluster, representative: Turn, max_body_chars: int) -> dict[str, Any]:
    """The question as structured inputs (what the offline rule reads)."""
    members = [representative, *[m for m in cluster.members if m is not representative]]
    return {
        "cluster_size": cluster.size,
        "done_count": sum(1 for m in cluster.members if m.outcome == "done"),
        "failed_count": sum(1 for m in cluster.members if m.outcome == "failed"),
        "representative": list(representative.tool_sequence),
        "members": [_member(m) for m in members[:MEMBERS_SHOWN]],
        "labels": [m.label for m in cluster.members if m.label],
        "max_body_chars": max_body_chars,
    }


def _render_member(i: int, m: Mapping[str, Any]) -> str:
    lines = [f"Turn {i} ({m['outcome'] or 'settled'}):", f"  woken by: {m['woken_by'] or '(no label)'}"]
    if m["asked"]:
        lines.append(f"  asked: {m['asked']}")
    if m["what_it_did"]:
        lines.append(f"  what it did: {m['what_it_did']}")
    lines.append(f"  tools: {' → '.join(m['tool_sequence'])}")
    return "\n".join(lines)


def build_prompt(data: Mapping[str, Any]) -> Prompt:
    system = (PROMPTS / f"{PURPOSE}.system.md").read_text()
    user = Template((PROMPTS / f"{PURPOSE}.user.md").read_text()).substitute(
        cluster_size=data["cluster_size"],
        done_count=data["done_count"],
        failed_count=data["failed_count"],
        representative=" → ".join(data["representative"]),
        shown=MEMBERS_SHOWN,
        members="\n\n".join(_render_member(i + 1, m) for i, m in enumerate(data["members"])),
        max_body_chars=data["max_body_chars"],
    )
    return Prompt(purpose=PURPOSE, system=system, user=user, data=data, max_tokens=MAX_TOKENS, json_output=True)


# ------------------------------------------------------------------------------- offline rule


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "tool"


def offline_rule(data: Mapping[str, Any]) -> str:
    """A deterministic SKILL.md from the cluster alone: the run's tools in order, the kinds of work
    it was done for, and how often it ended done."""
    tools: list[str] = list(data["representative"])
    distinct = sorted(set(tools))
    digest = hashlib.sha1("\x1f".join(distinct).encode()).hexdigest()[:6]
    first, last = _slug(tools[0]), _slug(tools[-1])
    stem = first if first == last else f"{first}-to-{last}"
    name = f"{stem[: NAME_MAX_CHARS - 20]}-routine-{digest}"
    labels = [label for label, _ in Counter(data.get("labels") or []).most_common(3)]
    asks = []
    for m in data["members"]:
        ask = _excerpt(m.get("asked") or "", 160)
        if ask and ask not in asks:
            asks.append(ask)
    size, done = int(data["cluster_size"]), int(data["done_count"])
    kind = labels[0] if labels else "recurring work"
    summary = f"Run {' → '.join(tools[:4])}{' → …' if len(tools) > 4 else ''} for {kind} (done {done} of {size} times)"
    when = [f"- Work woken by: {label}" for label in labels] + [f"- Asked like: {a}" for a in asks[:3]]
    steps = [f"{i}. Call `{tool}`." for i, tool in enumerate(tools, 1)]
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
        "## When to use",
        "",
        *(when or ["- Work like the turns this was drafted from."]),
        "",
        "## Steps",
        "",
        *steps,
    ]
    if failed:
        body_lines += [
            "",
            "## Watch out",
            "",
            *[f"- A run like this failed once: {_excerpt(m.get('what_it_did') or '', 200)}" for m in failed[:2]],
        ]
    return json.dumps({"name": name, "summary": summary[:200], "body": "\n".join(body_lines) + "\n"})


# ------------------------------------------------------------------------------------ parsing

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_draft(text: str) -> Draft | None:
    """The draft, or None when the answer is not an object with a name, a summary and a body.
    A draft with a gap is dropped rather than written with it."""
    try:
        obj = json.loads(_FENCE.sub("", text.strip()))
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    values = [obj.get(k) for k in ("name", "summary", "body")]
    if not all(isinstance(v, str) and v.strip() for v in values):
        return None
    name, summary, body = values
    return Draft(name=name.strip(), summary=" ".join(summary.split()), body=body)


class ClusterDrafter:
    """Asks the auxiliary model for one draft, charged to the seat as background work."""

    def __init__(self, aux: AuxiliaryModel):
        self._aux = aux

    async def draft(self, company: str, seat: str, data: Mapping[str, Any]) -> tuple[Draft | None, str]:
        """(draft, outcome): outcome is "drafted", "dropped" (a gap or not JSON) or the failure."""
        try:
            completion = await self._aux.complete(
                Attribution(company, seat, Stage.BACKGROUND, PURPOSE), build_prompt(data)
            )
        except NoAuxiliaryModel:
            return None, "no_auxiliary_model"
        except AuxiliaryUnavailable as err:
            return None, f"unavailable:{err.kind}"
        except AttributionMissing:  # a bug here, not the model's: say so loudly
            _log.exception("clustered synthesis call without attribution")
            return None, "attribution_missing"
        draft = parse_draft(completion.text)
        return (draft, "drafted") if draft else (None, "dropped")
