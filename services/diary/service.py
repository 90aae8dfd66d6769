"""Diary use cases: write, recall, mark used, read, list, delete.

Dependencies arrive as arguments (store, embedder, index, clock, config, events); the servicer
only translates protobuf to these calls and back.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from typing_extensions import TypeVar

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from libs.common.bounds import at_most_chars
from libs.common.config import DiaryConfig
from libs.common.contract import string_max_len
from libs.common.errors import InvalidArgument, InvalidFields, field_error, request_id_reused
from libs.common.not_found import require_found
from libs.common.request_rules import at_most, time_page
from libs.common.validation import (
    decode_time_cursor,
    optional_limit,
    page_size,
    require_id,
    require_ident,
    require_text,
    seat_ref,
)
from libs.common.vector_path import QueryEmbedding, VectorHalf
from libs.common.vector_service import AfterSearchReads, VectorRowService
from libs.common.vectorindex import NO_EXPIRY, IndexPoint, IndexUnavailable, collection_name
from services.diary.domain import (
    COLLECTION_BASE,
    DOMAIN,
    MAX_TTL_DAYS,
    WORK_KEYED_SOURCES,
    Candidate,
    Note,
    NoteProvenance,
    NoteSource,
    NoteTier,
    QueryVector,
    Recall,
    fused_scores,
    request_digest,
)
from services.diary.ports import EarlierWrite, NoteListing, NoteStore, VectorReads
from services.diary.store import PostgresNoteStore

REQUEST_ID_CHARS = string_max_len(diary_pb.WriteNoteRequest, "request_id")
"""The contract's bound: room for a worker's key, ``<work key (256) or run id>:<worker>``."""

__all__ = ["DiaryService", "index_point"]

_log = logging.getLogger(__name__)

# A note past its bound, in this service's words (libs.common.bounds).
_TOO_LONG = "{field} is {length} characters; a note holds at most {limit}"

S = TypeVar("S", bound=NoteStore, default=PostgresNoteStore)
"""The store: the port for the use cases; its deployment type for the passes, which also reach
its pool (``service.store.pool``)."""


def index_point(
    note_id: uuid.UUID, company: str, seat: str, vector: np.ndarray, model: str, expire_time: datetime | None
) -> IndexPoint:
    return IndexPoint(
        id=note_id,
        vector=vector,
        company=company,
        seat=seat,
        model=model,
        expire_at=expire_time.timestamp() if expire_time else NO_EXPIRY,
    )


@dataclass
class _SeatReads(AfterSearchReads[Note, VectorReads]):
    """The vector half's reads of one seat's live notes at ``now`` for one query vector."""

    store: NoteStore
    company: str
    seat: str
    now: datetime
    vector: QueryVector

    async def exact(self, vector: np.ndarray, model: str, limit: int) -> Sequence[tuple[Note, float]]:
        return await self.store.exact(self.company, self.seat, self.now, vector, model, limit)

    async def read_after_search(self, ids: Sequence[uuid.UUID]) -> VectorReads:
        v = self.vector
        return await self.store.hydrate_unreachable(
            self.company, self.seat, ids, self.now, v.model, int(v.values.shape[0])
        )


def _replayed(
    earlier: EarlierWrite, request_id: str, digest: bytes | None, source: NoteSource
) -> tuple[Note | None, str | None, bool]:
    """A write whose key was used before: the first write's answer when this is a retry of it (the
    same request; or a key claimed before digests were kept, whose request is unknown; or a writer
    that keys a unit of work), else REQUEST_ID_REUSED. Answering the first note would tell the
    caller its new content was saved when it was dropped (a provider reusing tool-call ids)."""
    if earlier.digest is not None and earlier.digest != digest and source not in WORK_KEYED_SOURCES:
        raise request_id_reused(
            request_id,
            f"request_id {request_id!r} was used for a different note of this seat; a retry sends the same"
            " content, tier, ttl_days, source and turn_id, a new note needs a new request_id",
            domain=DOMAIN,
        )
    return earlier.note, None, False


class DiaryService(VectorRowService[S, DiaryConfig]):
    collection_base = COLLECTION_BASE

    # ---------------------------------------------------------------- write

    async def write_note(
        self,
        company: str,
        seat: str,
        content: str,
        tier: NoteTier | None,
        ttl_days: int,
        source: NoteSource,
        turn_id: str | None,
        request_id: str | None = None,
        provenance: NoteProvenance | None = None,
    ) -> tuple[Note | None, str | None, bool]:
        """Store a note verbatim, with its ``provenance`` in the same commit; returns it, why it has
        no vector (when it has none), and whether this call created it (false: ``request_id`` named
        a note already written, whose provenance this call does not touch). The note is None when
        ``request_id`` named a note written before and deleted or erased since: nothing is written
        again, so a late retry never brings back what was removed. A SHORT note's key is spent until
        the note's expiry only: past it the key writes a new note (the note was over anyway).

        A key is a retry's: used before for a different request (content, tier, ttl_days, source
        or turn_id), it is refused (REQUEST_ID_REUSED), not answered with the first note while this
        call's content is dropped; except for the writers that key a unit of work
        (``WORK_KEYED_SOURCES``). The request is checked before its key is looked up, so an invalid
        request is refused whatever its key names."""
        # Every bad field is named at once (one INVALID_ARGUMENT, libs.common.errors.InvalidFields).
        found = InvalidFields()
        with found.check():
            require_ident(company, "company", domain=DOMAIN)
        with found.check():
            require_ident(seat, "seat", domain=DOMAIN)
        if request_id:
            with found.check():
                require_text(request_id, "request_id", domain=DOMAIN, max_chars=REQUEST_ID_CHARS)
        with found.check():
            # Refused, never trimmed: the writer can tighten the text and retry.
            at_most_chars(
                content,
                "content",
                self.config.max_content_chars,
                domain=DOMAIN,
                reason="NOTE_TOO_LONG",
                message=_TOO_LONG,
            )
            require_text(content, "content", domain=DOMAIN)
        if tier is None:
            found.add(
                field_error("tier", "FIELD_REQUIRED", "tier must be NOTE_TIER_LONG or NOTE_TIER_SHORT", domain=DOMAIN)
            )
        elif tier is NoteTier.SHORT:
            if not 1 <= ttl_days <= MAX_TTL_DAYS:
                found.add(
                    field_error(
                        "ttl_days",
                        "TTL_OUT_OF_RANGE",
                        f"a SHORT note needs ttl_days between 1 and {MAX_TTL_DAYS}, got {ttl_days}",
                        domain=DOMAIN,
                        value=ttl_days,
                        maximum=MAX_TTL_DAYS,
                    )
                )
        elif ttl_days:
            found.add(
                field_error(
                    "ttl_days",
                    "TTL_NOT_ALLOWED",
                    "a LONG note has no time to live; send ttl_days 0 or write a SHORT note",
                    domain=DOMAIN,
                    value=ttl_days,
                )
            )
        found.raise_any()
        assert tier is not None  # refused above
        digest = None
        if request_id:
            digest = request_digest(company, seat, content, tier, ttl_days, source, turn_id)
            earlier = await self.store.by_request(company, seat, request_id, self.clock.now())
            if earlier is not None:
                return _replayed(earlier, request_id, digest, source)
        now = self.clock.now()
        expire_time = now + timedelta(days=ttl_days) if tier is NoteTier.SHORT else None
        embedded = await self.embed_row(content)
        vector = embedded.values
        note = Note(
            id=uuid.uuid4(),
            company=company,
            seat=seat,
            content=content,
            tier=tier,
            source=source,
            turn_id=turn_id or None,
            create_time=now,
            expire_time=expire_time,
            embedding_model=embedded.model,
        )
        stored = await self.store.insert(note, vector, request_id or None, provenance, digest)
        if stored is None:  # a concurrent write with the same key won the insert
            earlier = await self.store.by_request(company, seat, request_id or "", now)
            assert earlier is not None and request_id
            return _replayed(earlier, request_id, digest, source)
        if vector is not None:
            point = index_point(
                stored.id, stored.company, stored.seat, vector, stored.embedding_model or "", stored.expire_time
            )
            await self.index_rows_together(point, "note")
        return stored, embedded.skipped_reason, True

    # ---------------------------------------------------------------- recall

    async def recall(
        self,
        company: str,
        seat: str,
        query: str,
        vector_limit: int | None,
        recency_limit: int | None,
        lexical_limit: int | None,
        query_vector: QueryVector | None,
        neighbour_limit: int | None = None,
    ) -> Recall:
        # Every bad field is named at once (one INVALID_ARGUMENT, libs.common.errors.InvalidFields).
        found = InvalidFields()
        with found.check():
            require_ident(company, "company", domain=DOMAIN)
        with found.check():
            require_ident(seat, "seat", domain=DOMAIN)
        cap = self.config.max_recall_limit

        def limit(value: int | None, field: str, default: int) -> int:
            try:
                return optional_limit(value, field, default=default, maximum=cap, domain=DOMAIN)
            except InvalidArgument as err:
                found.add(err)
                return default  # never used: raise_any below refuses the request

        k_vec = limit(vector_limit, "vector_limit", self.config.vector_limit)
        k_rec = limit(recency_limit, "recency_limit", self.config.recency_limit)
        k_lex = limit(lexical_limit, "lexical_limit", self.config.lexical_limit)
        k_nei = limit(neighbour_limit, "neighbour_limit", self.config.neighbour_limit)
        found.raise_any()
        now = self.clock.now()
        pool: dict[uuid.UUID, Candidate] = {}

        def add(note: Note, half: str, similarity: float = 0.0, rank: float = 0.0) -> None:
            cand = pool.setdefault(note.id, Candidate(note=note))
            cand.found_by.add(half)
            cand.similarity = max(cand.similarity, similarity)
            cand.lexical_rank = max(cand.lexical_rank, rank)

        async def vector() -> VectorHalf[Note]:
            if k_vec and (query_vector is not None or query.strip()):
                embedded = await self.embed_query(query, query_vector)
            else:
                embedded = QueryEmbedding.skipped()
            if embedded.vector is None:
                return VectorHalf(embedded.status)
            reads = _SeatReads(self.store, company, seat, now, embedded.vector)
            # The relevance floor of the query's model: the vector half offers what is related, not
            # merely the least unlike of the seat's notes (the recency half still brings the rules
            # that apply whatever the topic).
            return await self.seat_half(
                embedded,
                reads,
                company=company,
                seat=seat,
                now=now.timestamp(),
                limit=k_vec,
                unreachable=reads.unreachable,
                unindexed=reads.unindexed,
            )

        async def text_halves() -> tuple[list[tuple[Note, float]], list[Note]]:
            if k_lex and k_rec and query.strip():  # both: one statement
                return await self.store.lexical_recent(company, seat, now, query, k_lex, k_rec)
            lexical = await self.store.lexical(company, seat, now, query, k_lex) if k_lex and query.strip() else []
            return lexical, (await self.store.recent(company, seat, now, k_rec) if k_rec else [])

        # The halves are independent reads: run them at once (the embed overlaps the text halves).
        half, (lexical_hits, recent) = await asyncio.gather(vector(), text_halves())
        vector_hits = half.hits
        for note, sim in vector_hits:
            add(note, "vector", similarity=sim)
        for note, rank in lexical_hits:
            add(note, "lexical", rank=rank)
        for note in recent:
            add(note, "recency")
        if k_nei and (vector_hits or lexical_hits):
            # The neighbours half: what was written next to the best topical hits. It needs their
            # scores, so it is the one read that waits for the others (one statement).
            hits = [c for c in pool.values() if c.found_by & {"vector", "lexical"}]
            scored = sorted(
                zip(fused_scores(hits), hits, strict=True), key=lambda p: (-p[0], -p[1].note.create_time.timestamp())
            )
            for note in await self.store.neighbours(company, seat, now, [c.note for _, c in scored[:k_nei]]):
                add(note, "neighbour")

        def order(c: Candidate) -> tuple[int, float, float, float]:
            tier = (
                0
                if "vector" in c.found_by
                else (1 if "lexical" in c.found_by else (2 if "recency" in c.found_by else 3))
            )
            return (tier, -c.similarity, -c.lexical_rank, -c.note.create_time.timestamp())

        return Recall(sorted(pool.values(), key=order), half.status, half.source, half.unreachable, half.floor)

    # ---------------------------------------------------------------- uses

    async def mark_used(self, company: str, seat: str, note_ids: list[str]) -> int:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        at_most(note_ids, 500, "note_ids", domain=DOMAIN)
        ids = [require_id(v, f"note_ids[{i}]", domain=DOMAIN) for i, v in enumerate(note_ids)]
        if not ids:
            return 0
        # Shielded: a use the seat already benefited from is recorded even when the caller's turn
        # is finishing and it cancels the call.
        return await asyncio.shield(self.store.mark_used(company, seat, sorted(set(ids)), self.clock.now()))

    # ---------------------------------------------------------------- reads

    async def get(self, company: str, seat: str, note_id: str) -> Note:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        nid = require_id(note_id, "note_id", domain=DOMAIN)
        note = await self.store.get(company, seat, nid, self.clock.now())
        return require_found(note, "note", note_id, seat=seat, domain=DOMAIN)

    async def list_notes(
        self, company: str, seat: str, size: int, token: str, tier: NoteTier | None
    ) -> tuple[list[Note], str, int]:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        size = page_size(size, domain=DOMAIN)
        scope = {"company": company, "seat": seat, "tier": str(tier) if tier else None}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        listing = NoteListing(company, seat, self.clock.now(), tier)
        rows = await self.store.page(listing, after, size + 1)
        total = await self.store.count(listing)
        notes, next_token = time_page(rows, size, scope, lambda n: n.create_time, lambda n: n.id)
        return notes, next_token, total

    async def delete(self, company: str, seat: str, note_id: str) -> None:
        company, seat = seat_ref(company, seat, domain=DOMAIN)
        nid = require_id(note_id, "note_id", domain=DOMAIN)
        # A SHORT note past its expiry is gone to every read (GetNote, ListNotes, RecallNotes), so
        # it is NOT_FOUND here too; its row and point still go now rather than at the next sweep.
        live, dims = await self.store.delete(company, seat, nid, self.clock.now())
        if dims:
            try:
                await self.index.delete(collection_name(COLLECTION_BASE, dims), [nid])
            except IndexUnavailable as err:
                # A stale point is harmless: every hit is re-read from Postgres, which no longer
                # has the row; rebuild-index clears it.
                _log.warning("note %s deleted; its point stays in the index until a rebuild: %s", nid, err)
        require_found(live or None, "note", note_id, seat=seat, domain=DOMAIN)
