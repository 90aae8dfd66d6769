"""The prefetch's domain: the turn start, the blocks it renders, the summary it records, and the
small rules that are data (block headings, limits, hashing of a unit chain, normalising a hint).

Nothing here does I/O; the use cases (``turn_context``, ``builtins``) compose these.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from libs.common import senders
from libs.common.text_fold import fold as normalise_hint  # a refresh hint as the ledger compares it

__all__ = [
    "DOMAIN",
    "HEADINGS",
    "HINT_MAX_CHARS",
    "MAX_SENDERS",
    "MEMORY_BLOCK_NOTES",
    "QUERY_EPISODES_LIMIT",
    "QUERY_MAX_CHARS",
    "REFRESH_LIMIT",
    "RPC_TIMEOUT_SECONDS",
    "SEARCH_KNOWLEDGE_LIMIT",
    "SUMMARY_BLOCKS",
    "Block",
    "BlockKind",
    "Limit",
    "Sender",
    "Summary",
    "TurnContext",
    "TurnEmbedding",
    "TurnStart",
    "chain_hash",
    "first_sentences",
    "fit_bytes",
    "hint_key",
    "normalise_hint",
    "one_line",
]

DOMAIN = "prefetch.agentlearn.dev"

RPC_TIMEOUT_SECONDS = 10.0
"""Deadline of every call the prefetch makes on another service (diary, episodes, skills,
profiles) and of a knowledge search. A call past it degrades its block; it never fails the turn."""
MEMORY_BLOCK_NOTES = 10
"""Notes the turn-start ``## Personal memory`` digest shows at most (the filter is asked for at
most this many)."""


@dataclass(frozen=True)
class Limit:
    """A builtin's ``limit`` argument, stated once for the tool's schema and the tool's check:
    ``default`` when omitted (0), at most ``maximum`` (larger is clamped; negative is refused)."""

    default: int
    maximum: int

    def configured(self, default: int) -> Limit:
        """This limit with a configured default (kept within 1..``maximum``): what both the schema
        and the check are built from when a knob sets the default."""
        return Limit(default=max(1, min(default, self.maximum)), maximum=self.maximum)

    def schema(self, noun: str) -> dict[str, Any]:
        """The argument's JSON schema (a configured default: build it from :meth:`configured`)."""
        shown = self.default
        return {
            "type": "integer",
            "minimum": 1,
            "maximum": self.maximum,
            "default": shown,
            "description": f"{noun} to return (default {shown}).",
        }


REFRESH_LIMIT = Limit(default=10, maximum=50)
"""refresh_memory's ``limit``."""
QUERY_EPISODES_LIMIT = Limit(default=5, maximum=20)
"""query_episodes' ``limit``."""
SEARCH_KNOWLEDGE_LIMIT = Limit(default=5, maximum=20)
"""search_knowledge's ``limit``; its default is ``learning.prefetch.knowledge_results``
(``SEARCH_KNOWLEDGE_LIMIT.configured(...)``), in the schema and when the model omits it."""
HINT_MAX_CHARS = 4000
"""A refresh hint longer than this is refused (it is the model's account of the task, not the task)."""
QUERY_MAX_CHARS = 4000
"""A query_episodes / search_knowledge query longer than this is refused."""
MAX_SENDERS = 50
"""Distinct senders read for counterparty blocks (ProfileService.GetProfiles takes 50), and told to
the memory filter."""


class BlockKind(StrEnum):
    SIMILAR_PRIOR_WORK = "similar_prior_work"
    PERSONAL_MEMORY = "personal_memory"
    SKILLS = "skills"
    RELEVANT_KNOWLEDGE = "relevant_knowledge"
    COUNTERPARTY = "counterparty"
    ONBOARDING = "onboarding"


HEADINGS = {
    BlockKind.SIMILAR_PRIOR_WORK: "## Similar prior work",
    BlockKind.PERSONAL_MEMORY: "## Personal memory",
    BlockKind.SKILLS: "## Synthesized skills you've learned",
    BlockKind.RELEVANT_KNOWLEDGE: "## Relevant knowledge",
    BlockKind.ONBOARDING: "## First-turn onboarding",
}


SUMMARY_BLOCKS = (
    "similar_prior_work",
    "personal_memory",
    "skills",
    "relevant_knowledge",
    "counterparty",
    "onboarding",
    "thread",
)
"""The engine's block list: the seven context prefetches a turn start resolves (spec:
``prefetch_summary``, "prefetch: N/7 hits"). Fixed — not the blocks one turn happened to render —
so the line of a turn with four senders reads against the same seven as one with none. The
counterparty kind is one entry however many senders it rendered a block for. ``thread`` (the chat
thread) is rendered by the engine, never here: it counts in the denominator and never as a hit of
this service. A block kind rendered here but missing from this list reads as a wrong fraction
(8/7) rather than going unnoticed."""


class TurnEmbedding(StrEnum):
    """What became of the one vector the memory and episode searches rank by. Absent (None) where
    no search asked for one: a thin trigger embeds nothing."""

    EMBEDDED = "embedded"
    FAILED = "failed"
    UNCONFIGURED = "unconfigured"


class Sender(senders.Sender):
    """A sender of the turn's trigger (a counterparty)."""

    @property
    def key(self) -> tuple[str, str]:
        """What a profile is filed under: (platform lowercased, handle or else external id)."""
        return (self.platform.strip().lower(), (self.handle or self.external_id).strip())

    def words(self) -> list[str]:
        """Every way the sender is named, for a filter judging "party to the task"."""
        return [w for w in (self.display_name, self.handle, self.external_id) if w]


@dataclass(frozen=True)
class TurnStart:
    company: str
    seat: str
    role: str
    turn_id: str
    ask: str
    requires_recon: bool
    senders: tuple[Sender, ...] = ()
    unit_chain: tuple[str, ...] = ()

    @property
    def gated(self) -> bool:
        """The thin-trigger gate: the builder's flag, or an ask with nothing in it."""
        return self.requires_recon or not self.ask.strip()


@dataclass
class Block:
    """One rendered block. ``hit`` is true when it rendered anything (entries or a hint)."""

    kind: BlockKind
    markdown: str = ""
    selection_count: int = 0
    ids: list[str] = field(default_factory=list)
    counterparty: Sender | None = None
    source_error: str = ""
    """Why the block's source could not be read (``"diary: UNAVAILABLE"``); empty when it was."""

    @property
    def hit(self) -> bool:
        return bool(self.markdown)

    @property
    def bytes(self) -> int:
        return len(self.markdown.encode())


@dataclass(frozen=True)
class Summary:
    """The prefetch_summary of one turn."""

    blocks: tuple[Block, ...]
    knowledge_selection_count: int
    trigger_requires_recon: bool
    turn_embedding: TurnEmbedding | None
    """None where no search asked for the vector (a thin trigger): the key is then absent."""
    gated: bool

    @property
    def hits(self) -> int:
        """Block kinds that rendered something (the counterparty kind once, however many senders)."""
        return len({str(b.kind) for b in self.blocks if b.hit})

    @property
    def line(self) -> str:
        # The denominator is the length of the engine's block list, never a literal and never the
        # number of blocks this turn rendered (which grew with its senders).
        line = f"prefetch: {self.hits}/{len(SUMMARY_BLOCKS)} hits"
        if self.gated:
            line += " (thin trigger: relevance filters gated)"
        elif self.turn_embedding is TurnEmbedding.FAILED:
            line += " (turn embedding failed: memory and episode similarity did not run)"
        return line

    def payload(self) -> dict[str, object]:
        """The event's payload: per block hit/bytes (flattened and as a list), the knowledge
        selection count, the gate decision and the embedding's fate."""
        out: dict[str, object] = {
            "blocks": [
                {"block": str(b.kind), "hit": b.hit, "bytes": b.bytes, "selection_count": b.selection_count}
                | ({"source_error": b.source_error} if b.source_error else {})
                for b in self.blocks
            ],
            "trigger_requires_recon": self.trigger_requires_recon,
            "relevant_knowledge_selection_count": self.knowledge_selection_count,
            "hits": self.hits,
            "block_count": len(SUMMARY_BLOCKS),
            "line": self.line,
        }
        if self.turn_embedding is not None:
            out["turn_embedding"] = str(self.turn_embedding)
        for b in self.blocks:
            if b.kind is BlockKind.COUNTERPARTY:
                continue
            out[f"{b.kind}_hit"] = b.hit
            out[f"{b.kind}_bytes"] = b.bytes
        parties = [b for b in self.blocks if b.kind is BlockKind.COUNTERPARTY]
        out["counterparty_blocks"] = len(parties)
        out["counterparty_bytes"] = sum(b.bytes for b in parties)
        unread = {str(b.kind): b.source_error for b in self.blocks if b.source_error}
        if unread:
            out["unread_sources"] = unread
        return out


def _block_json(b: Block) -> dict[str, object]:
    out: dict[str, object] = {
        "kind": str(b.kind),
        "markdown": b.markdown,
        "selection_count": b.selection_count,
        "ids": list(b.ids),
        "source_error": b.source_error,
    }
    if b.counterparty is not None:
        c = b.counterparty
        out["counterparty"] = {
            "handle": c.handle,
            "external_id": c.external_id,
            "platform": c.platform,
            "display_name": c.display_name,
        }
    return out


def _block_of(data: dict[str, Any]) -> Block:
    party = data.get("counterparty")
    return Block(
        BlockKind(data["kind"]),
        markdown=data["markdown"],
        selection_count=int(data["selection_count"]),
        ids=list(data["ids"]),
        counterparty=Sender(**party) if party else None,
        source_error=data.get("source_error", ""),
    )


@dataclass(frozen=True)
class TurnContext:
    blocks: tuple[Block, ...]
    summary: Summary

    @property
    def markdown(self) -> str:
        return "\n\n".join(b.markdown for b in self.blocks if b.markdown)

    def to_json(self) -> dict[str, object]:
        """The context as it is frozen for its run id (see ``turn_context``)."""
        s = self.summary
        return {
            "blocks": [_block_json(b) for b in self.blocks],
            "knowledge_selection_count": s.knowledge_selection_count,
            "trigger_requires_recon": s.trigger_requires_recon,
            "turn_embedding": None if s.turn_embedding is None else str(s.turn_embedding),
            "gated": s.gated,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnContext:
        blocks = tuple(_block_of(b) for b in data["blocks"])
        embedding = data.get("turn_embedding")
        summary = Summary(
            blocks=blocks,
            knowledge_selection_count=int(data["knowledge_selection_count"]),
            trigger_requires_recon=bool(data["trigger_requires_recon"]),
            turn_embedding=TurnEmbedding(embedding) if embedding else None,
            gated=bool(data["gated"]),
        )
        return cls(blocks, summary)


# ------------------------------------------------------------------------------------ small rules


def chain_hash(unit_chain: tuple[str, ...] | list[str]) -> str:
    """The hash an onboarding marker is stamped with: the unit chain, in order, exactly."""
    basis = "\x1f".join(unit_chain)
    return hashlib.sha256(basis.encode()).hexdigest()[:32]


def hint_key(hint: str) -> str:
    return hashlib.sha256(normalise_hint(hint).encode()).hexdigest()


def one_line(text: str) -> str:
    return " ".join(text.split())


def fit_bytes(text: str, budget: int) -> str:
    """The longest prefix of ``text`` that ends between words and fits ``budget`` UTF-8 bytes."""
    if len(text.encode()) <= budget:
        return text
    out = ""
    for word in text.split():
        candidate = f"{out} {word}" if out else word
        if len(candidate.encode()) > budget:
            break
        out = candidate
    if not out:  # one very long word: cut on a character boundary
        out = text.encode()[:budget].decode(errors="ignore")
    return out


def first_sentences(text: str, budget: int) -> str:
    """Whole leading sentences of ``text`` within ``budget`` bytes (at least part of the first)."""
    text = one_line(text)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s]
    out = ""
    for s in sentences:
        candidate = f"{out} {s}" if out else s
        if len(candidate.encode()) > budget:
            break
        out = candidate
    return out or fit_bytes(text, budget)
