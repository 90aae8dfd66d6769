"""The writes of a learning check, each through the owning service's RPCs, each reported.

- A project lesson becomes a knowledge page in the workspace's container (``workspace:<name>``,
  read by every role that lists the workspace), titled from its normalized content, so identical
  normalized content reuses its page; its sources (session, check, event ids) are kept in
  ``workspace_lessons``, recorded (with the page id it reserves) before the page is written, so a
  fault after the write leaves no page that neither a receipt nor an erasure finds. A page stored
  without a vector is a partial failure (not indexed).
- Personal facts go through the memory judge (``judge``), then the embedding-backed dedup (a
  note of the seat at least ``personal_fact_duplicate_similarity`` similar is reused; a dedup that
  could not compare with every note — the query not embedded, notes without a vector of the current
  model — is the written note's ``NOT_DEDUPLICATED`` partial failure), then
  ``DiaryService.WriteNote`` with an idempotency key of the normalized content. Nothing is written
  when ``memory.extraction_cadence`` is off for the user or the company.
- A skill candidate becomes a proposal through ``SkillService.ProposeSkill`` (the duplicate
  checks and the rejection suppression live there), never a live skill.

Provenance (issue 17): a lesson's every source records the session, check, events, the turn, the
session's owner (whose messages taught it), the review's model and prompt version, and the writer;
``GetLessonProvenance`` reads them back. A personal fact's note carries the same as its
``Provenance`` (the model that wrote its content: the memory judge's), read by
``GetNoteProvenance``. A skill proposal's ``ProposalSource`` names the session, check, events and
turn (the skills service keeps it).

Knowledge and skill writes recheck the role's tool permission first (``write_knowledge``,
``distill_skill``): only ``allow`` lets the background worker write; ``ask`` and ``deny`` are
refused and the receipt says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from agentlearn.common.v1 import embedding_pb2, erasure_pb2, provenance_pb2
from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.knowledge.v1 import knowledge_service_pb2 as kb_pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from libs.common.auth import current_principal
from libs.common.auxmodel import (
    Attribution,
    AttributionMissing,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    NoAuxiliaryModel,
    Stage,
)
from libs.common.auxmodel.answers import InvalidOutput
from libs.common.clients import Clients
from libs.common.clock import Clock
from libs.common.config import Settings, workspace_container
from libs.common.not_found import require_found
from libs.common.validation import require_ident, require_page_id
from services.sessions import judge
from services.sessions.domain import (
    DOMAIN,
    Disposition,
    Dropped,
    FailureKind,
    LearningCheck,
    Output,
    OutputKind,
    PartialFailure,
)
from services.sessions.ports import SessionStore
from services.sessions.review import FactCandidate, LessonCandidate, SkillCandidate
from services.sessions.store import LessonRecord, PostgresSessionStore

__all__ = [
    "JUDGE_PROMPT_VERSION",
    "REVIEW_PROMPT_VERSION",
    "Origin",
    "Results",
    "Writer",
    "check_attribution",
    "lesson_provenance",
    "lesson_title",
    "prompt_version",
    "rpc_failure",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")

KNOWLEDGE_TOOL = "write_knowledge"
SKILL_TOOL = "distill_skill"
RECENT_NOTES_SHOWN = 50
"""The judge is shown the seat's recent notes, as the persist decider is (Diary.Recent, up to 50)."""
DEDUP_CANDIDATES = 5
WRITER = "session_check"
"""The writer a learning check's rows name in their provenance."""


def prompt_version(*texts: str) -> str:
    """A prompt's version: a digest of its text, as every owner's provenance records it (the
    reflector's workers use the same digest), so a change to the prompt is a new version."""
    return hashlib.sha256("\x1f".join(texts).encode()).hexdigest()[:16]


_PROMPTS = Path(__file__).resolve().parent / "prompts"
REVIEW_PROMPT_VERSION = prompt_version(
    *((_PROMPTS / f"session_review.{part}.md").read_text() for part in ("system", "user"))
)
"""The review's prompt (what proposes the lessons, facts and skill)."""
JUDGE_PROMPT_VERSION = prompt_version(
    REVIEW_PROMPT_VERSION, *((_PROMPTS / f"memory_judge.{part}.md").read_text() for part in ("system", "user"))
)
"""A personal fact passes the review and then the memory judge: both prompts shaped its text."""


@dataclass(frozen=True)
class Origin:
    """What produced a check's candidates: the review's model and prompt version."""

    model: str = ""
    prompt_version: str = REVIEW_PROMPT_VERSION


@dataclass
class Results:
    outputs: list[Output] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    failures: list[PartialFailure] = field(default_factory=list)


def rpc_failure(err: grpc.aio.AioRpcError) -> str:
    return f"{err.code().name}: {err.details() or ''}"[:500]


def lesson_title(text: str, content_hash: str) -> str:
    """A page title: the lesson's opening words and the hash of its normalized content. The hash
    keeps two lessons that open alike apart; the page a lesson reuses is found by the hash, never
    by the title (see ``Writer.lesson``)."""
    words = "".join(ch for ch in " ".join(text.split()) if ch.isprintable()).split(" ")
    head = ""
    for word in words:
        if len(head) + len(word) + 1 > 100:
            head = head.rstrip(" ,;:—-") + " …"
            break
        head = f"{head} {word}" if head else word
    head = head.rstrip(" .!?,;:")
    return f"{head} [{content_hash[:10]}]"


def _hash(normalized: str) -> str:
    return hashlib.sha256(normalized.encode()).hexdigest()


def check_attribution(check: LearningCheck, purpose: str) -> Attribution:
    """Whom a check's background model call is charged to: the check's seat, turn and role."""
    return Attribution(
        company=check.company,
        seat=check.seat,
        stage=Stage.BACKGROUND,
        purpose=purpose,
        turn_id=check.turn_id or None,
        role=check.role or None,
    )


@dataclass(eq=False)
class Writer:
    clients: Clients
    settings: Settings
    aux: AuxiliaryModel
    store: PostgresSessionStore
    clock: Clock

    @property
    def _timeout(self) -> float:
        return self.settings.sessions.rpc_timeout_seconds

    async def _answer(self, call: Awaitable[T], kind: OutputKind, service: str, out: Results) -> T | None:
        """The service's answer to a write (or the read before it); None, with the output's
        WRITE_FAILED partial failure, when the service refused it or did not answer."""
        try:
            return await call
        except grpc.aio.AioRpcError as err:
            out.failures.append(PartialFailure(kind, FailureKind.WRITE_FAILED, f"{service}: {rpc_failure(err)}"))
            return None

    def _permitted(self, check: LearningCheck, tool: str, kind: OutputKind, out: Results) -> bool:
        """Whether the role may write through ``tool`` from the background; when not, the refusal is
        the output's partial failure."""
        permission = self.settings.tool_permission(check.company, check.role, tool)
        if permission == "allow":
            return True
        why = (
            f"role {check.role or '(none)'} has {tool} permission {permission}: it needs a person's approval, "
            "which the background worker cannot give"
            if permission == "ask"
            else f"role {check.role or '(none)'} has {tool} permission deny"
        )
        out.failures.append(PartialFailure(kind, FailureKind.PERMISSION_REFUSED, why))
        return False

    # ---------------------------------------------------------------- project lessons

    async def lesson(
        self,
        check: LearningCheck,
        cand: LessonCandidate,
        evidence_ids: Sequence[str],
        out: Results,
        origin: Origin | None = None,
    ) -> None:
        if not self._permitted(check, KNOWLEDGE_TOOL, OutputKind.PROJECT_LESSON, out):
            return
        normalized = judge.normalize(cand.text)
        if not normalized:
            out.dropped.append(Dropped(OutputKind.PROJECT_LESSON, "the lesson has no words", tuple(evidence_ids)))
            return
        digest = _hash(normalized)
        origin = origin or Origin()
        source = _check_source(check, evidence_ids, origin)
        # The lesson's record (its page id, title and body, and this check among its sources) is
        # committed BEFORE the page is written: whatever point a fault stops this at (Postgres gone,
        # the process killed after UpsertPage), the record names the page and the person who
        # taught it, so an erasure of theirs deletes the page, and the next check of the lesson
        # writes the same page (the recorded title and id) instead of a second one. The page of
        # identical normalized content is found by its hash (it keeps the title and text it was
        # first recorded with), so it is reused whatever the new copy's case, spacing or
        # punctuation, even when two checks write it at once (one row; the knowledge keys pages by
        # title).
        first = LessonRecord(
            str(uuid.uuid4()),
            lesson_title(cand.text, digest),
            f"{cand.text}\n\n---\nLearned in session {check.session_id} (learning check {check.id}) "
            f"from evidence {', '.join(evidence_ids)}.",
        )
        record = await self.store.reserve_lesson(
            check.company, check.workspace, digest, first, source, self.clock.now()
        )
        resp = await self._answer(
            self.clients.knowledge.UpsertPage(
                kb_pb.UpsertPageRequest(
                    company=check.company,
                    container=workspace_container(check.workspace),
                    title=record.title,
                    body=record.body,
                    page_id=record.page_id,
                ),
                timeout=self._timeout,
            ),
            OutputKind.PROJECT_LESSON,
            "knowledge",
            out,
        )
        if resp is None:
            return
        page = resp.page
        if page.id != record.page_id:  # the title's page existed before the record: it keeps its id
            await self.store.settle_lesson(
                check.company, check.workspace, digest, record.page_id, page.id, self.clock.now()
            )
        disposition = Disposition.WRITTEN if resp.created else Disposition.REUSED
        out.outputs.append(Output(OutputKind.PROJECT_LESSON, page.id, disposition, tuple(evidence_ids)))
        if not page.embedding_model:
            out.failures.append(
                PartialFailure(
                    OutputKind.PROJECT_LESSON,
                    FailureKind.NOT_INDEXED,
                    "the page was saved without a vector: full-text search finds it, similarity search does not "
                    "until the knowledge fill embeds it",
                    page.id,
                )
            )

    # ---------------------------------------------------------------- personal facts

    async def facts(
        self,
        check: LearningCheck,
        facts: Sequence[tuple[FactCandidate, Sequence[str]]],
        out: Results,
    ) -> None:
        if not facts:
            return
        cadence = self.settings.company(check.company).extraction_cadence(check.owner)
        if cadence == "off":
            for _, ids in facts:
                out.dropped.append(
                    Dropped(
                        OutputKind.PERSONAL_FACT,
                        "memory.extraction_cadence is off for this user or company: no personal memory is written",
                        tuple(ids),
                    )
                )
            return
        diary = self.clients.diary
        try:
            recent = await diary.RecallNotes(
                diary_pb.RecallNotesRequest(
                    company=check.company,
                    seat=check.seat,
                    vector_limit=0,
                    lexical_limit=0,
                    recency_limit=RECENT_NOTES_SHOWN,
                ),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as err:
            self._all_failed(facts, FailureKind.WRITE_FAILED, f"diary: {rpc_failure(err)}", out)
            return
        notes = [c.note.content for c in recent.candidates]
        prompt = judge.build_prompt([f.text for f, _ in facts], notes)
        attribution = check_attribution(check, judge.PURPOSE)
        try:
            completion = await self.aux.complete(
                attribution, prompt, timeout=self.settings.sessions.review_timeout_seconds
            )
            verdicts = judge.read_verdicts(completion.text, len(facts))
            judged_by = completion.model
        except (AuxiliaryUnavailable, NoAuxiliaryModel, AttributionMissing) as err:
            self._all_failed(facts, FailureKind.MODEL_ERROR, f"the memory judge did not answer: {err}", out)
            return
        except InvalidOutput as err:
            self._all_failed(
                facts, FailureKind.INVALID_OUTPUT, f"the memory judge answered no usable verdicts: {err}", out
            )
            return
        limit = self.settings.learning.diary.max_content_chars
        for i, (fact, ids) in enumerate(facts, 1):
            verdict = verdicts.get(i)
            if verdict is None:
                out.dropped.append(Dropped(OutputKind.PERSONAL_FACT, "the memory judge gave it no verdict", tuple(ids)))
                continue
            if verdict.tier in ("NOOP", "DOC"):
                why = (
                    "team knowledge, not personal memory"
                    if verdict.tier == "DOC"
                    else (verdict.reason or "nothing worth persisting")
                )
                out.dropped.append(
                    Dropped(
                        OutputKind.PERSONAL_FACT, f"the memory judge classified it {verdict.tier}: {why}", tuple(ids)
                    )
                )
                continue
            content = verdict.content or fact.text
            if len(content) > limit:
                out.dropped.append(
                    Dropped(
                        OutputKind.PERSONAL_FACT,
                        f"the note is {len(content)} characters; a note holds at most {limit} (never trimmed)",
                        tuple(ids),
                    )
                )
                continue
            await self._fact(check, content, verdict, ids, out, judged_by)

    def _all_failed(
        self,
        facts: Sequence[tuple[FactCandidate, Sequence[str]]],
        failure: FailureKind,
        detail: str,
        out: Results,
    ) -> None:
        """Every fact not written, for one cause: the diary refused (``WRITE_FAILED``), or the
        judge did not answer (``MODEL_ERROR``) or answered nothing usable (``INVALID_OUTPUT``); the
        spec gives model errors, invalid output and failed writes distinct receipts."""
        for _ in facts:
            out.failures.append(PartialFailure(OutputKind.PERSONAL_FACT, failure, detail[:500]))

    async def _fact(
        self,
        check: LearningCheck,
        content: str,
        verdict: judge.Verdict,
        ids: Sequence[str],
        out: Results,
        model: str = "",
    ) -> None:
        diary = self.clients.diary
        floor = self.settings.sessions.personal_fact_duplicate_similarity
        similar = await self._answer(
            diary.RecallNotes(
                diary_pb.RecallNotesRequest(
                    company=check.company,
                    seat=check.seat,
                    query=content,
                    vector_limit=DEDUP_CANDIDATES,
                    lexical_limit=0,
                    recency_limit=0,
                    neighbour_limit=0,  # a duplicate check compares meanings only
                ),
                timeout=self._timeout,
            ),
            OutputKind.PERSONAL_FACT,
            "diary",
            out,
        )
        if similar is None:
            return
        near = [c for c in similar.candidates if diary_pb.RECALL_HALF_VECTOR in c.found_by and c.similarity >= floor]
        if near:
            best = max(near, key=lambda c: c.similarity)
            out.outputs.append(Output(OutputKind.PERSONAL_FACT, best.note.id, Disposition.REUSED, tuple(ids)))
            return
        unchecked = _dedup_gap(similar)
        resp = await self._answer(
            diary.WriteNote(
                diary_pb.WriteNoteRequest(
                    company=check.company,
                    seat=check.seat,
                    content=content,
                    tier=diary_pb.NOTE_TIER_LONG if verdict.tier == "LONG" else diary_pb.NOTE_TIER_SHORT,
                    ttl_days=verdict.ttl_days if verdict.tier == "SHORT" else 0,
                    source=diary_pb.NOTE_SOURCE_PERSIST_DECIDER,
                    turn_id=check.turn_id or f"session:{check.session_id}",
                    # Identical normalized content is one note of the seat, whichever check wrote it.
                    request_id=f"session-fact:{_hash(judge.normalize(content))[:40]}",
                    # Issue 17: the session, check and events it came from, and whose they were.
                    # The judge wrote the note's content (from the review's candidate).
                    provenance=_source_to_pb(
                        _check_source(check, list(ids)[:1000], Origin(model, JUDGE_PROMPT_VERSION))
                    ),
                ),
                timeout=self._timeout,
            ),
            OutputKind.PERSONAL_FACT,
            "diary",
            out,
        )
        if resp is None:
            return
        if resp.note_removed:
            # The seat's note of this fact (same normalized content, same key) was deleted since it
            # was written: the diary applied its own rule and does not write it again. Nothing
            # failed, so it is dropped with the reason (a failure would end the check FAILED and put
            # an error in the user's away digest).
            out.dropped.append(
                Dropped(
                    OutputKind.PERSONAL_FACT,
                    "the seat's note of this fact was deleted since it was first written; it is not written again",
                    tuple(ids),
                )
            )
            return
        note = resp.note
        out.outputs.append(
            Output(
                OutputKind.PERSONAL_FACT,
                note.id,
                Disposition.WRITTEN if resp.created else Disposition.REUSED,
                tuple(ids),
            )
        )
        if unchecked and resp.created:
            # Written anyway (a fact is not lost to an embedder's outage; an identical one is still
            # caught by the idempotency key), but the receipt says the dedup did not fully run.
            out.failures.append(
                PartialFailure(OutputKind.PERSONAL_FACT, FailureKind.NOT_DEDUPLICATED, unchecked, note.id)
            )
        if not note.embedding_model:
            out.failures.append(
                PartialFailure(
                    OutputKind.PERSONAL_FACT,
                    FailureKind.NOT_INDEXED,
                    f"the note was saved without a vector ({resp.embedding_skipped_reason or 'no embedder'}); the "
                    "diary fill embeds it later",
                    note.id,
                )
            )

    # ---------------------------------------------------------------- skill proposal

    async def skill(
        self,
        check: LearningCheck,
        cand: SkillCandidate,
        evidence_ids: Sequence[str],
        out: Results,
        origin: Origin | None = None,
    ) -> None:
        if not self._permitted(check, SKILL_TOOL, OutputKind.SKILL_PROPOSAL, out):
            return
        resp = await self._answer(
            self.clients.skills.ProposeSkill(
                skill_pb.ProposeSkillRequest(
                    company=check.company,
                    seat=check.seat,
                    name=cand.name,
                    summary=cand.summary,
                    body=cand.body,
                    tool_sequence=list(cand.tool_sequence),
                    origin=skill_pb.PROPOSAL_ORIGIN_SESSION_CHECK,
                    source=skill_pb.ProposalSource(
                        session_id=check.session_id,
                        check_id=str(check.id),
                        evidence_ids=list(evidence_ids),
                        turn_id=check.turn_id,
                    ),
                    request_id=f"learning:{check.id}",
                    # Issue 17: whose session it rests on and what proposed it (the approval
                    # carries this onto the live skill).
                    provenance=_source_to_pb(_check_source(check, list(evidence_ids)[:1000], origin or Origin())),
                ),
                timeout=self._timeout,
            ),
            OutputKind.SKILL_PROPOSAL,
            "skills",
            out,
        )
        if resp is None:
            return
        d = resp.disposition
        ids = tuple(evidence_ids)
        if d in (skill_pb.PROPOSAL_DISPOSITION_CREATED, skill_pb.PROPOSAL_DISPOSITION_ALREADY_PROPOSED):
            out.outputs.append(Output(OutputKind.SKILL_PROPOSAL, resp.proposal.id, Disposition.WRITTEN, ids))
            if d == skill_pb.PROPOSAL_DISPOSITION_CREATED and skill_pb.DUPLICATE_CHECK_EMBEDDING not in resp.checks_run:
                # The skills service leaves the semantic check out when no embedder answered: the
                # proposal was filed on the exact checks alone, which the receipt says (as a
                # personal fact's does) instead of a clean WRITTEN.
                out.failures.append(
                    PartialFailure(
                        OutputKind.SKILL_PROPOSAL,
                        FailureKind.NOT_DEDUPLICATED,
                        f"the proposal {cand.name} was filed without the semantic duplicate check (no embedding of "
                        "it): only the exact name, body and tool-set checks ran, so it may repeat a live skill",
                        resp.proposal.id,
                    )
                )
        elif d == skill_pb.PROPOSAL_DISPOSITION_DUPLICATE_PROPOSAL:
            out.outputs.append(Output(OutputKind.SKILL_PROPOSAL, resp.proposal.id, Disposition.REUSED, ids))
        else:
            match = resp.match
            check_name = skill_pb.DuplicateCheck.Name(match.check).removeprefix("DUPLICATE_CHECK_").lower()
            what = (
                f"a rejected proposal ({match.name}, {check_name} {match.similarity:.2f}) matches: not proposed again"
                if d == skill_pb.PROPOSAL_DISPOSITION_SUPPRESSED
                else f"duplicates the live skill {match.name} ({check_name} {match.similarity:.2f})"
            )
            out.dropped.append(Dropped(OutputKind.SKILL_PROPOSAL, what, ids))


def _dedup_gap(similar: diary_pb.RecallNotesResponse) -> str:
    """Why the embedding-backed duplicate check could not compare a fact with every note of the
    seat (the diary reports it beside its candidates); empty when it could."""
    status = similar.embedding_status
    if status not in (embedding_pb2.EMBEDDING_STATUS_EMBEDDED, embedding_pb2.EMBEDDING_STATUS_PROVIDED):
        name = embedding_pb2.EmbeddingStatus.Name(status).removeprefix("EMBEDDING_STATUS_")
        return (
            f"the duplicate check did not run (the query's embedding: {name}): the note was written without "
            "being compared with the seat's notes, so it may repeat one of them"
        )
    if similar.unreachable_by_vector_count > 0:
        return (
            f"the duplicate check could not compare the note with {similar.unreachable_by_vector_count} of the "
            "seat's notes (no vector of the current model yet): it may repeat one of them"
        )
    return ""


# ------------------------------------------------------------------------------ lesson provenance


def _check_source(check: LearningCheck, evidence_ids: Sequence[str], origin: Origin) -> dict[str, Any]:
    """Where what a check writes came from (issue 17: the session, check and events, the turn,
    whose session it was, what produced it), as a lesson keeps it among its sources; every write's
    ``Provenance`` is this, through :func:`_source_to_pb`."""
    return {
        "session_id": check.session_id,
        "check_id": str(check.id),
        "evidence_ids": list(evidence_ids),
        "turn_ids": [check.turn_id] if check.turn_id else [],
        "subjects": [{"handle": check.owner}] if check.owner else [],
        "model": origin.model,
        "prompt_version": origin.prompt_version,
        "writer": WRITER,
    }


def _source_to_pb(source: dict[str, Any]) -> provenance_pb2.Provenance:
    """One kept source of a lesson as a ``Provenance`` (sources kept before issue 17's fields name
    the session, check and events only)."""
    return provenance_pb2.Provenance(
        turn_ids=[t for t in source.get("turn_ids", []) if t],
        subjects=[
            erasure_pb2.ErasureSubject(
                handle=s.get("handle", ""), external_id=s.get("external_id", ""), platform=s.get("platform", "")
            )
            for s in source.get("subjects", [])
        ],
        session_id=source.get("session_id", ""),
        check_id=source.get("check_id", ""),
        event_ids=list(source.get("evidence_ids", [])),
        model=source.get("model", ""),
        prompt_version=source.get("prompt_version", ""),
        writer=source.get("writer", WRITER),
    )


async def lesson_provenance(
    store: SessionStore, company: str, page_id: str
) -> tuple[str, str, list[provenance_pb2.Provenance]]:
    """(workspace, title, sources) of the workspace lesson filed as the page: every session, check
    and events that taught it, oldest first. A page no check of the company wrote is NOT_FOUND.
    The sessions are every user's: a token bound to one seat or user is refused."""
    current_principal().require_company_wide("a workspace lesson's provenance")
    company = require_ident(company, "company", domain=DOMAIN)
    page_id = require_page_id(page_id, domain=DOMAIN)
    message = f"no workspace lesson of company {company} is filed as page {page_id}"
    row = await store.lesson_by_page(company, page_id)
    workspace, title, sources = require_found(
        row, "lesson", page_id, seat=company, scope="company", id_key="page_id", message=message, domain=DOMAIN
    )
    kept = json.loads(sources) if isinstance(sources, str) else list(sources)
    return workspace, title, [_source_to_pb(s) for s in kept]
