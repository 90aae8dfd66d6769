"""The episodes store port: what :class:`services.episodes.service.EpisodeService`'s use cases
(record, search, list, get, mark consolidated, list seats) need of the rows.

``PostgresEpisodeStore`` (``store.py``) is the deployment's; ``tests/unit/fakes/episodes.py`` keeps
rows in memory for the unit tier. The lifecycle pass reaches further into the Postgres store and is
not behind this port.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np

from services.episodes.domain import Episode, EpisodeFilter, Sender, TurnOutcome

__all__ = ["EpisodeStore", "RawRows", "SearchReads", "Superseded"]


@dataclass(frozen=True)
class RawRows:
    """Which rows a search reads: one seat's raw rows, of ``outcome`` when given. One object for
    the port, the store and the fake, so the lexical half, the exact scan and the unreachable count
    read the same rows."""

    company: str
    seat: str
    outcome: TurnOutcome | None = None


@dataclass(frozen=True)
class SearchReads:
    """What a search reads of the table once its index search has answered (one read): the vector
    half's hits re-read, the lexical half, the count of rows the query's model cannot reach and the
    count of rows the index does not hold yet."""

    hits: dict[uuid.UUID, Episode]
    """The raw rows of the index hits' ids (a stale point's id is simply absent)."""
    lexical: list[tuple[Episode, float, float | None]]
    """As :meth:`EpisodeStore.lexical`, each hit's cosine to the query vector where comparable."""
    unreachable: int
    """Rows with no vector of the query's model and width."""
    unindexed: int
    """Rows with a vector of the query's model and width not in the index yet (``indexed = false``:
    written while it was down; while there are any, the exact scan answers)."""


@dataclass(frozen=True)
class Superseded:
    """A self_iterate row settled by a later record of its run or work (:meth:`EpisodeStore.supersede`)."""

    episode: Episode
    """The row as it now stands (its id, run id and work key unchanged)."""
    previous_dims: int | None
    """The width of the vector the row had before, if any: that point is of the old text."""


class EpisodeStore(Protocol):
    async def insert_raw(
        self, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Episode | None:
        """The stored row, or ``None`` when a row of the same run id or work key won the insert.
        ``senders``: the row's people as its provenance answers them (kept beside the row)."""
        ...

    async def get_by_work_key(self, company: str, seat: str, work_key: str) -> Episode | None: ...

    async def prior(
        self, company: str, seat: str, turn_id: str, work_key: str | None
    ) -> tuple[Episode | None, Episode | None]:
        """(``get_by_turn``, ``get_by_work_key`` when ``work_key`` is set), in one read."""
        ...

    async def alias_run(self, company: str, seat: str, turn_id: str, episode_id: uuid.UUID, now: datetime) -> None:
        """File another run id under a row (a redelivery of work already recorded)."""
        ...

    async def supersede(
        self, row_id: uuid.UUID, ep: Episode, vector: np.ndarray | None, now: datetime, senders: Sequence[Sender] = ()
    ) -> Superseded | None:
        """Settle the seat's self_iterate row ``row_id`` with ``ep``, a settled record of its run or
        work (the outcome, end, texts, tools, ``senders`` and the rest of the record; the earlier start; the
        vector, or none; its id and keys kept), and file ``ep.turn_id`` under it when it is another
        run's, at once; ``None`` when the row is no longer a self_iterate row (another record
        settled it first, or it is gone)."""
        ...

    async def mark_consolidated(
        self, company: str, seat: str, turn_ids: Sequence[str], skill_id: str, now: datetime
    ) -> int: ...

    async def get(self, company: str, seat: str, episode_id: uuid.UUID) -> Episode | None: ...

    async def get_by_turn(self, company: str, seat: str, turn_id: str) -> Episode | None:
        """The row of this run id, or of the row it was collapsed into."""
        ...

    async def lexical(self, rows: RawRows, query: str, limit: int) -> list[tuple[Episode, float, float | None]]:
        """``rows`` sharing words with ``query``, best first: (row, rank, None) — the search with no
        query vector (with one, :meth:`search_reads` reads the lexical half)."""
        ...

    async def search_reads(
        self, rows: RawRows, vector: np.ndarray, model: str, ids: Sequence[uuid.UUID], query: str, lexical_limit: int
    ) -> SearchReads:
        """In one read: the raw rows of ``ids``; the top ``lexical_limit`` of ``rows`` sharing words
        with ``query``, each with its cosine to ``vector`` when its vector is of ``model`` and the
        same width (else None); ``rows`` with no vector of ``model`` and that width; ``rows`` with
        one the index does not hold yet."""
        ...

    async def exact(self, rows: RawRows, vector: np.ndarray, model: str, limit: int) -> list[tuple[Episode, float]]:
        """The exact scan: ``rows`` with a vector of ``model`` by cosine, best first."""
        ...

    async def count(self, company: str, seat: str, f: EpisodeFilter) -> int: ...

    async def page(
        self, company: str, seat: str, f: EpisodeFilter, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[Episode]:
        """Rows by end_time newest first, after the (end_time, id) cursor."""
        ...

    async def seats(self, company: str | None, after: tuple[str, str] | None, limit: int) -> list[tuple[str, str]]:
        """Seats with raw rows, ordered by (company, seat), after the cursor."""
        ...

    async def set_indexed(self, ids: Sequence[uuid.UUID]) -> None: ...
