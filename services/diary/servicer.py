"""DiaryService over gRPC: protobuf in, domain calls, protobuf out. No rules live here: the
request's limits and enums are checked at the edge against its contract (diary_service.proto), so
an undefined tier never reaches ``_TIER_FROM_PB`` (ListNotes tier 99 once listed both tiers)."""

from __future__ import annotations

from typing import Any

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from libs.common.enum_maps import enum_to_pb
from libs.common.erasure import provenance_json, provenance_subjects
from libs.common.erasure_rpcs import ErasureRpcs, indexed_erasure
from libs.common.field_copy import pb_fields
from libs.common.protoconv import query_vector
from libs.common.rpctypes import ServicerContext
from libs.common.search_answer import hit_fields, search_path_fields
from services.diary import erasure as _erasure
from services.diary.domain import DOMAIN, Note, NoteProvenance, NoteSource, NoteTier
from services.diary.domain import DOMAIN as _ERASURE_DOMAIN
from services.diary.service import DiaryService

__all__ = ["DiaryServicer", "note_to_pb"]

_TIER_TO_PB = enum_to_pb(NoteTier, pb.NoteTier, "NOTE_TIER")
_TIER_FROM_PB = {v: k for k, v in _TIER_TO_PB.items()}
_SOURCE_TO_PB = enum_to_pb(NoteSource, pb.NoteSource, "NOTE_SOURCE")
_SOURCE_FROM_PB = {v: k for k, v in _SOURCE_TO_PB.items()}
_HALF = {
    "vector": pb.RECALL_HALF_VECTOR,
    "recency": pb.RECALL_HALF_RECENCY,
    "lexical": pb.RECALL_HALF_LEXICAL,
    "neighbour": pb.RECALL_HALF_NEIGHBOUR,
}


def note_to_pb(note: Note) -> pb.Note:
    return pb.Note(**_note_fields(note))


def _note_fields(note: Note) -> dict[str, Any]:
    """A note's message as its fields, for a response to build in place (a recall nests ~114)."""
    return pb_fields(
        pb.Note,
        note,
        "id company seat content turn_id create_time expire_time use_count last_used_time embedding_model",
        tier=_TIER_TO_PB[note.tier],
        source=_SOURCE_TO_PB[note.source],
        embedding_dimensions=note.embedding_dims,
    )


class DiaryServicer(ErasureRpcs, pb_grpc.DiaryServiceServicer):
    def __init__(self, service: DiaryService):
        self._service = service
        self._erasure_calls = indexed_erasure(_erasure, lambda: service, domain=_ERASURE_DOMAIN, pb=pb)

    async def WriteNote(self, request: pb.WriteNoteRequest, context: ServicerContext) -> pb.WriteNoteResponse:
        kept = None
        if request.HasField("provenance"):  # issue 17: where it came from, committed with it
            kept = NoteProvenance(provenance_subjects(request.provenance), provenance_json(request.provenance))
        note, skipped, created = await self._service.write_note(
            request.company,
            request.seat,
            request.content,
            _TIER_FROM_PB.get(request.tier),
            request.ttl_days,
            _SOURCE_FROM_PB.get(request.source, NoteSource.UNSPECIFIED),
            request.turn_id,
            request.request_id or None,
            kept,
        )
        if note is None:
            # The key named a note written before and removed since: nothing is written again.
            return pb.WriteNoteResponse(created=False, note_removed=True)
        if kept is not None and not created:
            # A retried write: the note an earlier call stored. An earlier server kept its
            # provenance in a second statement that a crash could have missed; keep it now (once).
            await _erasure.record_provenance(
                self._service.store.pool, note.id, request.provenance, self._service.clock.now()
            )
        return pb.WriteNoteResponse(note=_note_fields(note), embedding_skipped_reason=skipped or "", created=created)

    async def RecallNotes(self, request: pb.RecallNotesRequest, context: ServicerContext) -> pb.RecallNotesResponse:
        recall = await self._service.recall(
            request.company,
            request.seat,
            request.query,
            request.vector_limit if request.HasField("vector_limit") else None,
            request.recency_limit if request.HasField("recency_limit") else None,
            request.lexical_limit if request.HasField("lexical_limit") else None,
            query_vector(request.query_embedding, domain=DOMAIN) if request.HasField("query_embedding") else None,
            request.neighbour_limit if request.HasField("neighbour_limit") else None,
        )
        return pb.RecallNotesResponse(
            candidates=[
                pb.RecallCandidate(note=_note_fields(c.note), **hit_fields(c, _HALF)) for c in recall.candidates
            ],
            **search_path_fields(recall),
        )

    async def MarkNotesUsed(
        self, request: pb.MarkNotesUsedRequest, context: ServicerContext
    ) -> pb.MarkNotesUsedResponse:
        marked = await self._service.mark_used(request.company, request.seat, list(request.note_ids))
        return pb.MarkNotesUsedResponse(marked_count=marked)

    async def GetNote(self, request: pb.GetNoteRequest, context: ServicerContext) -> pb.GetNoteResponse:
        note = await self._service.get(request.company, request.seat, request.note_id)
        return pb.GetNoteResponse(note=_note_fields(note))

    async def ListNotes(self, request: pb.ListNotesRequest, context: ServicerContext) -> pb.ListNotesResponse:
        notes, token, total = await self._service.list_notes(
            request.company, request.seat, request.page_size, request.page_token, _TIER_FROM_PB.get(request.tier)
        )
        return pb.ListNotesResponse(notes=[_note_fields(n) for n in notes], next_page_token=token, total_size=total)

    async def DeleteNote(self, request: pb.DeleteNoteRequest, context: ServicerContext) -> pb.DeleteNoteResponse:
        await self._service.delete(request.company, request.seat, request.note_id)
        return pb.DeleteNoteResponse()

    # ------------------------------------------------------------------ erasure (issue 17)

    async def GetNoteProvenance(
        self, request: pb.GetNoteProvenanceRequest, context: ServicerContext
    ) -> pb.GetNoteProvenanceResponse:
        service = self._service
        found = await _erasure.provenance(
            service.store.pool, request.company, request.seat, request.note_id, service.clock.now()
        )
        return pb.GetNoteProvenanceResponse(provenance=found)
