"""The profiles' domain: subjects, profiles, the bounds that are data, and the merge rule.

A profile is what one observing seat has learned about one counterparty on one platform. The
merge of an observation into a stored profile is a pure function (:func:`merge`), so the rule is
the same wherever it runs and is testable without a database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from libs.common.text_fold import fold as item_key  # what makes two items the same: case and whitespace do not

__all__ = [
    "DOMAIN",
    "LIST_FIELDS",
    "EntryOrigin",
    "Limits",
    "Observation",
    "ObservationRecord",
    "ObservationSource",
    "Profile",
    "Subject",
    "empty",
    "item_key",
    "merge",
    "merge_list",
    "prunable",
    "trace_entries",
]

DOMAIN = "profiles.agentlearn.dev"

# The three merged lists, by field name (the proto's and the table's).
LIST_FIELDS = ("past_decisions", "sensitivities", "topics")


@dataclass(frozen=True)
class Limits:
    """How much a profile holds. Past a list's bound the oldest items are dropped on merge; a
    request that exceeds a per-item or per-request bound is refused, never trimmed."""

    max_past_decisions: int = 20
    """Past decisions kept per profile (newest first; the oldest dropped past it)."""
    max_sensitivities: int = 20
    """Sensitivities kept per profile."""
    max_topics: int = 30
    """Topics kept per profile."""
    max_item_chars: int = 500
    """Characters in one decision, sensitivity or topic; longer is refused."""
    max_style_chars: int = 1000
    """Characters in a communication style; longer is refused."""
    max_subject_chars: int = 200
    """Characters in a subject's handle or external id."""
    max_turn_id_chars: int = 200
    """Characters in a turn id."""
    max_subjects_per_get: int = 50
    """Subjects one GetProfiles call may name."""
    kept_observations: int = 200
    """Recorded observations kept per profile: the newest ones, plus, past them, the first to
    state each entry the profile still holds (what added it); the rest are deleted on merge."""

    @property
    def max_provenance_observations(self) -> int:
        """The most observations a profile keeps (what GetProfileProvenance reads)."""
        return self.kept_observations + 1 + self.max_past_decisions + self.max_sensitivities + self.max_topics

    def bound(self, field: str) -> int:
        return {
            "past_decisions": self.max_past_decisions,
            "sensitivities": self.max_sensitivities,
            "topics": self.max_topics,
        }[field]


@dataclass(frozen=True)
class Subject:
    """A counterparty: a handle, or an external id where there is none, on a platform."""

    platform: str
    handle: str | None
    external_id: str | None

    @property
    def key(self) -> str:
        """The key a profile is filed under: the handle, or the external id with no handle."""
        key = self.handle or self.external_id
        assert key is not None
        return key


@dataclass(frozen=True)
class Observation:
    """One observation pass about one subject, already validated (items stripped, non-empty)."""

    communication_style: str | None
    past_decisions: tuple[str, ...]
    sensitivities: tuple[str, ...]
    topics: tuple[str, ...]
    turn_id: str | None


@dataclass(frozen=True)
class ObservationSource:
    """Where one observation came from (issue 17): the turn, the people whose messages it was
    derived from (handle, external id, platform), the model, the prompt version, the writer."""

    turn_ids: tuple[str, ...] = ()
    work_key: str = ""
    subjects: tuple[tuple[str, str, str], ...] = ()
    model: str = ""
    prompt_version: str = ""
    writer: str = ""

    @property
    def identifiers(self) -> list[str]:
        """The handles and external ids it names (what an erasure matches on)."""
        return sorted({x for h, e, _ in self.subjects for x in (h, e) if x})


@dataclass(frozen=True)
class ObservationRecord:
    """One observation as it was merged into a profile, kept with its source."""

    id: uuid.UUID
    profile_id: uuid.UUID
    source: ObservationSource
    communication_style: str
    past_decisions: tuple[str, ...]
    sensitivities: tuple[str, ...]
    topics: tuple[str, ...]
    observe_time: datetime


@dataclass(frozen=True)
class EntryOrigin:
    """One entry of a profile and the observations (oldest first) that stated it."""

    field: str
    text: str
    observations: tuple[ObservationRecord, ...]


@dataclass(frozen=True)
class Profile:
    id: uuid.UUID
    company: str
    observer: str
    subject: Subject
    subject_key: str
    """The key the row is filed under (stable, even when the row later learns a handle)."""
    communication_style: str
    past_decisions: tuple[str, ...]
    sensitivities: tuple[str, ...]
    topics: tuple[str, ...]
    observation_count: int
    create_time: datetime
    update_time: datetime
    last_turn_id: str | None


def merge_list(observed: Sequence[str], stored: Iterable[str], bound: int) -> tuple[str, ...]:
    """Newest first: the observed items (in the order given) ahead of the stored ones, each item
    once by :func:`item_key` (a re-observed item moves to the front in its newest spelling), cut
    to ``bound`` by dropping the oldest."""
    out: list[str] = []
    seen: set[str] = set()
    for item in (*observed, *stored):
        key = item_key(item)
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
        if len(out) == bound:
            break
    return tuple(out)


def empty(company: str, observer: str, subject: Subject, now: datetime) -> Profile:
    """A profile nothing has been observed into yet (what the first observation merges into)."""
    return Profile(
        id=uuid.uuid4(),
        company=company,
        observer=observer,
        subject=subject,
        subject_key=subject.key,
        communication_style="",
        past_decisions=(),
        sensitivities=(),
        topics=(),
        observation_count=0,
        create_time=now,
        update_time=now,
        last_turn_id=None,
    )


def merge(profile: Profile, subject: Subject, obs: Observation, limits: Limits, now: datetime) -> Profile:
    """The stored profile with one more observation of ``subject`` merged into it."""
    lists = {f: merge_list(getattr(obs, f), getattr(profile, f), limits.bound(f)) for f in LIST_FIELDS}
    # The row's id, owner, key and creation stay; the rest is the observation merged in.
    return replace(
        profile,
        # The row learns (or updates) whichever of the subject's handle and external id an
        # observation carries; its key never changes.
        subject=Subject(
            platform=profile.subject.platform,
            handle=profile.subject.handle or subject.handle,
            external_id=subject.external_id or profile.subject.external_id,
        ),
        communication_style=obs.communication_style or profile.communication_style,
        past_decisions=lists["past_decisions"],
        sensitivities=lists["sensitivities"],
        topics=lists["topics"],
        observation_count=profile.observation_count + 1,
        update_time=now,
        last_turn_id=obs.turn_id or profile.last_turn_id,
    )


def trace_entries(profile: Profile, observations: Sequence[ObservationRecord]) -> list[EntryOrigin]:
    """Every entry the profile holds now, with the observations that stated it (by
    :func:`item_key`, the merge's own sameness), oldest first: the first of them added it."""
    oldest_first = sorted(observations, key=lambda o: (o.observe_time, str(o.id)))
    out: list[EntryOrigin] = []
    if profile.communication_style:
        key = item_key(profile.communication_style)
        found = tuple(o for o in oldest_first if o.communication_style and item_key(o.communication_style) == key)
        out.append(EntryOrigin("communication_style", profile.communication_style, found))
    for f in LIST_FIELDS:
        for item in getattr(profile, f):
            key = item_key(item)
            found = tuple(o for o in oldest_first if any(item_key(x) == key for x in getattr(o, f)))
            out.append(EntryOrigin(f, item, found))
    return out


def prunable(profile: Profile, older: Sequence[ObservationRecord]) -> list[uuid.UUID]:
    """Of the recorded observations past the newest kept ones (``older``, all older than those),
    the ones to delete: every one but the first (oldest) to state each entry the profile still
    holds — an entry stays traceable to the turn that added it, and the history stays bounded."""
    keep = {e.observations[0].id for e in trace_entries(profile, older) if e.observations}
    return [o.id for o in older if o.id not in keep]
