"""The conditional guidance blocks (``GetGuidance``): layer 2 of the four layers.

Short fragments appended to the executor's system prompt, each returned only when its trigger tool
is registered for the role (spec: "Prompt scaffolding"). They ship as the markdown files next to
this module, one per block, and their triggers are data: each file's front matter lists
``triggers``, regular expressions a registered tool name must match in full (so an MCP family such
as ``(atlassian|confluence_|jira_).*`` is one entry).

``retrieval-research`` is assembled instead of returned verbatim: its body is the one shared
preamble (re-query after recon, even when the block had entries) and its front matter lists one
terse ``line`` per re-query tool family (``query_episodes``, the knowledge backend's page-search
tools, ``refresh_memory``); only the lines whose tools are registered are appended, each naming the
registered tools it is about, and the block is returned when at least one line is.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["BUNDLED", "DIRECTORY", "Guidance", "GuidanceLine", "guidance_blocks", "load_guidance"]

DIRECTORY = Path(__file__).parent
BUNDLED = (
    "reflect-and-persist",
    "refine-skill",
    "retrieval-research",
    "observed-directives",
    "getting-unstuck",
    "channel-discovery",
)
"""The bundled blocks, in the order GetGuidance returns them."""

_FRONT = re.compile(r"\A---\n(.*?)\n---\n(.*)\Z", re.DOTALL)


@dataclass(frozen=True)
class GuidanceLine:
    """One per-tool line of an assembled block."""

    key: str
    patterns: tuple[re.Pattern[str], ...]
    text: str
    """``{tools}`` is replaced by the matching registered tools, each in backticks."""


@dataclass(frozen=True)
class Guidance:
    name: str
    markdown: str
    triggers: tuple[re.Pattern[str], ...] = ()
    lines: tuple[GuidanceLine, ...] = ()


def _patterns(values: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{where}: expected a list of tool-name patterns")
    return tuple(re.compile(v) for v in values)


def _parse(path: Path) -> Guidance:
    match = _FRONT.match(path.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{path}: no front matter")
    meta = yaml.safe_load(match.group(1)) or {}
    name = meta.get("name") or path.stem
    lines = tuple(
        GuidanceLine(str(item["key"]), _patterns(item["patterns"], f"{path}: lines"), str(item["text"]))
        for item in meta.get("lines") or []
    )
    triggers = _patterns(meta["triggers"], f"{path}: triggers") if "triggers" in meta else ()
    if not triggers and not lines:
        raise ValueError(f"{path}: a block needs triggers or lines")
    return Guidance(name=name, markdown=match.group(2).strip(), triggers=triggers, lines=lines)


def load_guidance(directory: Path = DIRECTORY, names: Sequence[str] = BUNDLED) -> tuple[Guidance, ...]:
    """The blocks of ``directory`` (``<name>.md`` each), in the order of ``names``."""
    return tuple(_parse(directory / f"{name}.md") for name in names)


@functools.cache
def _bundled() -> tuple[Guidance, ...]:
    return load_guidance()


def _matching(tools: Sequence[str], patterns: Iterable[re.Pattern[str]]) -> list[str]:
    pats = tuple(patterns)
    return [t for t in tools if any(p.fullmatch(t) for p in pats)]


def guidance_blocks(
    registered_tools: Sequence[str], catalogue: Sequence[Guidance] | None = None
) -> list[dict[str, Any]]:
    """The blocks whose trigger tool is among ``registered_tools``, each as ``{name, markdown,
    triggered_by}`` (the registered tools that triggered it, in the order given).

    Linear in the number of tools: de-duplication and membership go through dicts and sets (an
    engine may register tens of thousands of MCP tools; a list scan per tool stalled the server)."""
    tools = list(dict.fromkeys(t for t in (tool.strip() for tool in registered_tools) if t))
    out: list[dict[str, Any]] = []
    for block in _bundled() if catalogue is None else catalogue:
        hits = set(_matching(tools, block.triggers))
        markdown = block.markdown
        if block.lines:
            rendered = []
            for line in block.lines:
                present = _matching(tools, line.patterns)
                if present:
                    rendered.append(line.text.replace("{tools}", ", ".join(f"`{t}`" for t in present)))
                    hits.update(present)
            if not rendered:
                continue
            markdown = f"{markdown}\n\n" + "\n".join(rendered)
        if not hits:
            continue
        out.append({"name": block.name, "markdown": markdown, "triggered_by": [t for t in tools if t in hits]})
    return out
