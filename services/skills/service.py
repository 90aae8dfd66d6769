"""Skill use cases: the gates, create, list, get, use, offer, refine, observe, versions, rollback,
operator edits and learning health.

Dependencies arrive as arguments (store, clock, config, events); the servicer only translates
protobuf to these calls and back. The passes (curator, clustered synthesis) live in ``passes``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.bounds import at_most_chars
from libs.common.clock import Clock
from libs.common.config import SkillCuratorConfig, SkillRefinementConfig, SkillSynthesisConfig
from libs.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    field_error,
    request_id_reused,
)
from libs.common.events import EventSink
from libs.common.request_rules import key_page
from libs.common.validation import decode_cursor, encode_page_token, page_size
from services.skills.domain import (
    DOMAIN,
    MAX_IDS_PER_CALL,
    NAME_MAX_CHARS,
    CandidateVerdict,
    Gate,
    LearningHealth,
    ObservationKind,
    ObservationSkip,
    Skill,
    SkillChange,
    SkillDraft,
    SkillEdit,
    SkillKey,
    SkillState,
    SkillTrigger,
    SkillVersion,
    append_practice_bullet,
    best_match,
    practice_bullet,
    tool_set,
)
from services.skills.ports import Moved, SkillStore, Tx
from services.skills.store import StampFailed, name_taken_error

__all__ = ["ObservationResult", "OfferResult", "SkillService", "UseResult", "not_blank", "use_key"]

T = TypeVar("T")

_log = logging.getLogger(__name__)

# A body past its bound, in this service's words (libs.common.bounds).
_BODY_TOO_LONG = "{field} is {length} characters; a skill body holds at most {limit}"

STAMP_TIMEOUT_SECONDS = 2.0
"""A telemetry stamp (use count, offer clock) waits at most this long for its row: a turn start
must not hang on measurement. Past it the stamp is reported as failed."""


@dataclass(frozen=True)
class UseResult:
    skill: Skill
    revived: bool
    telemetry_write_failed: bool
    already_applied: bool = False
    """The use's key was used before: the body is answered, no second use was counted."""


def use_key(turn_id: str | None, request_id: str, skill: SkillKey) -> str | None:
    """The key a UseSkill's ``request_id`` is kept under in ``skill_use_requests`` (shared with
    MarkSkillsUsed's ``<run id>:skill_use``): led by the run id, as those are, so an erasure of a
    run takes it with them; ``use_skill`` keeps it apart from the reflector's keys. None: no key.

    It ends with a digest of the skill asked for, so the key names one request (this skill, this
    call): a retry is answered as before, but the same request id reused for ANOTHER skill (an
    engine forwarding provider call ids that restart each response) is a use of that skill, where
    it was answered already_applied and never counted."""
    if not request_id:
        return None
    ref = f"id:{skill.id}" if skill.id is not None else f"name:{skill.name}"
    digest = hashlib.sha256(ref.encode()).hexdigest()[:16]
    return f"{turn_id}:use_skill:{request_id}:{digest}" if turn_id else f"use_skill:{request_id}:{digest}"


@dataclass(frozen=True)
class OfferResult:
    marked: int
    revived_names: list[str]
    failure: str | None


@dataclass(frozen=True)
class ObservationResult:
    skill: Skill
    skipped_reason: ObservationSkip | None


@dataclass(eq=False)
class SkillService:
    """The catalogue's use cases over their dependencies (compared by identity: one per process)."""

    store: SkillStore
    clock: Clock
    synthesis: SkillSynthesisConfig
    refinement: SkillRefinementConfig
    curator: SkillCuratorConfig
    events: EventSink

    # ---------------------------------------------------------------- identities

    @staticmethod
    def key(company: str, seat: str, skill_id: str, skill_name: str) -> SkillKey:
        """The skill by id, else by name. The contract has checked the handles, the id's form and
        that exactly one of the two is set (the request's ``buf.validate.message`` oneof rule)."""
        if skill_id:
            return SkillKey(company, seat, id=uuid.UUID(skill_id))
        return SkillKey(company, seat, name=skill_name.strip())

    @staticmethod
    def _not_found(key: SkillKey) -> NotFound:
        return NotFound(
            f"seat {key.seat} has no skill {key.describe()}",
            reason="SKILL_NOT_FOUND",
            domain=DOMAIN,
            metadata={"seat": key.seat, **({"skill_id": key.id} if key.id else {"skill_name": key.name})},
        )

    @asynccontextmanager
    async def _locked(self, key: SkillKey, request_id: str | None = None) -> AsyncIterator[tuple[Tx, Skill, bool]]:
        """The skill's row lock (``store.skill_row``) for a change to one skill, and whether the call
        with ``request_id`` made a kept version already; a skill the key does not name is NOT_FOUND
        before anything is changed."""
        async with self.store.skill_row(key, request_id) as (conn, skill, seen):
            if skill is None:
                raise self._not_found(key)
            yield conn, skill, seen

    async def _same_request(
        self,
        conn: Tx,
        skill: Skill,
        request_id: str | None,
        change: SkillChange,
        *,
        body: str | None = None,
        reason: str | None = None,
        restored_from: int | None = None,
    ) -> None:
        """A key whose version is kept answers a retry of ITS request with the skill as it is; a
        different request under that key (another body, reason or kind of change, a rollback to
        another version) is refused, not answered as if applied: a refine_skill reusing a key was
        told its body was in while the first one stayed (AIP-155: a key names one request)."""
        made = None if request_id is None else await self.store.keyed_version(conn, skill.id, request_id)
        if made is None:
            return  # trimmed from the kept versions since the check: nothing to compare with
        same = (
            made.change is change
            and (body is None or made.body == body)
            and (reason is None or (made.reason or "") == reason)
            and (restored_from is None or made.restored_from_version == restored_from)
        )
        if not same:
            raise request_id_reused(
                request_id or "",  # set: a version was found by it
                f"request_id {request_id!r} already made version {made.version} of skill {skill.name!r} with "
                "another request; a retry sends the same request, a new request needs a new key",
                domain=DOMAIN,
                skill_name=skill.name,
                version=made.version,
            )

    @staticmethod
    def _archived(skill: Skill, action: str) -> FailedPrecondition:
        return FailedPrecondition(
            f"skill {skill.name!r} is archived; {action} needs an operator to restore it first",
            reason="SKILL_ARCHIVED",
            domain=DOMAIN,
            metadata={"skill_id": skill.id, "skill_name": skill.name},
        )

    # ---------------------------------------------------------------- gates

    def gate_verdict(
        self, live: Sequence[Skill], tools: frozenset[str], learned: Sequence[Skill] | None = None
    ) -> CandidateVerdict:
        """The cap on live skills first, then the tool-SET duplicate check against ``learned`` (every
        skill the seat has, archived ones included, where the caller read them) or else the live
        ones.

        A full catalogue still names the duplicate when there is one: the cap decides the verdict,
        but a caller retrying its own draft needs to know which skill it is. The single-turn
        synthesizer whose first attempt drafted the skill that took the last slot, then stopped
        before stamping its episode, finds that skill only this way (spec: "it stamps
        consolidated_into_skill_id on each source row")."""
        cap = self.synthesis.max_skills_per_agent
        threshold = self.synthesis.duplicate_jaccard_threshold
        match = best_match(tools, live if learned is None else learned)
        duplicate = match if match is not None and match[1] >= threshold else None
        if len(live) >= cap:
            return CandidateVerdict(Gate.CATALOGUE_FULL, len(live), cap, threshold, duplicate)
        if duplicate is not None:
            return CandidateVerdict(Gate.DUPLICATE, len(live), cap, threshold, duplicate)
        return CandidateVerdict(Gate.OPEN, len(live), cap, threshold)

    async def check_candidate(self, company: str, seat: str, tools: Sequence[str]) -> CandidateVerdict:
        """The cap, then the duplicate check: both before any model is asked to draft. The duplicate
        check reads every skill the seat has learned, archived ones included, as the clustered pass
        does: an archived skill is learned, and drafting it again would re-create it under a new
        name (bringing it back is an operator's RestoreSkill)."""
        candidate = tool_set(tools)
        learned = await self.store.all_skills(company, seat)
        live = [s for s in learned if s.state is not SkillState.ARCHIVED]
        return self.gate_verdict(live, candidate, learned)

    # ---------------------------------------------------------------- create

    async def create(
        self,
        company: str,
        seat: str,
        draft: SkillDraft,
        *,
        archived_are_learned: bool = False,
        provenance: Provenance | None = None,
    ) -> Skill:
        """Store ``draft`` after re-checking the gates under the seat's lock. ``archived_are_learned``:
        the duplicate check reads archived skills too — the synthesis paths' rule (CreateSkill,
        CheckSkillCandidate, the clustered pass); an approved proposal keeps its own check, against
        the live skills.

        The contract (CreateSkillRequest's rules) has checked the handles, the required fields,
        the lengths and the enum. What stays here: the name's rules, measured after stripping (the
        contract sees the raw text), the trigger/cluster_size/source_turn_ids agreement (a rule
        across fields, which the contract checker does not evaluate), the body cap (config) and
        the gates (state). The draft is stored with its name stripped and its cluster size as
        :func:`_stored_cluster_size` settles it."""
        name = self.checked_draft(draft.name, draft.summary, draft.body)
        turns = draft.source_turn_ids
        cluster_size = _stored_cluster_size(draft.trigger, draft.cluster_size, turns)
        draft = replace(draft, name=name, cluster_size=cluster_size)
        now = self.clock.now()
        async with self.store.seat(company, seat) as tx:
            if await tx.name_taken(name):
                raise name_taken_error(seat, name)
            learned = await tx.all_skills() if archived_are_learned else None
            live = (
                [s for s in learned if s.state is not SkillState.ARCHIVED]
                if learned is not None
                else await tx.live_skills()
            )
            verdict = self.gate_verdict(live, tool_set(draft.tool_sequence), learned)
            self._raise_for_gate(verdict, seat)
            skill = await tx.insert(draft, _sourced(provenance, turns, f"synthesis:{draft.trigger}"), now)
        await self._emit_skill(
            "skill_synthesized",
            skill,
            # A clustered draft came from a group: naming any single member would explain none of
            # the others, so it carries no turn id.
            turns[0] if draft.trigger is SkillTrigger.SINGLE else None,
            trigger=str(draft.trigger),
            cluster_size=cluster_size,
            tool_count=len(tool_set(draft.tool_sequence)),
        )
        return skill

    def checked_draft(self, name: str, summary: str, body: str) -> str:
        """A draft's text beyond the contract (CreateSkillRequest's and ProposeSkillRequest's, the
        same rules), checked once for both paths so an approval does not fail on what the proposal
        could have been told at once: the name's rules measured after stripping (the contract sees
        the raw text), a summary and body not blank, and the body cap (config). The stripped name."""
        name = name.strip()
        if not name:
            raise field_error("name", "FIELD_REQUIRED", "name is required", domain=DOMAIN)
        if len(name) > NAME_MAX_CHARS or any(not ch.isprintable() for ch in name):
            raise field_error(
                "name",
                "FIELD_INVALID",
                f"name must be one printable line of at most {NAME_MAX_CHARS} characters",
                domain=DOMAIN,
                limit=NAME_MAX_CHARS,
                length=len(name),
            )
        not_blank(summary, "summary")
        not_blank(body, "body")
        self._body_fits(body)
        return name

    @staticmethod
    def _raise_for_gate(verdict: CandidateVerdict, seat: str) -> None:
        if verdict.gate is Gate.CATALOGUE_FULL:
            raise ResourceExhausted(
                f"seat {seat} has {verdict.live_count} live skills; the catalogue holds at most {verdict.max_skills}",
                reason="SKILL_CATALOGUE_FULL",
                domain=DOMAIN,
                metadata={"limit": verdict.max_skills, "live_skills": verdict.live_count},
            )
        if verdict.gate is Gate.DUPLICATE and verdict.duplicate is not None:
            dup, sim = verdict.duplicate
            raise AlreadyExists.of_field(
                "tool_sequence",
                "SKILL_DUPLICATE_TOOL_SET",
                f"the tool set duplicates skill {dup.name!r} (Jaccard {sim:.2f} >= {verdict.threshold})",
                domain=DOMAIN,
                duplicate_skill_name=dup.name,
                duplicate_skill_id=dup.id,
                similarity=f"{sim:.4f}",
                threshold=verdict.threshold,
            )

    def _body_fits(self, body: str, field: str = "body") -> None:
        # Refused, never truncated: a clip lands mid-step and reads as the whole procedure.
        limit = self.refinement.max_body_chars
        at_most_chars(body, field, limit, domain=DOMAIN, reason="SKILL_BODY_TOO_LONG", message=_BODY_TOO_LONG)

    # ---------------------------------------------------------------- reads

    async def list_skills(
        self, company: str, seat: str, size: int, token: str, include_archived: bool
    ) -> tuple[list[Skill], str, int]:
        size = page_size(size, default=50, maximum=200, domain=DOMAIN)
        scope = {"company": company, "seat": seat, "archived": include_archived}
        after = decode_cursor(token, scope, lambda c: _typed(c["name"], str), domain=DOMAIN)
        rows = await self.store.page(company, seat, include_archived, after, size + 1)
        skills, next_token = key_page(rows, size, lambda last: encode_page_token({"name": last.name}, scope))
        if not token and not next_token:
            # The first page is the whole catalogue (the usual case: a turn start's menu and the
            # refiner read ≤ 50 skills in one page of 200), so it is its own count: no second statement.
            return skills, next_token, len(skills)
        total = await self.store.count(company, seat, include_archived)
        return skills, next_token, total

    async def get(self, key: SkillKey) -> Skill:
        skill = await self.store.get(key)
        if skill is None:
            raise self._not_found(key)
        return skill

    # ---------------------------------------------------------------- use and offer

    async def use(self, key: SkillKey, turn_id: str | None, request_id: str = "") -> UseResult:
        """The body verbatim, with the use recorded and a stale skill revived in the same write.

        The use count is telemetry: if it cannot be written, the body is still returned (read
        without the stamp) and the failure is announced, never swallowed.

        Spec: one use (and one ``skill_used``) "per use_skill(name) resolution": a retried call
        (the engines retry CallTool on UNAVAILABLE and DEADLINE_EXCEEDED with its key) is the same
        resolution. With ``request_id`` the use's key is recorded with it, and a call whose key
        was recorded before answers the body and counts nothing."""
        now = self.clock.now()
        failed: str | None = None
        try:
            # Shielded: a use the seat already benefited from is recorded even if the caller goes.
            used = await asyncio.shield(
                self.store.use(key, now, STAMP_TIMEOUT_SECONDS, use_key(turn_id, request_id, key))
            )
        except StampFailed as err:
            used, failed = None, str(err)
        if used is None:
            skill = await self.store.get(key)
            if skill is None:
                raise self._not_found(key)
            if skill.state is SkillState.ARCHIVED:
                raise self._archived(skill, "using it")
            if failed is None:  # it changed under us (archived and restored mid-call): read it plainly
                failed = "the skill changed while the use was recorded"
            await self._telemetry_failed(
                skill.company, skill.seat, turn_id, "skill_used", failed, [str(skill.id)], [skill.name]
            )
            revived = False
        elif not used.counted:
            return UseResult(used.skill, revived=False, telemetry_write_failed=False, already_applied=True)
        else:
            skill, prior = used.skill, used.prior
            revived = prior is SkillState.STALE and skill.state is SkillState.ACTIVE
        # The resolution happened (the body is answered), so skill_used is published whether or not
        # the counter was written: they are separate best-effort writes (spec, "Best-effort rule").
        await self._emit_skill("skill_used", skill, turn_id, source_kind="synthesized", version=skill.version)
        if revived:
            await self._emit_skill("skill_revived", skill, turn_id, cause="used")
        return UseResult(skill, revived=revived, telemetry_write_failed=failed is not None)

    async def mark_offered(
        self, company: str, seat: str, skill_ids: Sequence[str], skill_names: Sequence[str], turn_id: str | None
    ) -> OfferResult:
        """Move the staleness clock of exactly the offered skills (a stale one is revived: being
        offered is being used). A stamp that cannot be written is reported, never raised."""
        # Each list's own limit and the ids' form are the contract's; the limit on both together
        # spans two fields, which the contract checker does not evaluate.
        if len(skill_ids) + len(skill_names) > MAX_IDS_PER_CALL:
            raise field_error(
                "skill_ids",
                "TOO_MANY_IDS",
                f"at most {MAX_IDS_PER_CALL} skills per call, got {len(skill_ids) + len(skill_names)}",
                domain=DOMAIN,
                limit=MAX_IDS_PER_CALL,
                count=len(skill_ids) + len(skill_names),
            )
        ids = sorted({uuid.UUID(v) for v in skill_ids})
        names = sorted({n.strip() for n in skill_names if n.strip()})
        if not ids and not names:
            return OfferResult(0, [], None)
        now = self.clock.now()
        try:
            moved = await asyncio.shield(self.store.offer(company, seat, ids, names, now, STAMP_TIMEOUT_SECONDS))
        except StampFailed as err:
            await self._telemetry_failed(
                company, seat, turn_id, "skill_offered", str(err), [str(i) for i in ids], names
            )
            return OfferResult(0, [], str(err))
        revived = await self._announce_revived(company, seat, turn_id, moved, "offered")
        return OfferResult(len(moved), sorted(revived), None)

    async def mark_used(
        self, company: str, seat: str, skill_ids: Sequence[str], turn_id: str | None, request_id: str
    ) -> tuple[int, list[str], bool]:
        """Record a use of each named live skill (the SkillUse worker); returns (marked, revived
        names, already applied). Unknown and archived ids are skipped: an archived skill is not
        resurrected by a turn that was offered it before the curator archived it."""
        ids = sorted({uuid.UUID(v) for v in skill_ids})  # count and form checked by the contract
        rid = request_id or None
        if not ids:
            return 0, [], False
        moved = await asyncio.shield(self.store.mark_used(company, seat, ids, self.clock.now(), rid))
        if moved is None:
            return 0, [], True
        revived = await self._announce_revived(company, seat, turn_id, moved, "used")
        return len(moved), sorted(revived), False

    async def _announce_revived(
        self,
        company: str,
        seat: str,
        turn_id: str | None,
        moved: list[Moved],
        cause: str,
    ) -> list[str]:
        """A ``skill_revived`` event for each stale skill a stamp brought back; their names."""
        revived = []
        for skill_id, name, before, after in moved:
            if before is SkillState.STALE and after is SkillState.ACTIVE:
                revived.append(name)
                await self.events.emit(
                    "skill_revived",
                    company=company,
                    seat=seat,
                    turn_id=turn_id or None,
                    skill_id=str(skill_id),
                    name=name,
                    cause=cause,
                )
        return revived

    async def _emit_skill(self, kind: str, skill: Skill, turn_id: str | None = None, **payload: object) -> None:
        """A skill's event: every one names the skill the same way (its seat, id and name, and the
        turn when there is one), the kind's own fields after."""
        await self.events.emit(
            kind,
            company=skill.company,
            seat=skill.seat,
            turn_id=turn_id or None,
            skill_id=str(skill.id),
            name=skill.name,
            **payload,
        )

    async def _telemetry_failed(
        self,
        company: str,
        seat: str,
        turn_id: str | None,
        write: str,
        error: str,
        skill_ids: list[str],
        skill_names: list[str],
    ) -> None:
        """Announce a stamp that could not be written: an operator has to see a clock that stopped
        before the curator archives a hot skill. Every failure is logged here, whatever becomes of
        the event: the event log warns only once per kind when it cannot write either, and the
        likeliest reason a stamp fails (the store unreachable) is the likeliest reason it cannot."""
        _log.warning(
            "%s stamp for %s/%s (skills %s) not written: %s",
            write,
            company,
            seat,
            ", ".join(skill_names or skill_ids) or "-",
            error,
        )
        await self.events.emit(
            "skill_telemetry_write_failed",
            company=company,
            seat=seat,
            turn_id=turn_id or None,
            write=write,
            error=error[:500],
            skill_ids=skill_ids,
            skill_names=skill_names,
        )

    # ---------------------------------------------------------------- refinement

    def _refinement_enabled(self) -> None:
        if not self.refinement.enabled:
            raise FailedPrecondition(
                "skill refinement is disabled (learning.skill_refinement.enabled: false)",
                reason="REFINEMENT_DISABLED",
                domain=DOMAIN,
                metadata={"knob": "learning.skill_refinement.enabled"},
            )

    async def refine(
        self,
        key: SkillKey,
        body: str,
        reason: str,
        turn_id: str | None,
        request_id: str = "",
        provenance: Provenance | None = None,
    ) -> Skill:
        """Whole-body replacement of one of the seat's own skills; the prior body is archived."""
        self._refinement_enabled()
        rid = request_id or None  # body required, reason and request_id lengths: the contract's
        not_blank(body, "body")
        self._body_fits(body)  # config: learning.skill_refinement.max_body_chars
        now = self.clock.now()
        async with self._locked(key, rid) as (conn, skill, seen):
            if skill.state is SkillState.ARCHIVED:
                raise self._archived(skill, "refining it")
            if seen:
                await self._same_request(conn, skill, rid, SkillChange.REFINED, body=body, reason=reason)
                return skill  # a retry of a refinement already made
            prov = _sourced(provenance, [turn_id] if turn_id else [], "refine_skill")
            edit = SkillEdit(body, SkillChange.REFINED, reason, prov, request_id=rid)
            refined = await self.store.new_version(conn, skill, edit, now, self.refinement.max_versions_kept)
        await self._emit_skill(
            "skill_refined",
            refined,
            turn_id,
            path="manual",
            version=refined.version,
            reason=reason,
            body_chars=len(body),
        )
        return refined

    async def append_observation(
        self,
        key: SkillKey,
        kind: ObservationKind,
        observation: str,
        turn_id: str | None,
        request_id: str = "",
        provenance: Provenance | None = None,
    ) -> ObservationResult:
        """One bullet under the practice heading. Past the body cap it is skipped and logged."""
        self._refinement_enabled()
        rid = request_id or None
        cfg = self.refinement
        if not cfg.auto_refine_on_success and not cfg.auto_refine_on_failure:
            raise FailedPrecondition(
                "automatic refinement is off (auto_refine_on_success and auto_refine_on_failure are both false)",
                reason="REFINEMENT_DISABLED",
                domain=DOMAIN,
                metadata={"knob": "learning.skill_refinement.auto_refine_on_success/on_failure"},
            )
        knob = "auto_refine_on_success" if kind is ObservationKind.OBSERVED else "auto_refine_on_failure"
        if not getattr(cfg, knob):
            raise FailedPrecondition(
                f"learning.skill_refinement.{knob} is false: this kind of observation is not appended",
                reason="OBSERVATION_KIND_DISABLED",
                domain=DOMAIN,
                metadata={"knob": f"learning.skill_refinement.{knob}", "kind": str(kind)},
            )
        # Required and at most 1,000 characters: the contract's. Blank is refused here: the contract
        # counts spaces as text, and a bullet of spaces teaches nothing.
        not_blank(observation, "observation")
        bullet = practice_bullet(kind, observation)
        prov = _sourced(provenance, [turn_id] if turn_id else [], "refiner")
        now = self.clock.now()
        async with self._locked(key, rid) as (conn, skill, seen):
            if seen:
                return ObservationResult(skill, None)  # a redelivery of a bullet already appended
            if skill.state is SkillState.ARCHIVED:
                # The refiner reads the live catalogue; a skill archived meanwhile is not resurrected.
                skipped: ObservationSkip | None = ObservationSkip.ARCHIVED
                result = skill
            else:
                body = append_practice_bullet(skill.body, bullet)
                if len(body) > cfg.max_body_chars:
                    skipped, result = ObservationSkip.BODY_CAP, skill
                else:
                    skipped = None
                    edit = SkillEdit(body, SkillChange.OBSERVATION_APPENDED, bullet, prov, request_id=rid)
                    # With the bullet's own record: an erasure takes one person's bullets out of
                    # the body by these, without a model.
                    result = await self.store.new_version(conn, skill, edit, now, cfg.max_versions_kept, bullet)
        if skipped is not None:
            _log.info(
                "observation for skill %s of %s/%s skipped: %s", result.name, result.company, result.seat, skipped
            )
            await self._emit_skill(
                "skill_refinement_skipped",
                result,
                turn_id,
                reason=skipped,
                body_chars=len(result.body),
                bullet_chars=len(bullet),
                limit=cfg.max_body_chars,
            )
            return ObservationResult(result, skipped)
        await self._emit_skill(
            "skill_refined",
            result,
            turn_id,
            path="auto",
            observation_kind=str(kind),
            version=result.version,
        )
        return ObservationResult(result, None)

    # ---------------------------------------------------------------- versions

    async def list_versions(self, key: SkillKey, size: int, token: str) -> tuple[list[SkillVersion], str, int]:
        skill = await self.get(key)
        size = page_size(size, default=20, maximum=100, domain=DOMAIN)
        scope = {"skill": str(skill.id)}
        before = decode_cursor(token, scope, lambda c: _typed(c["v"], int), domain=DOMAIN)
        rows = await self.store.versions_page(skill.id, before, size + 1)
        total = await self.store.versions_count(skill.id)
        versions, next_token = key_page(rows, size, lambda last: encode_page_token({"v": last.version}, scope))
        return versions, next_token, total

    async def rollback(self, key: SkillKey, version: int, request_id: str = "") -> Skill:
        """A forward step: the archived body of ``version`` becomes a new version. A retry with the
        ``request_id`` of a rollback the kept versions hold writes nothing and returns the skill."""
        rid = request_id or None  # version required and not negative: the contract's
        now = self.clock.now()
        async with self._locked(key, rid) as (conn, skill, seen):
            if seen:
                await self._same_request(conn, skill, rid, SkillChange.ROLLED_BACK, restored_from=version)
                return skill  # a retry of a rollback already made
            if version == skill.version:
                raise FailedPrecondition(
                    f"version {version} is the live version of {skill.name!r}; nothing to roll back to",
                    reason="SKILL_VERSION_CURRENT",
                    domain=DOMAIN,
                    metadata={"version": version, "skill_name": skill.name},
                )
            kept = await self.store.archived_body(conn, skill.id, version)
            if kept is None:
                raise NotFound(
                    f"skill {skill.name!r} keeps no version {version} (versions past "
                    f"{self.refinement.max_versions_kept} are dropped)",
                    reason="SKILL_VERSION_NOT_FOUND",
                    domain=DOMAIN,
                    metadata={"version": version, "skill_name": skill.name, "current_version": skill.version},
                )
            body, restored = kept
            # The body is that version's, and so is where it came from.
            reason = f"rollback to version {version}"
            edit = SkillEdit(body, SkillChange.ROLLED_BACK, reason, restored, restored_from=version, request_id=rid)
            rolled = await self.store.new_version(conn, skill, edit, now, self.refinement.max_versions_kept)
        await self._emit_skill(
            "skill_refined",
            rolled,
            path="rollback",
            version=rolled.version,
            restored_from_version=version,
        )
        return rolled

    # ---------------------------------------------------------------- operator edits

    async def set_pinned(self, key: SkillKey, pinned: bool) -> Skill:
        now = self.clock.now()
        async with self._locked(key) as (conn, skill, _):
            if skill.pinned == pinned:
                return skill
            updated = await self.store.set_pinned(conn, skill.id, pinned, now)
        await self._emit_skill(
            "skill_pinned" if pinned else "skill_unpinned",
            updated,
            cause="operator",
        )
        return updated

    async def archive(self, key: SkillKey) -> Skill:
        now = self.clock.now()
        async with self._locked(key) as (conn, skill, _):
            if skill.state is SkillState.ARCHIVED:
                return skill
            updated = await self.store.set_state(conn, skill.id, SkillState.ARCHIVED, now, reset_clock=False)
        await self._emit_skill(
            "skill_archived",
            updated,
            cause="operator",
            from_state=str(skill.state),
            to_state=str(SkillState.ARCHIVED),
        )
        return updated

    async def restore(self, key: SkillKey) -> Skill:
        """Back to active with a fresh clock (else the next curator tick would age it out again).
        An archived skill re-enters the catalogue, so the cap applies."""
        now = self.clock.now()
        async with self.store.seat(key.company, key.seat) as tx:
            skill = await tx.get_for_update(key)
            if skill is None:
                raise self._not_found(key)
            if skill.state is SkillState.ACTIVE:
                return skill
            if skill.state is SkillState.ARCHIVED:
                live = await tx.count_live()
                cap = self.synthesis.max_skills_per_agent
                if live >= cap:
                    raise ResourceExhausted(
                        f"seat {key.seat} has {live} live skills; the catalogue holds at most {cap}",
                        reason="SKILL_CATALOGUE_FULL",
                        domain=DOMAIN,
                        metadata={"limit": cap, "live_skills": live},
                    )
            updated = await tx.set_state(skill.id, SkillState.ACTIVE, now, reset_clock=True)
        await self._emit_skill(
            "skill_restored",
            updated,
            cause="operator",
            from_state=str(skill.state),
        )
        return updated

    # ---------------------------------------------------------------- health

    async def health(self, company: str, seat: str) -> LearningHealth:
        return await self.store.health(company, seat, self.clock.now())


def not_blank(value: str, field: str) -> None:
    """A required text of spaces only is missing. The contract's ``required`` counts spaces as
    text; a summary, body or observation of spaces teaches nothing, so the use case refuses it as
    the field being absent."""
    if not value.strip():
        raise field_error(field, "FIELD_REQUIRED", f"{field} is required", domain=DOMAIN)


def _stored_cluster_size(trigger: SkillTrigger, cluster_size: int, turns: Sequence[str]) -> int:
    """The trigger/cluster_size/source_turn_ids agreement (a rule across fields, which the contract
    checker does not evaluate); the cluster size stored (a SINGLE skill's is 1, however given)."""
    single = trigger is SkillTrigger.SINGLE
    if cluster_size not in (0, 1) if single else cluster_size < 2:
        rule = "one turn; cluster_size must be 0 or 1, got" if single else "at least two turns; cluster_size is"
        raise field_error(
            "cluster_size",
            "FIELD_INVALID",
            f"a {trigger.name} skill comes from {rule} {cluster_size}",
            domain=DOMAIN,
            value=cluster_size,
        )
    if single and len(turns) != 1:
        raise field_error(
            "source_turn_ids",
            "FIELD_INVALID",
            f"a SINGLE skill names exactly one source turn, got {len(turns)}",
            domain=DOMAIN,
            count=len(turns),
        )
    if not single and not turns:
        raise field_error(
            "source_turn_ids", "FIELD_REQUIRED", "a CLUSTERED skill names its source turns", domain=DOMAIN
        )
    return 1 if single else cluster_size


def _sourced(given: Provenance | None, turn_ids: Sequence[str], writer: str) -> Provenance:
    """The caller's provenance, its turn ids and writer defaulted from what the call itself says."""
    prov = Provenance()
    if given is not None:
        prov.CopyFrom(given)
    if not prov.turn_ids:
        prov.turn_ids.extend(turn_ids)
    if not prov.writer:
        prov.writer = writer
    return prov


def _typed(value: object, kind: type[T]) -> T:
    """A cursor field of the type this service wrote (else the token is not one of ours)."""
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}")
    return value
