"""One learning check, start to receipt: scope, evidence, the one review call, the writes.

Order (spec "Writes and isolation", "Evidence and cost"):

1. the session's owner and workspace are checked against the check's before any evidence is
   read (a mismatch is refused: PERMISSION_REFUSED, nothing read);
2. the evidence at or before the trigger is read, bounded, labelled, redacted and capped;
   nothing at all is MISSING_EVIDENCE;
3. ONE review call through the auxiliary seam (stage background, purpose ``session_review``,
   charged like every call); no answer is MODEL_ERROR, an answer cut at its budget is
   TRUNCATED_OUTPUT, any other unusable answer INVALID_OUTPUT;
4. every candidate held to the citation rules (dropped ones keep their reason);
5. the writes, each reported (``writes``), and the outcome from what landed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from libs.common.auxmodel import (
    AttributionMissing,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    NoAuxiliaryModel,
)
from libs.common.auxmodel.answers import InvalidOutput
from libs.common.config import SessionsConfig, Settings
from services.sessions import review
from services.sessions.domain import (
    CHAT_KINDS,
    EXECUTION_KINDS,
    VERIFICATION_KINDS,
    CheckOutcome,
    FailureKind,
    LearningCheck,
    OutputKind,
)
from services.sessions.evidence import Evidence, assemble
from services.sessions.store import PostgresSessionStore
from services.sessions.writes import Origin, Results, Writer, check_attribution

__all__ = ["CheckRunner", "summarize"]

_log = logging.getLogger(__name__)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summarize(check: LearningCheck) -> str:
    """The receipt's reason for a check whose review was used."""
    c = check.counts()
    parts = []
    if c["lessons_written"] or c["lessons_reused"]:
        parts.append(f"{_plural(c['lessons_written'], 'lesson')} written, {c['lessons_reused']} reused")
    if c["facts_written"] or c["facts_reused"]:
        parts.append(f"{_plural(c['facts_written'], 'personal fact')} written, {c['facts_reused']} reused")
    proposals = sum(1 for o in check.outputs if o.kind is OutputKind.SKILL_PROPOSAL)
    if proposals:
        parts.append(f"{_plural(proposals, 'skill proposal')} awaiting approval")
    if check.dropped:
        parts.append(f"{_plural(len(check.dropped), 'candidate')} dropped")
    if check.partial_failures:
        parts.append(f"{_plural(len(check.partial_failures), 'partial failure')}")
    return "; ".join(parts)


@dataclass(eq=False)
class CheckRunner:
    store: PostgresSessionStore
    aux: AuxiliaryModel
    writer: Writer
    settings: Settings

    @property
    def config(self) -> SessionsConfig:
        return self.settings.sessions

    def _limits(self) -> review.Limits:
        return review.Limits(
            max_lessons=self.config.max_lessons,
            max_facts=self.config.max_personal_facts,
            lesson_chars=self.config.lesson_max_chars,
            fact_chars=self.settings.learning.diary.max_content_chars,
        )

    async def evidence(self, check: LearningCheck) -> Evidence:
        bounds = self.config.evidence
        chat, n_chat = await self.store.latest(
            check.company, check.session_id, CHAT_KINDS, check.trigger_seq, bounds.max_chat_messages
        )
        ver, n_ver = await self.store.latest(
            check.company, check.session_id, VERIFICATION_KINDS, check.trigger_seq, bounds.max_verification_records
        )
        exe, n_exe = await self.store.latest(
            check.company, check.session_id, EXECUTION_KINDS, check.trigger_seq, bounds.max_execution_events
        )
        plan = await self.store.plan(check.company, check.session_id, check.plan_revision)
        return assemble(
            chat,
            ver,
            exe,
            {"chat": n_chat, "verification": n_ver, "execution": n_exe},
            check.plan_revision,
            plan,
            check.newly_done,
            bounds,
        )

    async def run(self, check: LearningCheck) -> LearningCheck:
        """The check with its outcome, reason, outputs, drops and failures filled in."""
        session = await self.store.get_session(check.company, check.session_id)
        if session is None or session.owner != check.owner or session.workspace != check.workspace:
            check.outcome = CheckOutcome.PERMISSION_REFUSED
            check.reason = "the session's owner or workspace no longer matches the check; no evidence was read"
            return check
        evidence = await self.evidence(check)
        check.evidence = evidence.summary()
        if not evidence.items:
            check.outcome = CheckOutcome.MISSING_EVIDENCE
            check.reason = "nothing was recorded at or before the trigger"
            return check
        limits = self._limits()
        prompt = review.build_prompt(
            check_id=str(check.id),
            session_id=check.session_id,
            workspace=check.workspace,
            trigger=review.describe_trigger(str(check.trigger), check.plan_revision, check.newly_done, check.turn_id),
            evidence=evidence,
            limits=limits,
            max_tokens=self.config.review_max_tokens,
        )
        attribution = check_attribution(check, review.PURPOSE)
        try:
            completion = await self.aux.complete(attribution, prompt, timeout=self.config.review_timeout_seconds)
        except (AuxiliaryUnavailable, NoAuxiliaryModel, AttributionMissing) as err:
            check.outcome = CheckOutcome.MODEL_ERROR
            check.reason = f"the background model did not answer: {err}"[:1000]
            return check
        try:
            found = review.read_review(
                completion.text, completion.completion_tokens, prompt.max_tokens, evidence, limits
            )
        except review.Truncated as err:
            check.outcome = CheckOutcome.TRUNCATED_OUTPUT
            check.reason = str(err)[:1000]
            return check
        except InvalidOutput as err:
            check.outcome = CheckOutcome.INVALID_OUTPUT
            check.reason = f"the review's answer is unusable: {err}"[:1000]
            return check
        by_ref = evidence.by_ref()

        def ids(refs: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(by_ref[r].source_id for r in refs)

        out = Results(dropped=list(found.dropped))
        # The receipt holds the very lists the writes fill, so a check that crashes midway (the
        # store gone, a bug) is finished interrupted WITH what already landed (spec: receipts list
        # "output IDs and partial failures"), not as though nothing had been written.
        check.outputs, check.dropped, check.partial_failures = out.outputs, out.dropped, out.failures
        origin = Origin(model=completion.model)  # what the lessons' provenance names (issue 17)
        for lesson in found.lessons:
            await self.writer.lesson(check, lesson, ids(lesson.refs), out, origin)
        await self.writer.facts(check, [(f, ids(f.refs)) for f in found.facts], out)
        if found.skill is not None:
            await self.writer.skill(check, found.skill, ids(found.skill.refs), out, origin)
        check.outcome, check.reason = self._outcome(check, found.proposed)
        return check

    @staticmethod
    def _outcome(check: LearningCheck, proposed: int) -> tuple[CheckOutcome, str]:
        if check.outputs:
            return CheckOutcome.COMPLETED, summarize(check)
        failures = check.partial_failures
        detail = "; ".join(f.detail for f in failures)[:900]
        if any(f.failure is FailureKind.WRITE_FAILED for f in failures):
            return CheckOutcome.WRITE_FAILED, "no write landed: " + detail
        # The memory judge's own failures keep their receipts (spec: model errors, invalid output
        # and failed writes are distinct), not WRITE_FAILED.
        if any(f.failure is FailureKind.MODEL_ERROR for f in failures):
            return CheckOutcome.MODEL_ERROR, "no write landed: " + detail
        if any(f.failure is FailureKind.INVALID_OUTPUT for f in failures):
            return CheckOutcome.INVALID_OUTPUT, "no write landed: " + detail
        if any(f.failure is FailureKind.PERMISSION_REFUSED for f in failures):
            return CheckOutcome.PERMISSION_REFUSED, "every write was refused: " + "; ".join(f.detail for f in failures)[
                :900
            ]
        if proposed == 0:
            return CheckOutcome.COMPLETED_EMPTY, "the review found nothing worth keeping"
        return CheckOutcome.COMPLETED_EMPTY, "every candidate was dropped: " + "; ".join(
            d.reason for d in check.dropped
        )[:900]
