"""A prompt kept as two files beside its worker, and the run evidence such prompts render.

Skill synthesis (skills/drafting.py) and cross-agent promotion (knowledge/promotion.py) each ask a
model to write a procedure from a cluster of runs. Both keep the prompt as ``<purpose>.system.md``
and a ``string.Template`` ``<purpose>.user.md``, and both render each shown run the same way: a
heading, its texts (shown, or named by their size when they were too long to show), its tools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from libs.common.auxmodel import Prompt

__all__ = ["PromptFiles", "cluster_fields", "render_run"]


@dataclass(frozen=True)
class PromptFiles:
    directory: Path
    purpose: str
    """Also the files' stem and the offline rule's key."""
    max_tokens: int

    def build(self, data: Mapping[str, Any], **fields: object) -> Prompt:
        """The JSON-answer prompt: the system file as is, the user file with ``fields`` substituted
        (a missing one raises: a template and its caller disagreeing is a bug, not a blank)."""
        system = (self.directory / f"{self.purpose}.system.md").read_text()
        user = Template((self.directory / f"{self.purpose}.user.md").read_text()).substitute(fields)
        return Prompt(
            purpose=self.purpose, system=system, user=user, data=data, max_tokens=self.max_tokens, json_output=True
        )


def render_run(heading: Sequence[str], member: Mapping[str, Any], texts: Sequence[tuple[str, str, str]]) -> str:
    """One shown run: ``heading``'s lines, then for each ``(label, key, noun)`` of ``texts`` the
    member's ``key`` text, or, when it was too long to show, a line naming the ``noun`` by its size
    (``<key>_not_shown_bytes``), then the run's tools in order."""
    lines = list(heading)
    for label, key, noun in texts:
        if member[key]:
            lines.append(f"  {label}: {member[key]}")
        elif member.get(f"{key}_not_shown_bytes"):
            lines.append(f"  {label}: [{noun} of {member[f'{key}_not_shown_bytes']} bytes not shown]")
    lines.append(f"  tools: {' → '.join(member['tool_sequence'])}")
    return "\n".join(lines)


def cluster_fields(
    data: Mapping[str, Any], shown: int, render_member: Callable[[int, Mapping[str, Any]], str]
) -> dict[str, object]:
    """The template fields every cluster prompt fills the same way from its structured inputs: the
    outcome counts, the representative's steps, how many runs are shown and the runs themselves
    (numbered from 1)."""
    return {
        "done_count": data["done_count"],
        "failed_count": data["failed_count"],
        "representative": " → ".join(data["representative"]),
        "shown": shown,
        "members": "\n\n".join(render_member(i + 1, m) for i, m in enumerate(data["members"])),
    }
