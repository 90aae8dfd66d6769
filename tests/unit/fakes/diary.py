"""The diary's store port (``services.diary.ports.NoteStore``) in memory, for the unit tier.

Every read is scoped to one (company, seat) and applies the expiry at the ``now`` it is given, as
the Postgres store does; vectors are kept beside the notes so the exact scan and the unreachable
count read the same rows the index was written from.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from services.diary.domain import Note, NoteProvenance
from services.diary.ports import EarlierWrite, NoteListing, VectorReads
from tests.unit.fakes.lexical import cosine, idf_ranked

__all__ = ["MemoryNoteStore"]


@dataclasses.dataclass
class _Row:
    note: Note
    vector: np.ndarray | None
    request_id: str | None
    indexed: bool = False
    provenance: NoteProvenance | None = None


class MemoryNoteStore:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, _Row] = {}
        self.requests: dict[tuple[str, str, str], tuple[uuid.UUID, datetime | None, bytes | None]] = {}
        """Idempotency keys, the note each wrote, its expiry and the request's digest: they outlive
        the notes (``diary_requests``), a SHORT note's until its expiry."""

    def _seat(self, company: str, seat: str, now: datetime | None = None) -> list[_Row]:
        return [
            r
            for r in self.rows.values()
            if r.note.company == company
            and r.note.seat == seat
            and (now is None or r.note.expire_time is None or r.note.expire_time > now)
        ]

    def indexed(self, note_id: uuid.UUID) -> bool:
        return self.rows[note_id].indexed

    def vector_of(self, note_id: uuid.UUID) -> np.ndarray | None:
        return self.rows[note_id].vector

    async def by_request(self, company: str, seat: str, request_id: str, now: datetime) -> EarlierWrite | None:
        if not self._spent(company, seat, request_id, now):
            return None
        note_id, _, digest = self.requests[company, seat, request_id]
        note = next((r.note for r in self._seat(company, seat, now) if r.note.id == note_id), None)
        return EarlierWrite(note, digest)

    def _spent(self, company: str, seat: str, request_id: str, now: datetime) -> bool:
        used = self.requests.get((company, seat, request_id))
        return used is not None and (used[1] is None or used[1] > now)

    async def insert(
        self,
        note: Note,
        vector: np.ndarray | None,
        request_id: str | None = None,
        provenance: NoteProvenance | None = None,
        request_digest: bytes | None = None,
    ) -> Note | None:
        if request_id:
            if self._spent(note.company, note.seat, request_id, note.create_time):
                return None
            self.requests[note.company, note.seat, request_id] = (note.id, note.expire_time, request_digest)
        stored = dataclasses.replace(
            note,
            embedding_model=note.embedding_model if vector is not None else None,
            embedding_dims=int(vector.shape[0]) if vector is not None else None,
        )
        self.rows[note.id] = _Row(
            stored, None if vector is None else vector.astype(np.float32), request_id, provenance=provenance
        )
        return stored

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None:
        for i in ids:
            if i in self.rows:
                self.rows[i].indexed = True

    async def get(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> Note | None:
        return next((r.note for r in self._seat(company, seat, now) if r.note.id == note_id), None)

    async def hydrate(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> dict[uuid.UUID, Note]:
        wanted = set(ids)
        return {r.note.id: r.note for r in self._seat(company, seat, now) if r.note.id in wanted}

    async def recent(self, company: str, seat: str, now: datetime, limit: int) -> list[Note]:
        notes = sorted((r.note for r in self._seat(company, seat, now)), key=lambda n: (n.create_time, n.id))
        return notes[::-1][:limit]

    async def lexical(self, company: str, seat: str, now: datetime, query: str, limit: int) -> list[tuple[Note, float]]:
        ranked = idf_ranked([r.note for r in self._seat(company, seat, now)], lambda n: n.content, query)
        ranked.sort(key=lambda p: (-p[1], -p[0].create_time.timestamp()))
        return ranked[:limit]

    async def lexical_recent(
        self, company: str, seat: str, now: datetime, query: str, lexical_limit: int, recency_limit: int
    ) -> tuple[list[tuple[Note, float]], list[Note]]:
        return await self.lexical(company, seat, now, query, lexical_limit), await self.recent(
            company, seat, now, recency_limit
        )

    async def hydrate_unreachable(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, model: str, dims: int
    ) -> VectorReads:
        return VectorReads(
            await self.hydrate(company, seat, ids, now),
            await self.unreachable_by_vector(company, seat, now, model, dims),
            sum(
                1
                for r in self._seat(company, seat, now)
                if r.vector is not None
                and r.note.embedding_model == model
                and r.note.embedding_dims == dims
                and not r.indexed
            ),
        )

    async def neighbours(
        self, company: str, seat: str, now: datetime, anchors: Sequence[Note], radius: int = 1
    ) -> list[Note]:
        notes = sorted((r.note for r in self._seat(company, seat, now)), key=lambda n: (n.create_time, n.id))
        keys = [(n.create_time, n.id) for n in notes]
        out: dict[uuid.UUID, Note] = {}
        for a in anchors:
            before = [n for n, k in zip(notes, keys, strict=True) if k < (a.create_time, a.id)][-radius:]
            after = [n for n, k in zip(notes, keys, strict=True) if k > (a.create_time, a.id)][:radius]
            out.update((n.id, n) for n in [*before, *after])
        return list(out.values())

    async def exact(
        self, company: str, seat: str, now: datetime, vector: np.ndarray, model: str, limit: int
    ) -> list[tuple[Note, float]]:
        scored = [
            (r.note, cosine(r.vector, vector))
            for r in self._seat(company, seat, now)
            if r.vector is not None and r.note.embedding_model == model and r.vector.shape == vector.shape
        ]
        scored.sort(key=lambda p: -p[1])
        return scored[:limit]

    async def unreachable_by_vector(self, company: str, seat: str, now: datetime, model: str, dims: int) -> int:
        return sum(
            1
            for r in self._seat(company, seat, now)
            if r.vector is None or r.note.embedding_model != model or r.note.embedding_dims != dims
        )

    async def mark_used(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> int:
        marked = 0
        for r in self._seat(company, seat, now):
            if r.note.id in ids:
                r.note = dataclasses.replace(r.note, use_count=r.note.use_count + 1, last_used_time=now)
                marked += 1
        return marked

    def _listed(self, listing: NoteListing) -> list[Note]:
        return [
            r.note
            for r in self._seat(listing.company, listing.seat, listing.now)
            if listing.tier is None or r.note.tier is listing.tier
        ]

    async def count(self, listing: NoteListing) -> int:
        return len(self._listed(listing))

    async def page(self, listing: NoteListing, after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[Note]:
        notes = self._listed(listing)
        notes.sort(key=lambda n: (n.create_time, n.id), reverse=True)
        if after is not None:
            notes = [n for n in notes if (n.create_time, n.id) < after]
        return notes[:limit]

    async def delete(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> tuple[bool, int | None]:
        row = self.rows.get(note_id)
        if row is None or row.note.company != company or row.note.seat != seat:
            return False, None
        del self.rows[note_id]
        expire = row.note.expire_time
        return expire is None or expire > now, row.note.embedding_dims
