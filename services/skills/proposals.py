"""Skill proposals: candidates that wait for a person before they become skills.

Two paths propose (spec/session-learning.txt, "Writes and isolation"): a session learning check's
skill candidate and the ``distill_skill`` builtin. Both come here, and both meet the same checks:

- exact: the same name, or the same body (case and spacing ignored);
- semantic: the tool-SET Jaccard check every skill path runs (``check_candidate``'s, at
  ``skill_synthesis.duplicate_jaccard_threshold``), and — where an embedder is configured — the
  cosine similarity of "name: summary" at ``skill_proposals.duplicate_similarity_threshold``;

against, in this order: the seat's live skills (DUPLICATE_SKILL), its rejected proposals
(SUPPRESSED: a rejected candidate is not proposed again) and its pending proposals
(DUPLICATE_PROPOSAL). The response names every check that ran, so a caller knows when the
embedding check could not (no embedder, or the embed failed).

A name is the seat's for good — unique across its skills, archived rows included — so a candidate
named exactly like an archived skill is refused (ALREADY_EXISTS, SKILL_NAME_TAKEN, field ``name``)
rather than filed: approval could never make it a skill under that name, and the proposer can rename.

Approval goes through ``SkillService.create`` — its name, cap and tool-set gates included — so a
proposal never becomes a skill any other way, and never without a person.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.clock import Clock
from libs.common.config import SkillProposalsConfig
from libs.common.embeddings import Embedder
from libs.common.errors import AlreadyExists, FailedPrecondition
from libs.common.events import EventSink
from libs.common.not_found import require_found
from libs.common.request_rules import time_page
from libs.common.validation import decode_time_cursor, page_size
from services.skills.domain import (
    DOMAIN,
    DuplicateCheck,
    ProposalDecision,
    ProposalDisposition,
    ProposalMatch,
    ProposalOrigin,
    ProposalState,
    Skill,
    SkillKey,
    SkillProposal,
    SkillState,
    describe_skill,
    jaccard,
    normalized,
)
from services.skills.ports import ProposalStore
from services.skills.service import SkillService

__all__ = ["ProposalResult", "ProposalService"]

_log = logging.getLogger(__name__)

EMBED_BUDGET_SECONDS = 5.0
"""The candidate and the live skills are embedded in one batch under this deadline; past it the
embedding check is reported as not run."""


@dataclass(frozen=True)
class ProposalResult:
    disposition: ProposalDisposition
    proposal: SkillProposal | None
    match: ProposalMatch | None
    checks_run: tuple[DuplicateCheck, ...]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0 or a.shape != b.shape:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _name_held(seat: str, holder: Skill, consequence: str) -> AlreadyExists:
    """SKILL_NAME_TAKEN naming the skill that holds the name and its state: an archived holder is
    not in ListSkills' default page, so a bare "already has a skill named" would send the reader
    looking for a skill they cannot see."""
    return AlreadyExists.of_field(
        "name",
        "SKILL_NAME_TAKEN",
        f"seat {seat} already has a skill named {holder.name!r} ({holder.state}, id {holder.id}): {consequence}",
        domain=DOMAIN,
        name=holder.name,
        seat=seat,
        skill_id=holder.id,
        state=holder.state,
    )


def _approved_provenance(proposal: SkillProposal) -> Provenance:
    """The live skill's provenance: the proposal's source, and what its proposer recorded (the
    model and prompt version that proposed it, the people it rests on)."""
    out = Provenance()
    out.CopyFrom(proposal.provenance)
    if proposal.turn_id and proposal.turn_id not in out.turn_ids:
        out.turn_ids.append(proposal.turn_id)
    out.session_id = proposal.session_id or out.session_id
    out.check_id = proposal.check_id or out.check_id
    for e in proposal.evidence_ids:
        if e not in out.event_ids:
            out.event_ids.append(e)
    out.writer = f"skill_proposal:{proposal.origin}"
    return out


@dataclass(eq=False)
class ProposalService:
    """The proposals' use cases; ``skills`` is the catalogue an approval writes through."""

    skills: SkillService
    store: ProposalStore
    embedder: Embedder | None
    config: SkillProposalsConfig
    events: EventSink

    @property
    def clock(self) -> Clock:
        return self.skills.clock

    # ---------------------------------------------------------------- propose

    async def _vectors(self, texts: list[str]) -> list[np.ndarray | None] | None:
        """The texts' vectors in one batch, or None when no embedder answered in time."""
        if self.embedder is None or not texts:
            return None
        try:
            vectors = await _within(self.embedder, texts)
        except Exception as err:  # the semantic check degrades to "not run", never fails the proposal
            _log.warning("skill proposal embeddings unavailable: %s", err)
            return None
        return vectors

    async def propose(
        self,
        company: str,
        seat: str,
        *,
        name: str,
        summary: str,
        body: str,
        tool_sequence: Sequence[str],
        origin: ProposalOrigin,
        session_id: str = "",
        check_id: str = "",
        evidence_ids: Sequence[str] = (),
        turn_id: str = "",
        request_id: str = "",
        provenance: Provenance | None = None,
    ) -> ProposalResult:
        # Handles, required fields, lengths, the origin and the source's ids: the contract's.
        name = self.skills.checked_draft(name, summary, body)
        tools = list(tool_sequence)
        rid = request_id or None
        if rid is not None:
            earlier = await self.store.by_request(company, seat, rid)
            if earlier is not None:
                return ProposalResult(ProposalDisposition.ALREADY_PROPOSED, earlier, None, ())

        # The semantic comparison needs vectors; they are computed before the seat's lock is taken
        # (an embed can take seconds), then the exact and tool-set checks run again under the lock.
        live = await self.skills.store.live_skills(company, seat)
        others = await self.store.comparable(company, seat)
        candidate_text = describe_skill(name, summary)
        model = self.embedder.model if self.embedder is not None else None
        needs = [candidate_text] + [describe_skill(s.name, s.summary) for s in live]
        stale = [p for p, vec, m in others if vec is None or m != model]
        needs += [describe_skill(p.name, p.summary) for p in stale]
        vectors = await self._vectors(needs)
        sims: dict[object, float] | None = None
        cand_vec: np.ndarray | None = None
        if vectors is not None and vectors[0] is not None:
            cand_vec = vectors[0]
            sims = {}
            for s, v in zip(live, vectors[1 : 1 + len(live)], strict=True):
                if v is not None:
                    sims[s.id] = _cosine(cand_vec, v)
            fresh = dict(zip((p.id for p in stale), vectors[1 + len(live) :], strict=True))
            for p, vec, _ in others:
                v = fresh.get(p.id, vec)
                if v is not None:
                    sims[p.id] = _cosine(cand_vec, v)
        checks = [DuplicateCheck.EXACT_NAME, DuplicateCheck.EXACT_BODY, DuplicateCheck.TOOL_SET]
        if sims is not None:
            checks.append(DuplicateCheck.EMBEDDING)

        now = self.clock.now()
        async with self.skills.store.seat(company, seat) as tx:
            learned = await tx.all_skills()
            live = [s for s in learned if s.state is not SkillState.ARCHIVED]
            if rid is not None:
                # Again under the seat's lock: a concurrent retry of this request may have filed it
                # since the look-up above, and ``_match`` would then find it and answer this retry
                # its own proposal as a duplicate.
                earlier = await self.store.by_request(company, seat, rid, tx.conn)
                if earlier is not None:
                    return ProposalResult(ProposalDisposition.ALREADY_PROPOSED, earlier, None, ())
            current = await self.store.comparable(company, seat, tx.conn)
            match = self._match(name, body, tools, live, current, sims)
            holder = next((s for s in learned if s.name == name), None)
            if holder is not None and (match is None or match[0] is not ProposalDisposition.DUPLICATE_SKILL):
                # Archived (a live holder matched by name above): the name stays taken, so approval
                # would refuse it for ever; the proposer can rename, an operator can restore.
                raise _name_held(
                    seat,
                    holder,
                    "a name stays taken after archiving; propose under another name, or restore it (RestoreSkill)",
                )
            if match is not None:
                disposition, found, proposal = match
                return ProposalResult(disposition, proposal, found, tuple(checks))
            proposal = SkillProposal(
                id=uuid.uuid4(),
                company=company,
                seat=seat,
                name=name,
                summary=summary,
                body=body,
                tool_sequence=tuple(tools),
                origin=origin,
                session_id=session_id,
                check_id=check_id,
                evidence_ids=tuple(evidence_ids),
                turn_id=turn_id,
                state=ProposalState.PENDING,
                create_time=now,
                provenance=provenance if provenance is not None else Provenance(),
            )
            stored = await self.store.insert(tx.conn, proposal, rid, cand_vec, model)
        if stored is None:  # a concurrent retry with the same key filed it
            earlier = await self.store.by_request(company, seat, rid or "")
            assert earlier is not None
            return ProposalResult(ProposalDisposition.ALREADY_PROPOSED, earlier, None, tuple(checks))
        await self.events.emit(
            "skill_proposed",
            company=company,
            seat=seat,
            turn_id=turn_id or None,
            proposal_id=str(stored.id),
            name=stored.name,
            origin=str(origin),
            session_id=session_id or None,
            checks=[str(c) for c in checks],
        )
        return ProposalResult(ProposalDisposition.CREATED, stored, None, tuple(checks))

    def _match(
        self,
        name: str,
        body: str,
        tools: Sequence[str],
        live: Sequence[Skill],
        others: Sequence[tuple[SkillProposal, np.ndarray | None, str | None]],
        sims: dict[object, float] | None,
    ) -> tuple[ProposalDisposition, ProposalMatch, SkillProposal | None] | None:
        jaccard_floor = self.skills.synthesis.duplicate_jaccard_threshold
        embed_floor = self.config.duplicate_similarity_threshold
        n_name, n_body = normalized(name), normalized(body)

        def first(item_id: object, item_name: str, item_body: str, item_tools: Sequence[str]) -> ProposalMatch | None:
            if normalized(item_name) == n_name:
                return ProposalMatch(DuplicateCheck.EXACT_NAME, item_name, 1.0)
            if normalized(item_body) == n_body:
                return ProposalMatch(DuplicateCheck.EXACT_BODY, item_name, 1.0)
            sim = jaccard(tools, item_tools)
            if sim >= jaccard_floor:
                return ProposalMatch(DuplicateCheck.TOOL_SET, item_name, sim)
            if sims is not None and sims.get(item_id, -1.0) >= embed_floor:
                return ProposalMatch(DuplicateCheck.EMBEDDING, item_name, sims[item_id])
            return None

        for skill in live:
            m = first(skill.id, skill.name, skill.body, skill.tool_sequence)
            if m is not None:
                return (
                    ProposalDisposition.DUPLICATE_SKILL,
                    ProposalMatch(m.check, m.name, m.similarity, skill_id=skill.id),
                    None,
                )
        for state, disposition in (
            (ProposalState.REJECTED, ProposalDisposition.SUPPRESSED),
            (ProposalState.PENDING, ProposalDisposition.DUPLICATE_PROPOSAL),
        ):
            for p, _, _ in others:
                if p.state is not state:
                    continue
                m = first(p.id, p.name, p.body, p.tool_sequence)
                if m is not None:
                    return disposition, ProposalMatch(m.check, m.name, m.similarity, proposal_id=p.id), p
        return None

    # ---------------------------------------------------------------- decide

    async def get(self, company: str, seat: str, proposal_id: str) -> SkillProposal:
        pid = uuid.UUID(proposal_id)  # a UUID: the contract's
        found = await self.store.get(company, seat, pid)
        message = f"seat {seat} has no skill proposal {proposal_id}"
        return require_found(found, "proposal", proposal_id, seat=seat, message=message, domain=DOMAIN)

    async def approve(
        self, company: str, seat: str, proposal_id: str, reviewer: str, reason: str
    ) -> tuple[SkillProposal, Skill]:
        """The proposal becomes a live skill through CreateSkill's path; its gates refuse as they
        refuse any draft, and the proposal stays pending then."""
        proposal = await self.get(company, seat, proposal_id)
        if proposal.state is ProposalState.REJECTED:
            raise FailedPrecondition(
                f"proposal {proposal_id} was rejected; a rejected proposal is not approved",
                reason="PROPOSAL_REJECTED",
                domain=DOMAIN,
                metadata={"proposal_id": proposal_id},
            )
        if proposal.state is ProposalState.APPROVED and proposal.skill_id is not None:
            return proposal, await self.skills.get(SkillKey(proposal.company, proposal.seat, id=proposal.skill_id))
        draft = proposal.as_draft()
        try:
            skill = await self.skills.create(
                proposal.company, proposal.seat, draft, provenance=_approved_provenance(proposal)
            )
        except AlreadyExists as err:
            # An approval that created the skill and stopped before marking the proposal: the skill
            # under its name is this proposal's (same body, same source), so finish the approval.
            if err.reason != "SKILL_NAME_TAKEN":
                raise
            existing = await self.skills.store.get(SkillKey(proposal.company, proposal.seat, name=proposal.name))
            if existing is None:
                raise
            if existing.body != draft.body or existing.source_turn_ids != draft.source_turn_ids:
                # Another skill holds the name: one made after the proposal, or an archived one a
                # proposal filed before propose checked archived names still meets. Say which, and
                # its state: an archived one is not listed by default.
                raise _name_held(seat, existing, "this proposal cannot be approved under that name; reject it") from err
            skill = existing
        approval = ProposalDecision(ProposalState.APPROVED, reviewer, reason, skill.id)
        decided = await self.store.decide(proposal.company, proposal.seat, proposal.id, approval, self.clock.now())
        if decided is None:  # decided meanwhile by another call
            decided = await self.get(company, seat, proposal_id)
        await self.events.emit(
            "skill_proposal_approved",
            company=proposal.company,
            seat=proposal.seat,
            proposal_id=str(proposal.id),
            skill_id=str(skill.id),
            name=skill.name,
            reviewer=reviewer or None,
        )
        return decided, skill

    async def reject(self, company: str, seat: str, proposal_id: str, reviewer: str, reason: str) -> SkillProposal:
        proposal = await self.get(company, seat, proposal_id)
        if proposal.state is ProposalState.REJECTED:
            return proposal
        if proposal.state is ProposalState.APPROVED:
            raise FailedPrecondition(
                f"proposal {proposal_id} was approved; archive the skill instead",
                reason="PROPOSAL_APPROVED",
                domain=DOMAIN,
                metadata={"proposal_id": proposal_id, "skill_id": str(proposal.skill_id or "")},
            )
        rejection = ProposalDecision(ProposalState.REJECTED, reviewer, reason)
        decided = await self.store.decide(proposal.company, proposal.seat, proposal.id, rejection, self.clock.now())
        if decided is None:
            decided = await self.get(company, seat, proposal_id)
            if decided.state is not ProposalState.REJECTED:
                raise FailedPrecondition(
                    f"proposal {proposal_id} was approved meanwhile",
                    reason="PROPOSAL_APPROVED",
                    domain=DOMAIN,
                    metadata={"proposal_id": proposal_id},
                )
            return decided
        await self.events.emit(
            "skill_proposal_rejected",
            company=proposal.company,
            seat=proposal.seat,
            proposal_id=str(proposal.id),
            name=proposal.name,
            reviewer=reviewer or None,
        )
        return decided

    # ---------------------------------------------------------------- list

    async def list(
        self, company: str, seat: str, state: ProposalState | None, size: int, token: str
    ) -> tuple[list[SkillProposal], str]:
        size = page_size(size, default=self.config.page_size, maximum=200, domain=DOMAIN)
        scope = {"company": company, "seat": seat, "state": str(state) if state else None}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        found = await self.store.page(company, seat, state, after, size + 1)
        return time_page(found, size, scope, lambda p: p.create_time, lambda p: p.id)


async def _within(embedder: Embedder, texts: list[str]) -> list[np.ndarray | None]:
    async with asyncio.timeout(EMBED_BUDGET_SECONDS):
        vectors = await embedder.embed(texts)
    return [v.values if v is not None else None for v in vectors]
