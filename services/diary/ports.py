"""The diary's store port: what :class:`services.diary.service.DiaryService` needs of its notes.

``PostgresNoteStore`` (``store.py``) is the deployment's; ``tests/unit/fakes/diary.py`` keeps notes
in memory for the unit tier. Times are passed in (the injected clock), never read by the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol

import numpy as np

from services.diary.domain import Note, NoteProvenance, NoteTier

__all__ = ["EarlierWrite", "NoteListing", "NoteStore", "VectorReads"]


@dataclass(frozen=True)
class NoteListing:
    """What ListNotes pages and counts: one seat's notes live at ``now``, of ``tier`` when given.
    One object for the port, the store and the fake, so the page and its total name the same rows."""

    company: str
    seat: str
    now: datetime
    tier: NoteTier | None = None


class VectorReads(NamedTuple):
    """The vector half's read after the index search: the hits' live notes, the count of live
    notes the query's model cannot reach, and the count of live notes with a vector of it that the
    index does not hold yet (``indexed = false``: while there are any, the exact scan answers)."""

    hits: dict[uuid.UUID, Note]
    unreachable: int
    unindexed: int


class EarlierWrite(NamedTuple):
    """What an idempotency key used before names: the note its write stored, or None when that
    note is gone (deleted, erased; or expired, until its expiry passes, when the key is free
    again): the key outlives its note, so a late retry never writes a removed note again. And
    the digest of the request that wrote it (``request_digest``), None for a key claimed before
    digests were kept."""

    note: Note | None
    digest: bytes | None = None


class NoteStore(Protocol):
    async def by_request(self, company: str, seat: str, request_id: str, now: datetime) -> EarlierWrite | None:
        """What an earlier write with this idempotency key stored (its note when live at ``now``);
        None when the key was never used, or its SHORT note's expiry is past at ``now``."""
        ...

    async def insert(
        self,
        note: Note,
        vector: np.ndarray | None,
        request_id: str | None = None,
        provenance: NoteProvenance | None = None,
        request_digest: bytes | None = None,
    ) -> Note | None:
        """The stored note, or ``None`` when ``request_id`` was already used (by a note stored, or
        gone since: the key is kept apart from the note and outlives it; a SHORT note's key until
        the note's expiry, past which it is claimed again). ``provenance`` is
        kept with the note, in the same transaction (a note is never stored without it);
        ``request_digest`` with the key, so a later use of it can be told a retry or not."""
        ...

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None: ...

    async def get(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> Note | None: ...

    async def hydrate(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> dict[uuid.UUID, Note]:
        """The live notes of these ids (a stale index point's id is simply absent)."""
        ...

    async def recent(self, company: str, seat: str, now: datetime, limit: int) -> list[Note]: ...

    async def lexical(self, company: str, seat: str, now: datetime, query: str, limit: int) -> list[tuple[Note, float]]:
        """Notes sharing words with ``query`` and their IDF-weighted rank, best first."""
        ...

    async def lexical_recent(
        self, company: str, seat: str, now: datetime, query: str, lexical_limit: int, recency_limit: int
    ) -> tuple[list[tuple[Note, float]], list[Note]]:
        """``lexical`` and ``recent`` at once (one round trip where the store can)."""
        ...

    async def hydrate_unreachable(
        self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime, model: str, dims: int
    ) -> VectorReads:
        """``hydrate``, ``unreachable_by_vector`` and the count of live notes with a vector of
        ``model`` and ``dims`` not in the index yet, at once (one round trip where the store can)."""
        ...

    async def neighbours(
        self, company: str, seat: str, now: datetime, anchors: Sequence[Note], radius: int = 1
    ) -> list[Note]:
        """The live notes written just before and just after each anchor."""
        ...

    async def exact(
        self, company: str, seat: str, now: datetime, vector: np.ndarray, model: str, limit: int
    ) -> list[tuple[Note, float]]:
        """The exact scan: the seat's live notes with a vector of ``model`` by cosine, best first."""
        ...

    async def unreachable_by_vector(self, company: str, seat: str, now: datetime, model: str, dims: int) -> int:
        """Live notes with no vector of ``model`` and width ``dims``."""
        ...

    async def mark_used(self, company: str, seat: str, ids: Sequence[uuid.UUID], now: datetime) -> int: ...

    async def count(self, listing: NoteListing) -> int: ...

    async def page(self, listing: NoteListing, after: tuple[datetime, uuid.UUID] | None, limit: int) -> list[Note]:
        """The listing's notes newest first, after the (create_time, id) cursor."""
        ...

    async def delete(self, company: str, seat: str, note_id: uuid.UUID, now: datetime) -> tuple[bool, int | None]:
        """Delete the note, live or expired at ``now`` and not swept yet; whether it was live (an
        expired note is gone to every read already), and the deleted row's vector width (its
        collection) when it had one."""
        ...
