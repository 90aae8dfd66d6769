"""In-memory stand-ins for the vector fill's ports (unit tier): the bookkeeping store
(:class:`MemoryFillLedger`, what ``FILL_SQL`` does in Postgres), one row family
(:class:`MemoryFillSource`, what ``TableFillSource`` does on a table) and a scriptable embedder.

They keep the SQL's rules, not its mechanics: a byte charge that would pass the limit charges
nothing; a held row is invisible while its hold lasts under the same provider fingerprint; a
store clears the hold; kept pieces of another fingerprint or text are dropped on the next keep.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from libs.common.embeddings import EmbeddingError, EmbeddingRefused, Vector
from libs.common.fill import FillRow, FillState
from tests.unit.fakes.embedder import HashingEmbedder

__all__ = ["MemoryFillLedger", "MemoryFillSource", "ScriptedFillEmbedder"]

_GLOBAL = "*"


class MemoryFillLedger:
    def __init__(self) -> None:
        self.states: dict[tuple[str, str], FillState] = {}
        self.spent: dict[tuple[str, datetime], int] = {}
        self.pieces: dict[tuple[str, uuid.UUID], dict[int, tuple[str, str, np.ndarray]]] = {}

    async def state(self, source: str, company: str) -> FillState | None:
        return self.states.get((source, company))

    async def set_cursor(self, source: str, company: str, seat: str | None) -> None:
        old = self.states.get((source, company), FillState())
        self.states[(source, company)] = replace(old, cursor_seat=seat)

    async def pause(self, until: datetime, fingerprint: str) -> None:
        old = self.states.get((_GLOBAL, _GLOBAL), FillState())
        self.states[(_GLOBAL, _GLOBAL)] = replace(old, paused_until=until, paused_fingerprint=fingerprint)

    async def spend_bytes(self, company: str, window: datetime, size: int, limit: int) -> bool:
        spent = self.spent.get((company, window), 0)
        if spent + size > limit:
            return False
        self.spent[(company, window)] = spent + size
        return True

    async def bytes_spent(self, company: str, window: datetime) -> int:
        return self.spent.get((company, window), 0)

    async def kept_pieces(self, source: str, row: uuid.UUID, fp: str, digest: str) -> list[np.ndarray]:
        kept: list[np.ndarray] = []
        stored = self.pieces.get((source, row), {})
        for piece in sorted(stored):
            p_fp, p_digest, vector = stored[piece]
            if (p_fp, p_digest) != (fp, digest):
                continue
            if piece != len(kept):
                break
            kept.append(vector)
        return kept

    async def keep_pieces(
        self, source: str, row: uuid.UUID, fp: str, digest: str, start: int, vectors: list[np.ndarray]
    ) -> None:
        stored = self.pieces.setdefault((source, row), {})
        for piece in [p for p, (p_fp, p_digest, _) in stored.items() if (p_fp, p_digest) != (fp, digest)]:
            del stored[piece]
        for i, vector in enumerate(vectors):
            stored[start + i] = (fp, digest, vector.astype(np.float32))

    async def drop_pieces(self, source: str, row: uuid.UUID) -> None:
        self.pieces.pop((source, row), None)


@dataclass
class _Entry:
    row: FillRow
    vector: Vector | None = None
    held_until: datetime | None = None
    held_fingerprint: str | None = None
    alone: bool = False


class MemoryFillSource:
    """A row family in memory: rows wait until a vector of the embedder's model is stored."""

    def __init__(self, name: str = "notes") -> None:
        self.name = name
        self.entries: dict[uuid.UUID, _Entry] = {}

    def add(self, company: str, seat: str, text: str) -> uuid.UUID:
        row_id = uuid.uuid4()
        self.entries[row_id] = _Entry(FillRow(row_id, company, seat, text))
        return row_id

    def _pending(self, model: str, fingerprint: str, now: datetime) -> list[_Entry]:
        def waits(e: _Entry) -> bool:
            held = e.held_until is not None and e.held_until > now and e.held_fingerprint == fingerprint
            return (e.vector is None or e.vector.model != model) and not held

        return sorted((e for e in self.entries.values() if waits(e)), key=lambda e: (e.row.company, e.row.seat))

    async def companies(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        return sorted({e.row.company for e in self._pending(model, fingerprint, now)})

    async def seats(self, company: str, model: str, dims: int | None, fingerprint: str, now: datetime) -> list[str]:
        return sorted({e.row.seat for e in self._pending(model, fingerprint, now) if e.row.company == company})

    async def backlog(self, model: str, dims: int | None, fingerprint: str, now: datetime) -> int:
        return len(self._pending(model, fingerprint, now))

    async def pending(
        self, company: str, seat: str, model: str, dims: int | None, fingerprint: str, now: datetime, limit: int
    ) -> list[FillRow]:
        mine = [e for e in self._pending(model, fingerprint, now) if (e.row.company, e.row.seat) == (company, seat)]
        return [replace(e.row, alone=e.alone and e.held_fingerprint == fingerprint) for e in mine[:limit]]

    async def store_vector(self, row: FillRow, vector: Vector) -> None:
        entry = self.entries[row.id]
        entry.vector, entry.held_until, entry.held_fingerprint, entry.alone = vector, None, None, False

    async def hold(self, row: FillRow, until: datetime, fingerprint: str, alone: bool) -> None:
        entry = self.entries[row.id]
        entry.held_until, entry.held_fingerprint, entry.alone = until, fingerprint, alone

    def vector(self, row_id: uuid.UUID) -> Vector | None:
        return self.entries[row_id].vector


class ScriptedFillEmbedder(HashingEmbedder):
    """The hashing embedder with a script: ``refused`` words make a request that carries them a
    refusal of the input (``EmbeddingRefused``), ``void`` words give their piece no direction,
    ``failure`` makes every request raise, and ``piece_words`` splits a text into pieces of that
    many words. ``requests`` records every request's pieces, in order."""

    def __init__(self, model: str = "hash-64", piece_words: int = 0) -> None:
        super().__init__(model)
        self.refused: set[str] = set()
        self.void: set[str] = set()
        self.piece_words = piece_words
        self.requests: list[list[str]] = []

    def split(self, text: str) -> list[str]:
        words = text.split()
        if not self.piece_words or len(words) <= self.piece_words:
            return [text]
        n = self.piece_words
        return [" ".join(words[i : i + n]) for i in range(0, len(words), n)]

    async def split_async(self, text: str) -> list[str]:
        return self.split(text)

    async def embed_pieces(self, pieces: Sequence[str]) -> list[np.ndarray]:
        self.requests.append(list(pieces))
        if self.failure is not None:
            raise self.failure
        if any(w in self.refused for p in pieces for w in p.split()):
            raise EmbeddingRefused("input refused")
        out = await super().embed_pieces(pieces)
        voided = [any(w in self.void for w in p.split()) for p in pieces]
        return [np.zeros_like(v) if void else v for v, void in zip(out, voided, strict=True)]

    def fail(self, error: EmbeddingError | None) -> None:
        self.failure = error
