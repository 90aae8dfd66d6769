"""learning.PastTurns: the one renderer of a seat's past turns, for the ``## Similar prior work``
block and for ``query_episodes`` alike.

A raw turn is what woke it (``Woken by:``), how it ended and with which tools, what it was asked
(``Asked:``) and what it did (``What it did:``), the ask and the account each on one line, whole up
to ``learning.episodes.account_bytes`` (600) and past that condensed by the seat's auxiliary model
and marked as a rewrite, or named by its size where no rewrite came in time. At most
``rewrite_concurrency`` (4) rewrites run at once and every rewrite of one render shares ONE
deadline (``rewrite_timeout_seconds``, 30 s), so a render of any number of turns waits at most that.

A compacted row is rendered as its pattern: the dates it spans, how many turns it stands for, how
many of them ended done, and what varied.

With ``learning.summarize_episodes`` on, the block (never ``query_episodes``) asks for one briefing
in place of the bullets, reading each ask and account whole up to ``summary_input_bytes`` (past it
condensed first); if the briefing does not answer, the bullets get what is left of the same
deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from libs.common.auxmodel import AuxiliaryModel, AuxiliaryUnavailable, NoAuxiliaryModel, Prompt
from libs.common.config import LearningConfig
from services.prefetch.deps import Who
from services.prefetch.domain import first_sentences, one_line
from services.prefetch.text import prompt

__all__ = [
    "REWRITE_PURPOSE",
    "SUMMARY_PURPOSE",
    "PastTurns",
    "Rendered",
    "outcome_name",
    "rewrite_rule",
    "summary_rule",
]

_log = logging.getLogger(__name__)

REWRITE_PURPOSE = "episode_rewrite"
SUMMARY_PURPOSE = "episode_summary"
_REWRITE_SYSTEM = prompt("episode_rewrite.system.md")
_REWRITE_USER = prompt("episode_rewrite.user.md")
_SUMMARY_SYSTEM = prompt("episode_summary.system.md")
_SUMMARY_USER = prompt("episode_summary.user.md")

_OUTCOMES: dict[int, str] = {
    ep_pb.TURN_OUTCOME_DONE: "done",
    ep_pb.TURN_OUTCOME_FAILED: "failed",
    ep_pb.TURN_OUTCOME_SELF_ITERATE: "self_iterate",
    ep_pb.TURN_OUTCOME_SKIPPED: "skipped",
}


def outcome_name(value: int) -> str:
    return _OUTCOMES.get(value, "unknown")


def _date(ts: Any) -> str:
    return ts.ToDatetime().date().isoformat() if ts.seconds or ts.nanos else "undated"


def _size(n: int) -> str:
    return f"{n:,} bytes"


@dataclass(frozen=True)
class Rendered:
    """A render: ``entries`` (one markdown bullet per turn) or ``briefing`` (the summary in their
    place), the ids shown, and what the rewrites did."""

    entries: tuple[str, ...]
    briefing: str
    ids: tuple[str, ...]
    rewritten: int
    named_by_size: int

    @property
    def text(self) -> str:
        return self.briefing or "\n".join(self.entries)


def tools_of(e: ep_pb.Episode) -> list[str]:
    """The tools a turn used, each once in the order first called: its run (every call; the final
    round when no calls were recorded) — the one definition of a turn's tools the skill gates use
    too. A final round is often the answer alone, so it would under-report what the turn did."""
    return list(dict.fromkeys(t for t in (e.tools_called or e.tool_sequence) if t))


_NOT_CONDENSED = "no condensed version came in time"
_BUDGET_SPENT = "the token budget is spent for this window, so no model condensed it"


class PastTurns:
    def __init__(self, aux: AuxiliaryModel, learning: LearningConfig):
        self._aux = aux
        cfg = learning.episodes
        self.account_bytes = cfg.account_bytes
        self.timeout = cfg.rewrite_timeout_seconds
        self.concurrency = max(1, cfg.rewrite_concurrency)
        self.summary_input_bytes = cfg.summary_input_bytes
        self.summarize_max_tokens = learning.summarize_max_tokens

    # ------------------------------------------------------------------ entry points

    async def render(
        self,
        who: Who,
        episodes: Sequence[ep_pb.Episode],
        *,
        summarize: bool = False,
        ask: str = "",
        timeout: float | None = None,
        condense: bool = True,
    ) -> Rendered:
        """Render ``episodes`` in order. Everything asked of a model shares one deadline: the
        rewrites, and with ``summarize`` the briefing (whose fallback bullets get what is left).
        ``condense`` False (the turn's token window is full): no model is asked, no briefing is
        written and every long text is named by size."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        ids = tuple(e.id for e in episodes)
        if summarize and episodes and condense:
            briefing = await self._briefing(who, ask, episodes, deadline)
            if briefing:
                return Rendered((), briefing, ids, 0, 0)
        long_texts = [t for e in episodes for t in _texts(e) if len(t.encode()) > self.account_bytes]
        rewrites = await self._rewrite_all(who, long_texts, self.account_bytes, deadline) if condense else {}
        missing = _NOT_CONDENSED if condense else _BUDGET_SPENT
        entries = tuple(self._entry(e, rewrites, missing) for e in episodes)
        rewritten = sum(1 for t in long_texts if rewrites.get(t))
        return Rendered(entries, "", ids, rewritten, len(long_texts) - rewritten)

    # ------------------------------------------------------------------ bullets

    def _line(self, label: str, text: str, rewrites: Mapping[str, str | None], missing: str) -> str:
        flat = one_line(text)
        size = len(text.encode())
        if size <= self.account_bytes:
            return f"{label}: {flat}"
        rewrite = rewrites.get(text)
        if rewrite:
            return f"{label} (condensed from {_size(size)}): {one_line(rewrite)}"
        return f"{label}: [not shown: {_size(size)}, too long for one line, and {missing}]"

    def _entry(self, e: ep_pb.Episode, rewrites: Mapping[str, str | None], missing: str) -> str:
        tools = ", ".join(tools_of(e)) or "none"
        if e.kind == ep_pb.EPISODE_KIND_COMPACTED:
            span = f"{_date(e.start_time)} to {_date(e.end_time)}"
            lines = [
                f"- Pattern of {e.count} turns ({span}; {e.done_count} of {e.count} ended done): "
                f"{one_line(e.common_task_pattern) or one_line(e.label) or '(no pattern recorded)'}",
                f"  Common outcome: {one_line(e.common_outcome) or outcome_name(e.outcome)}; tools: {tools}",
            ]
            if e.notable_patterns:
                lines.append(f"  What varied: {'; '.join(one_line(p) for p in e.notable_patterns)}")
            if e.subjects_involved:
                lines.append(f"  Involved: {', '.join(e.subjects_involved)}")
            return "\n".join(lines)
        lines = [
            f"- Woken by: {one_line(e.label) or '(no label)'} ({_date(e.end_time)})",
            f"  Outcome: {outcome_name(e.outcome)}; tools: {tools}",
        ]
        if e.ask.strip():  # a turn that was told nothing shows no ask
            lines.append("  " + self._line("Asked", e.ask, rewrites, missing))
        lines.append("  " + self._line("What it did", e.what_it_did or "(no account)", rewrites, missing))
        return "\n".join(lines)

    # ------------------------------------------------------------------ rewrites

    async def _rewrite_all(self, who: Who, texts: Sequence[str], limit: int, deadline: float) -> dict[str, str | None]:
        """Condense each distinct text, ``concurrency`` at a time, all under ``deadline``; a text
        whose rewrite did not come in time (or failed) maps to None."""
        unique = list(dict.fromkeys(texts))
        if not unique:
            return {}
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(self.concurrency)
        out: dict[str, str | None] = dict.fromkeys(unique)

        async def one(text: str) -> None:
            async with gate:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                out[text] = await self._rewrite(who, text, limit, remaining)

        tasks = [asyncio.create_task(one(t)) for t in unique]
        _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return out

    async def _rewrite(self, who: Who, text: str, limit: int, timeout: float) -> str | None:
        field = "what it was asked or what it did"
        request = Prompt(
            purpose=REWRITE_PURPOSE,
            system=_REWRITE_SYSTEM.substitute(field=field, limit=limit),
            user=_REWRITE_USER.substitute(text=text),
            data={"text": text, "limit_bytes": limit},
            max_tokens=max(32, limit // 3),
        )
        try:
            completion = await self._aux.complete(who.attribution(REWRITE_PURPOSE), request, timeout=timeout)
        except (AuxiliaryUnavailable, NoAuxiliaryModel, TimeoutError) as err:
            _log.info("episode rewrite failed: %s", err)
            return None
        answer = one_line(completion.text)
        # A rewrite longer than what it replaces is no condensation: the text is named by size.
        if not answer or len(answer.encode()) >= len(text.encode()):
            return None
        return answer

    # ------------------------------------------------------------------ briefing

    async def _briefing(self, who: Who, ask: str, episodes: Sequence[ep_pb.Episode], deadline: float) -> str:
        loop = asyncio.get_running_loop()
        cap = self.summary_input_bytes
        long_texts = [t for e in episodes for t in _texts(e) if len(t.encode()) > cap]
        condensed = await self._rewrite_all(who, long_texts, cap, deadline)

        def whole(text: str) -> str:
            if len(text.encode()) <= cap:
                return text
            return condensed.get(text) or f"[{_size(len(text.encode()))}, not condensed in time]"

        turns: list[dict[str, Any]] = []
        for i, e in enumerate(episodes, 1):
            turns.append(
                {
                    "n": i,
                    "date": _date(e.end_time),
                    "woken_by": e.label,
                    "outcome": outcome_name(e.outcome),
                    "tools": tools_of(e),
                    "asked": whole(e.ask),
                    "what_it_did": whole(e.what_it_did),
                }
            )
        described = "\n\n".join(
            f"{t['n']}. Woken by: {t['woken_by']} ({t['date']})\n"
            f"Outcome: {t['outcome']}; tools: {', '.join(t['tools']) or 'none'}\n"
            + (f"Asked: {t['asked']}\n" if t["asked"] else "")
            + f"What it did: {t['what_it_did'] or '(no account)'}"
            for t in turns
        )
        request = Prompt(
            purpose=SUMMARY_PURPOSE,
            system=_SUMMARY_SYSTEM.template,
            user=_SUMMARY_USER.substitute(ask=ask.strip() or "(not stated)", turns=described),
            data={"ask": ask, "turns": turns, "max_bytes": self.summarize_max_tokens * 4},
            max_tokens=self.summarize_max_tokens,
        )
        remaining = deadline - loop.time()
        if remaining <= 0:
            return ""
        try:
            completion = await asyncio.wait_for(
                self._aux.complete(who.attribution(SUMMARY_PURPOSE), request, timeout=remaining), remaining
            )
        except (AuxiliaryUnavailable, NoAuxiliaryModel, TimeoutError) as err:
            _log.info("episode summary did not answer (bullets instead): %s", err)
            return ""
        return completion.text.strip()


def _texts(e: ep_pb.Episode) -> list[str]:
    """The texts of a turn a render may condense: its ask and its account (raw rows only)."""
    if e.kind == ep_pb.EPISODE_KIND_COMPACTED:
        return []
    return [t for t in (e.ask, e.what_it_did) if t.strip()]


# ------------------------------------------------------------------------------------ offline


def rewrite_rule(data: Mapping[str, Any]) -> str:
    """The offline rewrite: the text's first whole sentences that fit the budget, marked as cut
    there (the display marks it a rewrite)."""
    limit = int(data.get("limit_bytes", 600))
    return first_sentences(str(data.get("text", "")), max(16, limit - 8)) + " […]"


def summary_rule(data: Mapping[str, Any]) -> str:
    """The offline briefing: per turn, its date, what woke it, how it ended, and the first sentence
    of what it was asked and of what it did, within the byte budget; marked as such."""
    budget = int(data.get("max_bytes", 1600))
    lines = ["(Offline briefing: the first sentence of each similar turn.)"]
    for t in data.get("turns", []):
        asked = first_sentences(str(t.get("asked", "")), 200)
        did = first_sentences(str(t.get("what_it_did", "")), 200)
        line = f"- {t.get('date')}: woken by {t.get('woken_by')}; ended {t.get('outcome')}"
        if asked:
            line += f"; asked: {asked}"
        if did:
            line += f"; did: {did}"
        if len("\n".join([*lines, line]).encode()) > budget:
            break
        lines.append(line)
    return "\n".join(lines)
