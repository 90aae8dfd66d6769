"""The conditional guidance blocks (``GetGuidance``): layer 2 of the four layers.

Short fragments appended to the executor's system prompt, each returned only when its trigger tool
is registered for the role (spec: "Prompt scaffolding"). They ship as the markdown files next to
this module, one per block, and their triggers are data: each file's front matter lists
``triggers``, regular expressions a registered tool name must match in full (so an MCP family such
as ``(atlassian|confluence_|jira_).*`` is one entry).

``retrieval-research`` is assembled instead of returned verbatim: its body is the one shared
preamble (re-query after recon, even when the block had entries) and its front matter lists one
terse ``line`` per re-query tool family (``query_episodes``, the knowledge backend's page-search
tools: ``search_knowledge`` and the Atlassian MCP server's ``confluence_search``, ``refresh_memory``);
only the lines whose tools are registered are appended, each naming the registered tools it is
about. A block with lines is returned when at least one line is, or when one of its own
``triggers`` is registered (retrieval-research's: any tool of the Atlassian MCP server, which the
spec lists beside the re-query tools, so a role with that server and no page search still gets
the shared rule).

**The Tool Skills registry** (spec: "This scaffolding is sourced from the Tool Skills registry —
knowledge-base pages operators can edit at runtime"): the pages of the container
``knowledge.tool_skills_container`` (default ``tool-skills``), read through the knowledge service on
every GetGuidance, so an edit applies to the next call without a restart. A page is written like a
bundled file (front matter with ``triggers`` or ``lines``, then the markdown): a page titled like a
bundled block replaces it, any other page adds a block after the bundled ones (by title). A page
whose front matter does not parse is skipped (logged) and the bundled default stands; a registry
that cannot be read leaves the bundled blocks answering alone, and the answer says so. Each block
names where its text came from (bundled, or the registry page's id and container), and the
knowledge service records the catalogue read as ``knowledge_read`` (source
``tool_skill_catalogue``) naming the pages.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from libs.common.config import Settings
from services.knowledge.client import KnowledgeUnreadable, Searcher
from services.knowledge.domain import ReadContext, Reader, ReadSource

__all__ = [
    "BUNDLED",
    "DIRECTORY",
    "Guidance",
    "GuidanceAnswer",
    "GuidanceBlock",
    "GuidanceLine",
    "GuidanceSource",
    "guidance_blocks",
    "guidance_for",
    "load_guidance",
    "parse_guidance",
    "registry_catalogue",
    "select_guidance",
]

_log = logging.getLogger(__name__)

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


class GuidanceSource(StrEnum):
    BUNDLED = "bundled"
    REGISTRY = "registry"


@dataclass(frozen=True)
class Guidance:
    name: str
    markdown: str
    triggers: tuple[re.Pattern[str], ...] = ()
    lines: tuple[GuidanceLine, ...] = ()
    source: GuidanceSource = GuidanceSource.BUNDLED
    page_id: str = ""
    """The registry page the text came from (empty for a bundled block)."""
    container: str = ""


@dataclass(frozen=True)
class GuidanceBlock:
    """One block returned: its text, the registered tools that triggered it, and its source."""

    name: str
    markdown: str
    triggered_by: tuple[str, ...]
    source: GuidanceSource
    page_id: str = ""
    container: str = ""


@dataclass(frozen=True)
class GuidanceAnswer:
    blocks: tuple[GuidanceBlock, ...]
    registry_unreadable: bool = False
    """The registry could not be read: the bundled blocks answered alone."""


def _patterns(values: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{where}: expected a list of tool-name patterns")
    return tuple(re.compile(v) for v in values)


def parse_guidance(text: str, default_name: str, where: str) -> Guidance:
    """One block from its text (front matter, then markdown); ValueError when it is not one."""
    match = _FRONT.match(text.replace("\r\n", "\n").strip() + "\n")
    if match is None:
        raise ValueError(f"{where}: no front matter")
    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{where}: front matter is not YAML ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: front matter is not a mapping")
    name = str(meta.get("name") or default_name)
    try:
        lines = tuple(
            GuidanceLine(str(item["key"]), _patterns(item["patterns"], f"{where}: lines"), str(item["text"]))
            for item in meta.get("lines") or []
        )
        triggers = _patterns(meta["triggers"], f"{where}: triggers") if "triggers" in meta else ()
    except (KeyError, TypeError, re.error) as err:
        raise ValueError(f"{where}: {err}") from None
    if not triggers and not lines:
        raise ValueError(f"{where}: a block needs triggers or lines")
    return Guidance(name=name, markdown=match.group(2).strip(), triggers=triggers, lines=lines)


def _parse(path: Path) -> Guidance:
    return parse_guidance(path.read_text(encoding="utf-8"), path.stem, str(path))


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
    triggered_by}`` (the registered tools that triggered it, in the order given)."""
    return [
        {"name": b.name, "markdown": b.markdown, "triggered_by": list(b.triggered_by)}
        for b in select_guidance(registered_tools, catalogue)
    ]


def select_guidance(
    registered_tools: Sequence[str], catalogue: Sequence[Guidance] | None = None
) -> list[GuidanceBlock]:
    """The blocks of ``catalogue`` (default: the bundled ones) whose trigger tool is registered.

    Linear in the number of tools: de-duplication and membership go through dicts and sets (an
    engine may register tens of thousands of MCP tools; a list scan per tool stalled the server)."""
    tools = list(dict.fromkeys(t for t in (tool.strip() for tool in registered_tools) if t))
    out: list[GuidanceBlock] = []
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
            if rendered:
                markdown = f"{markdown}\n\n" + "\n".join(rendered)
        if not hits:
            continue
        out.append(
            GuidanceBlock(
                name=block.name,
                markdown=markdown,
                triggered_by=tuple(t for t in tools if t in hits),
                source=block.source,
                page_id=block.page_id,
                container=block.container,
            )
        )
    return out


async def registry_catalogue(searcher: Searcher, settings: Settings, company: str) -> tuple[tuple[Guidance, ...], bool]:
    """The catalogue GetGuidance answers from: the bundled blocks with the registry's pages over
    them (a page titled like a bundled block replaces it; others follow, by title), and whether
    the registry could not be read."""
    bundled = _bundled()
    container = settings.knowledge.tool_skills_container
    if not container:
        return bundled, False
    try:
        # Read as the deployment (an operator's read): the registry is configuration, not a seat's
        # knowledge; drafts are never listed.
        pages = await searcher.list_pages(Reader(company), container, ReadContext(ReadSource.TOOL_SKILL_CATALOGUE))
    except KnowledgeUnreadable as err:
        _log.warning("Tool Skills registry %s of %s unreadable (%s): bundled guidance only", container, company, err)
        return bundled, True
    from_pages: dict[str, Guidance] = {}
    for page in sorted(pages, key=lambda p: p.title):
        where = f"registry page {page.id} ({container}/{page.title})"
        try:
            block = parse_guidance(page.body, page.title, where)
        except ValueError as err:
            _log.warning("%s skipped: %s", where, err)
            continue
        from_pages[page.title] = dataclasses.replace(
            block, name=page.title, source=GuidanceSource.REGISTRY, page_id=page.id, container=page.container
        )
    catalogue = [from_pages.pop(b.name, b) for b in bundled]
    return (*catalogue, *from_pages.values()), False


async def guidance_for(
    searcher: Searcher, settings: Settings, company: str, registered_tools: Sequence[str]
) -> GuidanceAnswer:
    """GetGuidance: the registry's catalogue (the bundled defaults under it) for the tools."""
    catalogue, unreadable = await registry_catalogue(searcher, settings, company)
    return GuidanceAnswer(tuple(select_guidance(registered_tools, catalogue)), unreadable)
