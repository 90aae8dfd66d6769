"""Episode use cases: record, search, list, get, mark consolidated, list seats.

Dependencies arrive as arguments (store, embedder, index, clock, config, events); the servicer
only translates protobuf to these calls and back. The lifecycle pass is in ``lifecycle.py``, the
fill and the index passes in ``passes.py``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
from typing_extensions import TypeVar

from libs.common import vector_rows
from libs.common.auth import current_principal
from libs.common.config import EpisodesConfig
from libs.common.errors import field_error
from libs.common.events import bookkeeping
from libs.common.not_found import require_found
from libs.common.request_rules import at_most, time_page
from libs.common.validation import (
    decode_page_token,
    decode_time_cursor,
    encode_page_token,
    optional_limit,
    page_size,
    require_id,
    require_ident,
    require_text,
    seat_ref,
)
from libs.common.vector_path import InlineEmbedding, VectorHalf
from libs.common.vector_service import AfterSearchReads, VectorRowService
from libs.common.vectorindex import IndexPoint, VectorIndex
from services.episodes.domain import (
    COLLECTION_BASE,
    DOMAIN,
    LIST_PAGE_DEFAULT,
    LIST_PAGE_MAX,
    MAX_IDS_PER_CALL,
    MAX_SEARCH_LIMIT,
    SEATS_PAGE_DEFAULT,
    SEATS_PAGE_MAX,
    WORK_ITEM_BACKENDS,
    Episode,
    EpisodeFilter,
    EpisodeKind,
    Hit,
    QueryVector,
    Search,
    Sender,
    TurnOutcome,
    label_names_run_id,
    vector_text,
)
from services.episodes.ports import EpisodeStore, RawRows, SearchReads, Superseded
from services.episodes.store import Dropped, PostgresEpisodeStore

__all__ = ["EpisodeService", "Recorded", "TurnRecord", "drop_points", "index_point"]

_log = logging.getLogger(__name__)

_RECORD_ATTEMPTS = 3
"""How many times a record reads and decides, losing its write to concurrent records in between: an
insert lost to the work's self_iterate round, then that row's supersede lost to another settled
record, then the answer (that record's row). A fourth is a row deleted meanwhile too: an error."""

S = TypeVar("S", bound=EpisodeStore, default=PostgresEpisodeStore)
"""The store: the port for the use cases; its deployment type for the lifecycle and the passes,
which reach further into it (``service.store.pool``, ``drop``, ``fold``)."""


def index_point(
    episode_id: uuid.UUID, company: str, seat: str, outcome: str, vector: np.ndarray, model: str
) -> IndexPoint:
    """A raw row's point. ``kind: raw`` is on every point and every search filters on it, so even a
    point written by mistake for another kind could never be a similarity hit."""
    return IndexPoint(
        id=episode_id,
        vector=vector,
        company=company,
        seat=seat,
        model=model,
        labels={"kind": str(EpisodeKind.RAW), "outcome": outcome},
    )


async def drop_points(index: VectorIndex, gone: Sequence[Dropped]) -> None:
    """Remove deleted rows' points (best effort: every hit is re-read from Postgres anyway)."""
    await vector_rows.drop_points(index, COLLECTION_BASE, [(d.id, d.dims) for d in gone], "deleted episodes")


@dataclass(frozen=True)
class TurnRecord:
    """What RecordEpisode is told about one turn: settled, or one self_iterate round of it."""

    company: str
    seat: str
    turn_id: str
    outcome: TurnOutcome | None
    start_time: datetime | None
    end_time: datetime | None
    label: str = ""
    ask: str = ""
    what_it_did: str = ""
    role: str = ""
    work_item: str = ""
    review_outcome: str = ""
    tool_sequence: tuple[str, ...] = ()
    tools_called: tuple[str, ...] = ()
    skills_used: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    conversation_id: str = ""
    work_key: str = ""
    senders: tuple[Sender, ...] = ()
    """The same senders, one per person, each identifier in its field (the row's provenance)."""


@dataclass(frozen=True)
class Recorded:
    """What RecordEpisode did: the row, whether this call wrote it (inserted it, or settled a
    self_iterate row of its run or work with it: ``created``, same id as that row), why it has no
    vector, and whether the run was collapsed into a settled row of the same work recorded under
    another run id (nothing written)."""

    episode: Episode
    created: bool
    skipped: str | None = None
    collapsed: bool = False


def _identifiers(senders: Sequence[Sender], known: Sequence[str]) -> list[str]:
    """The senders' identifiers ``known`` does not hold yet, once each."""
    ids = dict.fromkeys(x for s in senders for x in (s.handle, s.external_id) if x)
    return [x for x in ids if x not in set(known)]


def _names(values: Sequence[str], field: str) -> tuple[str, ...]:
    for i, v in enumerate(values):
        if not v or not v.strip():
            raise field_error(f"{field}[{i}]", "FIELD_REQUIRED", f"{field}[{i}] is empty", domain=DOMAIN)
    return tuple(values)


@dataclass
class _SeatReads(AfterSearchReads[Episode, SearchReads]):
    """The vector half's reads of one seat's raw rows (of one outcome, when given) for one query
    vector; the read after the index search also brings the lexical half (``after.lexical``)."""

    store: EpisodeStore
    rows: RawRows
    vector: QueryVector
    query: str
    lexical_limit: int

    async def exact(self, vector: np.ndarray, model: str, limit: int) -> Sequence[tuple[Episode, float]]:
        return await self.store.exact(self.rows, vector, model, limit)

    async def read_after_search(self, ids: Sequence[uuid.UUID]) -> SearchReads:
        v = self.vector
        return await self.store.search_reads(self.rows, v.values, v.model, ids, self.query, self.lexical_limit)


class EpisodeService(VectorRowService[S, EpisodesConfig]):
    collection_base = COLLECTION_BASE

    # ---------------------------------------------------------------- record

    def _validate(self, rec: TurnRecord) -> None:
        require_text(rec.turn_id, "turn_id", domain=DOMAIN, max_chars=200)
        require_text(rec.label, "label", domain=DOMAIN)
        if label_names_run_id(rec.label, rec.turn_id):
            # The label names what woke the turn (a schedule's name), never the fire's run id,
            # which differs on every fire and makes two fires of one schedule unalike.
            raise field_error(
                "label",
                "LABEL_NAMES_RUN_ID",
                f"label names the turn's own run id {rec.turn_id!r}; a scheduled turn's label names its schedule",
                domain=DOMAIN,
                turn_id=rec.turn_id,
            )
        if rec.outcome is None:
            raise field_error(
                "outcome",
                "FIELD_REQUIRED",
                "outcome is required (DONE, FAILED, SELF_ITERATE or SKIPPED)",
                domain=DOMAIN,
            )
        if rec.start_time is None:
            raise field_error("start_time", "FIELD_REQUIRED", "start_time is required", domain=DOMAIN)
        if rec.end_time is None:
            raise field_error("end_time", "FIELD_REQUIRED", "end_time is required", domain=DOMAIN)
        if rec.end_time < rec.start_time:
            raise field_error(
                "end_time",
                "END_BEFORE_START",
                "end_time is before start_time",
                domain=DOMAIN,
                start_time=rec.start_time.isoformat(),
                end_time=rec.end_time.isoformat(),
            )
        if rec.work_item:
            backend, _, ref = rec.work_item.partition(":")
            if backend not in WORK_ITEM_BACKENDS or not ref.strip():
                raise field_error(
                    "work_item",
                    "FIELD_INVALID",
                    f"work_item {rec.work_item[:100]!r} is not a backend-qualified ref "
                    f"({', '.join(b + ':<id>' for b in WORK_ITEM_BACKENDS)})",
                    domain=DOMAIN,
                    value=rec.work_item[:100],
                    backends=",".join(WORK_ITEM_BACKENDS),
                )
        if rec.role:
            require_ident(rec.role, "role", domain=DOMAIN)
        for i, sender in enumerate(rec.senders):
            if not (sender.handle or sender.external_id):
                raise field_error(
                    f"senders[{i}]",
                    "FIELD_REQUIRED",
                    f"senders[{i}] needs a handle or an external id",
                    domain=DOMAIN,
                )

    async def record(self, rec: TurnRecord) -> Recorded:
        """Store one raw row. Idempotent on the run id; and one row per work key: a redelivered
        trigger, which runs again under a new run id, is collapsed into the row its work already
        has (spec gate 5: "what collapses THAT is the episode row's own work-key index"), so the
        same work is one turn to every read, profile and compaction. The first execution's row
        stands; the redelivery's run id is filed under it.

        Except over a mid-state: a self_iterate row is work the agent itself judged incomplete, and
        the turn emits another turn_completed when it settles (spec, 6. Refiner), mostly under the
        same run id and always under the same work key. The first record of that run or work whose
        outcome is not self_iterate supersedes the row (:meth:`_write`): same id, the settled
        record's account and a vector of its text — so the turn reaches the clustered synthesis and
        outlives the 14-day drop of mid-states. A settled row is never changed by a later record."""
        company, seat = seat_ref(rec.company, rec.seat, domain=DOMAIN)
        self._validate(rec)
        rec = replace(
            rec,
            tool_sequence=_names(rec.tool_sequence, "tool_sequence"),
            tools_called=_names(rec.tools_called, "tools_called"),
            # Every sender's identifiers are among the row's subjects, however the caller spelt
            # them: an erasure finds the row by its subjects.
            subjects=(*rec.subjects, *_identifiers(rec.senders, rec.subjects)),
        )
        settles = rec.outcome is not TurnOutcome.SELF_ITERATE
        embedded: InlineEmbedding | None = None  # embedded once, however many times the race is lost
        for _ in range(_RECORD_ATTEMPTS):
            # The run id's row and the work key's, in one read (a new turn's record is this read, the
            # embed, the insert and the index mark).
            existing, same_work = await self.store.prior(company, seat, rec.turn_id, rec.work_key or None)
            prior = existing if existing is not None else same_work
            if prior is not None and not (settles and prior.outcome is TurnOutcome.SELF_ITERATE):
                if existing is not None:
                    return Recorded(existing, False, collapsed=existing.turn_id != rec.turn_id)
                return await self._collapse(company, seat, rec, prior)
            if embedded is None:
                embedded = await self.embed_row(vector_text(rec.label, rec.ask, rec.what_it_did))
            written = await self._write(company, seat, rec, embedded, prior)
            if written is not None:
                return written
            # A concurrent record won: the insert (a row of this run id or work key now exists) or
            # the supersede (the mid-state was settled, or dropped, meanwhile). Decide again
            # against what it left: the same run's row is the record, the same work's collapses
            # this run into it, a mid-state is superseded, nothing is inserted.
        raise RuntimeError(f"episode of {rec.turn_id}: lost the write to concurrent records {_RECORD_ATTEMPTS} times")

    async def _write(
        self, company: str, seat: str, rec: TurnRecord, embedded: InlineEmbedding, mid_state: Episode | None
    ) -> Recorded | None:
        """Write the record: insert its row, or supersede ``mid_state`` (the self_iterate row of
        its run or work) with it; then index the vector and announce the row, the same either way.
        ``None`` when a concurrent record won the write."""
        assert rec.start_time is not None and rec.end_time is not None and rec.outcome is not None
        vector, skipped = embedded.values, embedded.skipped_reason
        episode = Episode(
            id=uuid.uuid4(),
            company=company,
            seat=seat,
            kind=EpisodeKind.RAW,
            outcome=rec.outcome,
            start_time=rec.start_time,
            end_time=rec.end_time,
            turn_id=rec.turn_id,
            role=rec.role or None,
            work_item=rec.work_item or None,
            label=rec.label,
            ask=rec.ask,
            what_it_did=rec.what_it_did,
            review_outcome=rec.review_outcome,
            tool_sequence=tuple(rec.tool_sequence),
            tools_called=tuple(rec.tools_called),
            skills_used=tuple(rec.skills_used),
            subjects=tuple(rec.subjects),
            conversation_id=rec.conversation_id or None,
            duration_ms=int((rec.end_time - rec.start_time).total_seconds() * 1000),
            embedding_model=embedded.model,
            work_key=rec.work_key or None,
        )
        stale_dims: int | None = None
        now = self.clock.now()
        # The spec's episode_written: one per row the turn's record wrote, a mid-state's settling
        # included (a repeat or a collapsed redelivery writes none). Announced on the write itself:
        # the Postgres store inserts it in the statement that writes the row, only if the row is
        # written (one commit for both), so no crash between two commits can lose it — an event
        # emitted after the row's commit was lost for good to a crash before it, as the retry finds
        # the row (a repeat: no event). A store that does not carry it leaves it to be emitted here.
        written: dict[str, Any] = {
            "company": company,
            "seat": seat,
            "turn_id": rec.turn_id,
            "episode_id": str(mid_state.id if mid_state is not None else episode.id),
            "episode_kind": str(EpisodeKind.RAW),
            "outcome": str(rec.outcome),
            "work_key": rec.work_key or None,
            "embedding_model": embedded.model if vector is not None else None,
            "embedding_skipped_reason": skipped,
            "superseded": mid_state is not None,
        }
        superseded: Superseded | None = None
        with bookkeeping() as batch:
            batch.announce("episode_written", now, **written)
            try:
                if mid_state is None:
                    stored = await self.store.insert_raw(episode, vector, now, rec.senders)
                else:
                    superseded = await self.store.supersede(mid_state.id, episode, vector, now, rec.senders)
                    stored = superseded.episode if superseded is not None else None
            finally:
                unwritten = batch.withdraw()
        if stored is None:
            return None
        if unwritten:
            await self.events.emit("episode_written", **written)
        if superseded is not None:
            # The mid-state's point is of its old text: overwritten below when the new vector has
            # its width, else dropped (the fill embeds the new text and indexes it).
            if superseded.previous_dims and (vector is None or int(vector.shape[0]) != superseded.previous_dims):
                stale_dims = superseded.previous_dims
            _log.info(
                "episode %s of %s/%s (run %s) settled %s by run %s",
                stored.id,
                company,
                seat,
                stored.turn_id,
                stored.outcome,
                rec.turn_id,
            )
        # A failure to index fails this call after the row and its event are in; the index is the
        # fill pass's to complete (the row stays ``indexed = false``).
        if vector is not None:
            point = index_point(
                stored.id, stored.company, stored.seat, str(stored.outcome), vector, stored.embedding_model or ""
            )
            await self.index_row(point, "episode")
        if stale_dims is not None:
            await drop_points(self.index, [Dropped(stored.id, stale_dims)])
        return Recorded(stored, True, skipped)

    async def _collapse(self, company: str, seat: str, rec: TurnRecord, row: Episode) -> Recorded:
        await self.store.alias_run(company, seat, rec.turn_id, row.id, self.clock.now())
        _log.info(
            "episode of %s/%s run %s collapsed into %s (work key %r, first run %s)",
            company,
            seat,
            rec.turn_id,
            row.id,
            rec.work_key,
            row.turn_id,
        )
        return Recorded(row, False, collapsed=True)

    # ---------------------------------------------------------------- search

    async def search(
        self,
        company: str,
        seat: str,
        query: str,
        limit: int,
        lexical_limit: int | None,
        outcome: TurnOutcome | None,
        query_vector: QueryVector | None,
    ) -> Search:
        """Raw rows by similarity to ``query`` (the query's model only), unioned with a lexical
        half. A compacted row is never a hit: it has no vector, its points do not exist, the index
        filter and both SQL halves say ``kind = 'raw'``."""
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        # The same range check as the lexical knob's; 0 here means the configured default.
        k_vec = optional_limit(limit, "limit", default=0, maximum=MAX_SEARCH_LIMIT, domain=DOMAIN)
        k_vec = k_vec or self.config.search_limit
        k_lex = optional_limit(lexical_limit, "lexical_limit", default=k_vec, maximum=MAX_SEARCH_LIMIT, domain=DOMAIN)
        if not query.strip() and query_vector is None:
            raise field_error(
                "query",
                "FIELD_REQUIRED",
                "query (or query_embedding) is required; read recent turns with ListEpisodes",
                domain=DOMAIN,
            )
        hits: dict[uuid.UUID, Hit] = {}
        raw = RawRows(company, seat, outcome)

        embedded = await self.embed_query(query, query_vector)
        labels = {"kind": str(EpisodeKind.RAW)}
        if outcome is not None:
            labels["outcome"] = str(outcome)
        lexical_query = query if k_lex and query.strip() else ""
        half: VectorHalf[Episode] = VectorHalf(embedded.status)
        reads = None
        if embedded.vector is not None:
            reads = _SeatReads(self.store, raw, embedded.vector, lexical_query, k_lex if lexical_query else 0)
            # The relevance floor of the query's model: a hit below it is not related (its top-K
            # place is only the least unlike of unrelated rows), so it is not a hit at all — the
            # seat is not shown an unrelated turn as similar, and an empty answer can say "this is
            # new work".
            half = await self.seat_half(
                embedded,
                reads,
                company=company,
                seat=seat,
                now=self.clock.now().timestamp(),
                limit=k_vec,
                labels=labels,
                unreachable=reads.unreachable,
                unindexed=reads.unindexed,
            )
        floor = half.floor
        for ep, sim in half.hits:
            hit = hits.setdefault(ep.id, Hit(ep))
            hit.found_by.add("vector")
            hit.similarity = sim
        if lexical_query:
            # Read with the vector half's rows when there is a query vector, else alone.
            lexical = reads.after.lexical if reads and reads.after else await self.store.lexical(raw, query, k_lex)
            for ep, rank, lexical_sim in lexical:
                # A word in common is not relatedness: a lexical hit whose meaning can be compared
                # (its vector is of the query's model) is held to the same floor. One the fill has
                # not reached yet can only be found this way, and is kept.
                if floor is not None and lexical_sim is not None and lexical_sim < floor and ep.id not in hits:
                    continue
                hit = hits.setdefault(ep.id, Hit(ep))
                hit.found_by.add("lexical")
                hit.lexical_rank = rank

        def order(h: Hit) -> tuple[int, float, float, float]:
            return (0 if "vector" in h.found_by else 1, -h.similarity, -h.lexical_rank, -h.episode.end_time.timestamp())

        return Search(sorted(hits.values(), key=order), half.status, half.source, half.unreachable, floor)

    # ---------------------------------------------------------------- reads

    async def get(self, company: str, seat: str, episode_id: str, turn_id: str) -> Episode:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        if bool(episode_id) == bool(turn_id):
            raise field_error(
                "episode_id",
                "ONE_OF_REQUIRED",
                "name the row by exactly one of episode_id and turn_id",
                domain=DOMAIN,
                fields="episode_id,turn_id",
            )
        if episode_id:
            ep = await self.store.get(company, seat, require_id(episode_id, "episode_id", domain=DOMAIN))
            key, value = "episode_id", episode_id
        else:
            ep = await self.store.get_by_turn(company, seat, turn_id)
            key, value = "turn_id", turn_id
        message = f"no episode with {key} {value} for seat {seat}"
        return require_found(ep, "episode", value, seat=seat, domain=DOMAIN, id_key=key, message=message)

    async def list_episodes(
        self, company: str, seat: str, size: int, token: str, f: EpisodeFilter
    ) -> tuple[list[Episode], str, int]:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        size = page_size(size, default=LIST_PAGE_DEFAULT, maximum=LIST_PAGE_MAX, domain=DOMAIN)
        if f.min_tool_calls < 0:
            raise field_error(
                "filter.min_tool_calls",
                "FIELD_INVALID",
                f"filter.min_tool_calls must not be negative, got {f.min_tool_calls}",
                domain=DOMAIN,
                value=f.min_tool_calls,
            )
        scope = {"company": company, "seat": seat, **f.scope()}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        read = await self.store.page(company, seat, f, after, size + 1)
        total = await self.store.count(company, seat, f)
        rows, next_token = time_page(read, size, scope, lambda e: e.end_time, lambda e: e.id)
        return rows, next_token, total

    async def mark_consolidated(self, company: str, seat: str, turn_ids: list[str], skill_id: str) -> int:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        require_text(skill_id, "skill_id", domain=DOMAIN, max_chars=200)
        at_most(turn_ids, MAX_IDS_PER_CALL, "turn_ids", domain=DOMAIN)
        for i, t in enumerate(turn_ids):
            require_text(t, f"turn_ids[{i}]", domain=DOMAIN, max_chars=200)
        if not turn_ids:
            return 0
        # Shielded like the diary's uses: a skill already drafted from these rows is recorded even
        # when the caller goes away mid-call.
        return await asyncio.shield(
            self.store.mark_consolidated(company, seat, sorted(set(turn_ids)), skill_id, self.clock.now())
        )

    async def list_seats(self, company: str, size: int, token: str) -> tuple[list[tuple[str, str]], str]:
        """Seats with raw rows. No company is every company for the services' own passes; a token
        names its own by naming none (the edge refused any other), and one bound to a seat or a
        user may not enumerate the company's seats at all."""
        principal = current_principal()
        principal.require_company_wide("listing the company's seats")
        if not company and principal.company is not None:
            company = principal.company
        if company:
            require_ident(company, "company", domain=DOMAIN)
        size = page_size(size, default=SEATS_PAGE_DEFAULT, maximum=SEATS_PAGE_MAX, domain=DOMAIN)
        scope = {"company": company or None}
        cursor = decode_page_token(token, scope, domain=DOMAIN)
        after = None
        if cursor is not None:
            try:
                after = (str(cursor["company"]), str(cursor["seat"]))
            except (KeyError, TypeError):
                raise field_error(
                    "page_token", "PAGE_TOKEN_INVALID", "page_token is not a token this service issued", domain=DOMAIN
                ) from None
        seats = await self.store.seats(company or None, after, size + 1)
        next_token = ""
        if len(seats) > size:
            seats = seats[:size]
            next_token = encode_page_token({"company": seats[-1][0], "seat": seats[-1][1]}, scope)
        return seats, next_token
