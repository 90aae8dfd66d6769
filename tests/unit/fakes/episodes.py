"""The episodes store port (``services.episodes.ports.EpisodeStore``) in memory, for the unit tier.

One row per run id and one per work key (an insert that would break either is refused, as the
table's unique indexes refuse it); a collapsed run id is filed under its row, and so is a settled
record's run id when it supersedes a self_iterate row of another run. Search reads see raw
rows only, as every search query of the Postgres store says ``kind = 'raw'``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from services.episodes.domain import Episode, EpisodeFilter, EpisodeKind, Sender, TurnOutcome
from services.episodes.ports import RawRows, SearchReads, Superseded
from tests.unit.fakes.lexical import cosine, idf_ranked

__all__ = ["MemoryEpisodeStore"]


@dataclasses.dataclass
class _Row:
    episode: Episode
    vector: np.ndarray | None
    indexed: bool = False
    consolidated_time: datetime | None = None


class MemoryEpisodeStore:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, _Row] = {}
        self.runs: dict[tuple[str, str, str], uuid.UUID] = {}

    def _seat(self, company: str, seat: str, raw: bool = False) -> list[_Row]:
        return [
            r
            for r in self.rows.values()
            if r.episode.company == company
            and r.episode.seat == seat
            and (not raw or r.episode.kind is EpisodeKind.RAW)
        ]

    def indexed(self, episode_id: uuid.UUID) -> bool:
        return self.rows[episode_id].indexed

    def delete(self, episode_id: uuid.UUID) -> None:
        """A row gone (the lifecycle's drop, an erasure) with its point left behind."""
        del self.rows[episode_id]

    async def insert_raw(
        self, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Episode | None:
        for r in self._seat(ep.company, ep.seat):
            if r.episode.turn_id == ep.turn_id or (ep.work_key and r.episode.work_key == ep.work_key):
                return None
        stored = dataclasses.replace(
            ep,
            embedding_model=ep.embedding_model if vector is not None else None,
            embedding_dims=int(vector.shape[0]) if vector is not None else None,
        )
        self.rows[ep.id] = _Row(stored, None if vector is None else vector.astype(np.float32))
        return stored

    async def get_by_work_key(self, company: str, seat: str, work_key: str) -> Episode | None:
        return next((r.episode for r in self._seat(company, seat) if r.episode.work_key == work_key), None)

    async def alias_run(self, company: str, seat: str, turn_id: str, episode_id: uuid.UUID, now: datetime) -> None:
        self.runs.setdefault((company, seat, turn_id), episode_id)

    async def supersede(
        self, row_id: uuid.UUID, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Superseded | None:
        """As ``SQL["supersede"]``: only a raw self_iterate row of the seat; its id and keys kept,
        the earlier start, the record's account, its role, work item and conversation where given."""
        r = self.rows.get(row_id)
        if (
            r is None
            or (r.episode.company, r.episode.seat) != (ep.company, ep.seat)
            or r.episode.kind is not EpisodeKind.RAW
            or r.episode.outcome is not TurnOutcome.SELF_ITERATE
        ):
            return None
        old = r.episode
        start = min(old.start_time, ep.start_time)
        r.episode = dataclasses.replace(
            old,
            outcome=ep.outcome,
            label=ep.label,
            ask=ep.ask,
            what_it_did=ep.what_it_did,
            review_outcome=ep.review_outcome,
            tool_sequence=ep.tool_sequence,
            tools_called=ep.tools_called,
            skills_used=ep.skills_used,
            subjects=ep.subjects,
            role=ep.role or old.role,
            work_item=ep.work_item or old.work_item,
            conversation_id=ep.conversation_id or old.conversation_id,
            start_time=start,
            end_time=ep.end_time,
            duration_ms=int((ep.end_time - start).total_seconds() * 1000),
            embedding_model=ep.embedding_model if vector is not None else None,
            embedding_dims=int(vector.shape[0]) if vector is not None else None,
        )
        r.vector = None if vector is None else vector.astype(np.float32)
        r.indexed = False
        if ep.turn_id and old.turn_id != ep.turn_id:
            await self.alias_run(ep.company, ep.seat, ep.turn_id, row_id, now)
        return Superseded(r.episode, old.embedding_dims)

    async def mark_consolidated(
        self, company: str, seat: str, turn_ids: Sequence[str], skill_id: str, now: datetime
    ) -> int:
        aliased = {self.runs.get((company, seat, t)) for t in turn_ids}
        marked = 0
        for r in self._seat(company, seat, raw=True):
            if r.episode.turn_id in turn_ids or r.episode.id in aliased:
                if r.episode.consolidated_into_skill_id != skill_id:
                    r.consolidated_time = now
                r.episode = dataclasses.replace(r.episode, consolidated_into_skill_id=skill_id)
                marked += 1
        return marked

    async def get(self, company: str, seat: str, episode_id: uuid.UUID) -> Episode | None:
        return next((r.episode for r in self._seat(company, seat) if r.episode.id == episode_id), None)

    async def prior(
        self, company: str, seat: str, turn_id: str, work_key: str | None
    ) -> tuple[Episode | None, Episode | None]:
        work = await self.get_by_work_key(company, seat, work_key) if work_key else None
        return await self.get_by_turn(company, seat, turn_id), work

    async def get_by_turn(self, company: str, seat: str, turn_id: str) -> Episode | None:
        own = next((r.episode for r in self._seat(company, seat) if r.episode.turn_id == turn_id), None)
        if own is not None:
            return own
        aliased = self.runs.get((company, seat, turn_id))
        return await self.get(company, seat, aliased) if aliased else None

    def _of(self, rows: RawRows) -> list[_Row]:
        return [
            r
            for r in self._seat(rows.company, rows.seat, raw=True)
            if rows.outcome is None or r.episode.outcome is rows.outcome
        ]

    async def lexical(self, rows: RawRows, query: str, limit: int) -> list[tuple[Episode, float, float | None]]:
        return self._lexical(rows, query, limit, None, None)

    async def search_reads(
        self, rows: RawRows, vector: np.ndarray, model: str, ids: Sequence[uuid.UUID], query: str, lexical_limit: int
    ) -> SearchReads:
        wanted = set(ids)
        of = self._of(rows)
        return SearchReads(
            hits={
                r.episode.id: r.episode for r in self._seat(rows.company, rows.seat, raw=True) if r.episode.id in wanted
            },
            lexical=self._lexical(rows, query, lexical_limit, vector, model),
            unreachable=sum(
                1
                for r in of
                if r.vector is None or r.episode.embedding_model != model or r.episode.embedding_dims != vector.shape[0]
            ),
            unindexed=sum(
                1
                for r in of
                if r.vector is not None
                and r.episode.embedding_model == model
                and r.episode.embedding_dims == vector.shape[0]
                and not r.indexed
            ),
        )

    def _lexical(
        self, rows: RawRows, query: str, limit: int, vector: np.ndarray | None, model: str | None
    ) -> list[tuple[Episode, float, float | None]]:
        ranked = idf_ranked(self._of(rows), lambda r: r.episode.text, query)
        ranked.sort(key=lambda p: (-p[1], -p[0].episode.end_time.timestamp()))
        out: list[tuple[Episode, float, float | None]] = []
        for r, rank in ranked[:limit]:
            similarity = None
            if vector is not None and r.vector is not None and r.episode.embedding_model == model:
                similarity = cosine(r.vector, vector) if r.vector.shape == vector.shape else None
            out.append((r.episode, rank, similarity))
        return out

    async def exact(self, rows: RawRows, vector: np.ndarray, model: str, limit: int) -> list[tuple[Episode, float]]:
        scored = [
            (r.episode, cosine(r.vector, vector))
            for r in self._of(rows)
            if r.vector is not None and r.episode.embedding_model == model and r.vector.shape == vector.shape
        ]
        scored.sort(key=lambda p: -p[1])
        return scored[:limit]

    def _filtered(self, company: str, seat: str, f: EpisodeFilter) -> list[Episode]:
        return [
            r.episode
            for r in self._seat(company, seat)
            if (f.kind is None or r.episode.kind is f.kind)
            and (not f.outcomes or r.episode.outcome in f.outcomes)
            and len(r.episode.tools_called or r.episode.tool_sequence) >= f.min_tool_calls
            and (f.conversation_id is None or r.episode.conversation_id == f.conversation_id)
            and not (f.exclude_exemplars and r.episode.exemplar_of is not None)
        ]

    async def count(self, company: str, seat: str, f: EpisodeFilter) -> int:
        return len(self._filtered(company, seat, f))

    async def page(
        self, company: str, seat: str, f: EpisodeFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[Episode]:
        rows = sorted(self._filtered(company, seat, f), key=lambda e: (e.end_time, e.id), reverse=True)
        if after is not None:
            rows = [e for e in rows if (e.end_time, e.id) < after]
        return rows[:limit]

    async def seats(self, company: str | None, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        seats = sorted(
            {(r.episode.company, r.episode.seat) for r in self.rows.values() if r.episode.kind is EpisodeKind.RAW}
        )
        if company:
            seats = [s for s in seats if s[0] == company and (after is None or s[1] > after[1])]
        elif after is not None:
            seats = [s for s in seats if s > after]
        return seats[:limit]

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        for i in ids:
            if i in self.rows:
                self.rows[i].indexed = True
