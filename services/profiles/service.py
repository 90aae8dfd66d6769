"""Profile use cases: merge an observation, read the named subjects' profiles, list them.

Dependencies arrive as arguments (store, clock, events, limits); the servicer only translates
protobuf to these calls and back. Every read and write is scoped to (company, observer).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from libs.common.bounds import at_most_chars, at_most_items
from libs.common.clock import Clock
from libs.common.erasure import platform_key
from libs.common.errors import FieldViolation, InvalidArgument, field_error
from libs.common.events import EventSink
from libs.common.not_found import require_found
from libs.common.request_rules import at_most, key_page
from libs.common.validation import (
    decode_cursor,
    decode_time_cursor,
    encode_page_token,
    page_size,
    require_ident,
    require_text,
)
from services.profiles.domain import (
    DOMAIN,
    LIST_FIELDS,
    EntryOrigin,
    Limits,
    Observation,
    ObservationRecord,
    ObservationSource,
    Profile,
    Subject,
    combine,
    linked,
    merge,
    newest,
    trace_entries,
)
from services.profiles.ports import ObservationWrite, ProfileStore

__all__ = ["EVENT_UPDATED", "ProfileService", "SubjectRef", "source_for"]

EVENT_UPDATED = "counterparty_profile_updated"

# A subject is named as a turn's sender is (agentlearn.reflector.v1.Sender, ErasureSubject): a
# handle or an external id of up to 200 characters and a platform of up to 64, with no pattern, so
# every sender a turn carries ("MS Teams", a one-letter GitHub login) can be profiled. Nothing here
# parses them: the platform and the identifier are columns of their own, and a key naming a sender
# escapes them (``libs.common.senders.subject_part``).
MAX_PLATFORM_CHARS = 64

# Refusals past a bound (libs.common.bounds): what the bound is of, in this service's words.
_TOO_MANY_ITEMS = "{field} has {count} items; a profile keeps at most {limit}"

SubjectRef = tuple[str, str, str]
"""A subject as the caller sent it: (handle, external_id, platform)."""


def source_for(given: ObservationSource | None, subject: Subject, turn_id: str | None) -> ObservationSource:
    """What an observation records as its source: the caller's, completed with what the request
    itself says (the turn observed; the subject observed, whose messages an observation is
    derived from when the caller names no one)."""
    src = given or ObservationSource()
    return ObservationSource(
        turn_ids=src.turn_ids or ((turn_id,) if turn_id else ()),
        work_key=src.work_key,
        subjects=src.subjects or ((subject.handle or "", subject.external_id or "", subject.platform),),
        model=src.model,
        prompt_version=src.prompt_version,
        writer=src.writer,
    )


@dataclass(eq=False)
class ProfileService:
    store: ProfileStore
    clock: Clock
    events: EventSink
    limits: Limits = field(default_factory=Limits)

    # ---------------------------------------------------------------- checks

    def _scope(self, company: str, observer: str) -> tuple[str, str]:
        return require_ident(company, "company", domain=DOMAIN), require_ident(observer, "observer", domain=DOMAIN)

    def _subject_id(self, value: str, field: str) -> str | None:
        if not value:
            return None
        return require_text(value, field, domain=DOMAIN, max_chars=self.limits.max_subject_chars)

    def _subject(self, ref: SubjectRef, prefix: str) -> Subject:
        """A subject needs a platform and a handle or an external id (both may be given: the
        profile is then filed under the handle and remembers the external id). The platform is
        filed folded as an erasure compares it (``platform_key``: "Slack" and "slack" are one
        platform); a handle and an external id exactly as given."""
        handle_in, external_in, platform_in = ref
        require_text(platform_in, f"{prefix}.platform", domain=DOMAIN, max_chars=MAX_PLATFORM_CHARS)
        platform = platform_key(platform_in)
        handle = self._subject_id(handle_in, f"{prefix}.handle")
        external_id = self._subject_id(external_in, f"{prefix}.external_id")
        if handle is None and external_id is None:
            message = f"{prefix} needs a handle or, for a person with none, an external_id"
            raise InvalidArgument(
                message,
                reason="FIELD_REQUIRED",
                domain=DOMAIN,
                field=f"{prefix}.handle",
                violations=[FieldViolation(f"{prefix}.external_id", message)],
            )
        return Subject(platform=platform, handle=handle, external_id=external_id)

    def _items(self, values: Sequence[str], field: str) -> tuple[str, ...]:
        at_most_items(values, self.limits.bound(field), field, _TOO_MANY_ITEMS, domain=DOMAIN)
        for i, value in enumerate(values):
            # Refused, never trimmed: the writer can tighten the text and retry.
            require_text(value, f"{field}[{i}]", domain=DOMAIN, max_chars=self.limits.max_item_chars)
        return tuple(v.strip() for v in values)

    # ---------------------------------------------------------------- write

    async def upsert_profile(
        self,
        company: str,
        observer: str,
        subject_ref: SubjectRef,
        communication_style: str,
        past_decisions: Sequence[str],
        sensitivities: Sequence[str],
        topics: Sequence[str],
        turn_id: str,
        request_id: str = "",
        source: ObservationSource | None = None,
    ) -> tuple[Profile, bool]:
        """Merge one observation pass into the observer's profile of the subject; returns the
        profile after the merge and whether this pass created it. The observation is recorded with
        its source (issue 17) in the same transaction as the merge."""
        company, observer = self._scope(company, observer)
        subject = self._subject(subject_ref, "subject")
        # A seat never profiles itself, on any platform.
        if subject.key.strip().casefold() == observer.casefold():
            field = "subject.handle" if subject.handle else "subject.external_id"
            raise field_error(
                field,
                "SELF_PROFILE",
                f"seat {observer} cannot profile itself",
                domain=DOMAIN,
                observer=observer,
                platform=subject.platform,
            )
        style = at_most_chars(
            communication_style.strip(), "communication_style", self.limits.max_style_chars, domain=DOMAIN
        )
        lists = {
            f: self._items(v, f) for f, v in zip(LIST_FIELDS, (past_decisions, sensitivities, topics), strict=True)
        }
        if not style and not any(lists.values()):
            message = "an observation carries a communication_style or at least one decision, sensitivity or topic"
            raise InvalidArgument(
                message,
                reason="OBSERVATION_EMPTY",
                domain=DOMAIN,
                violations=[FieldViolation(f, message) for f in ("communication_style", *LIST_FIELDS)],
            )
        at_most_chars(turn_id, "turn_id", self.limits.max_turn_id_chars, domain=DOMAIN)
        obs = Observation(
            communication_style=style or None,
            past_decisions=lists["past_decisions"],
            sensitivities=lists["sensitivities"],
            topics=lists["topics"],
            turn_id=turn_id.strip() or None,
        )
        now = self.clock.now()

        def apply(current: Profile) -> Profile | None:
            # The same turn observed again (a retried pass) is already in the profile.
            if obs.turn_id is not None and obs.turn_id == current.last_turn_id:
                return None
            return merge(current, subject, obs, self.limits, now)

        if request_id:
            require_text(request_id, "request_id", domain=DOMAIN, max_chars=self.limits.max_request_id_chars)
        profile, created, changed = await self.store.observe(
            ObservationWrite(
                company,
                observer,
                subject,
                now,
                apply,
                request_id=request_id or None,
                observation=obs,
                source=source_for(source, subject, obs.turn_id),
                keep_observations=self.limits.kept_observations,
                limits=self.limits,
            )
        )
        if changed:
            await self.events.emit(
                EVENT_UPDATED,
                company=company,
                seat=observer,
                turn_id=obs.turn_id,
                subject={
                    "handle": profile.subject.handle,
                    "external_id": profile.subject.external_id,
                    "platform": profile.subject.platform,
                },
                created=created,
                profile_id=str(profile.id),
                observation_count=profile.observation_count,
            )
        return profile, created

    # ---------------------------------------------------------------- reads

    async def provenance(
        self, company: str, observer: str, profile_id: str
    ) -> tuple[Profile, list[ObservationRecord], list[EntryOrigin]]:
        """Where a profile came from: the profile, its recorded observations (newest first: every
        one the store keeps, see ``Limits.kept_observations``) and each of its entries traced to
        the observations that stated it. Another observer's or company's profile is NOT_FOUND.

        The profile is the person's, as every read answers it: an id an upsert folded into another
        row of the person answers that row (a caller who held it keeps the provenance), and a row
        of a person with several rows not folded yet answers them combined (``combine``), their
        observations together, as GetProfiles and ListProfiles show them."""
        company, observer = self._scope(company, observer)
        require_text(profile_id, "profile_id", domain=DOMAIN, max_chars=100)
        try:
            pid = uuid.UUID(profile_id)
        except ValueError:
            raise field_error(
                "profile_id",
                "FIELD_INVALID",
                f"profile_id {profile_id!r} is not a UUID",
                domain=DOMAIN,
                value=profile_id[:100],
            ) from None
        found = await self.store.get(company, observer, pid)
        row = require_found(found, "profile", profile_id, seat=observer, scope="observer", domain=DOMAIN)
        rows = linked(row.subject, await self.store.get_many(company, observer, [row.subject])) or [row]
        profile = combine(rows, self.limits)
        observations = await self.store.observations(
            company, observer, [p.id for p in rows], self.limits.max_provenance_observations
        )
        return profile, observations, trace_entries(profile, observations)

    async def get_profiles(self, company: str, observer: str, subject_refs: Sequence[SubjectRef]) -> list[Profile]:
        """The observer's profiles of the named subjects, in the order asked; a subject with no
        profile (or named twice, or by both identifiers in two entries) is absent (or answered once)."""
        company, observer = self._scope(company, observer)
        cap = self.limits.max_subjects_per_get
        at_most(subject_refs, cap, "subjects", domain=DOMAIN, reason="TOO_MANY_SUBJECTS")
        subjects = [self._subject(ref, f"subjects[{i}]") for i, ref in enumerate(subject_refs)]
        if not subjects:
            return []
        rows = await self.store.get_many(company, observer, subjects)
        out: list[Profile] = []
        seen: set[uuid.UUID] = set()
        for s in subjects:
            # Found by either identifier; a person's rows written before an upsert found a row by
            # either (one filed under the external id, one under the handle) answer as one, as the
            # next upsert naming both will write them (``combine``).
            mine = linked(s, rows)
            if not mine:
                continue
            profile = combine(mine, self.limits)
            if profile.id not in seen:
                seen.add(profile.id)
                out.append(profile)
        return out

    async def list_profiles(self, company: str, observer: str, size: int, token: str) -> tuple[list[Profile], str, int]:
        company, observer = self._scope(company, observer)
        size = page_size(size, domain=DOMAIN)
        scope = {"company": company, "observer": observer}
        after = decode_time_cursor(token, scope, domain=DOMAIN, id_type=uuid.UUID)
        # Counting the people groups all the observer's rows, so it is counted on a listing's first
        # page and carried in the token to the next (a token without it, from before, counts again):
        # paging a large observer pays for one count, not one per page.
        counted = decode_cursor(token, scope, _counted, domain=DOMAIN) if after else None
        found = await self.store.page(company, observer, after, size + 1, count=counted is None)
        total = found.total if counted is None else counted
        assert total is not None  # asked for when not carried

        def resume(rows: list[Profile]) -> str:
            top = newest(rows)
            when = top.update_time if top.update_time.tzinfo else top.update_time.replace(tzinfo=UTC)
            return encode_page_token({"t": when.isoformat(), "id": str(top.id), "n": total}, scope)

        # One entry per person, its rows merged as the point reads merge them, placed (and the
        # cursor kept) at its newest row, in the order the rows are paged: paging neither repeats
        # nor skips a person.
        people, next_token = key_page(found.people, size, resume)
        return [combine(rows, self.limits) for rows in people], next_token, total


def _counted(cursor: dict[str, Any]) -> int | None:
    """The count of people a listing's first page took (``list_profiles``), or None from a token
    issued before it was carried."""
    n = cursor.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise TypeError("n")
    return n
