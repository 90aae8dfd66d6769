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
    "combine",
    "empty",
    "grouped",
    "identifiers_of",
    "item_key",
    "linked",
    "merge",
    "merge_list",
    "newest",
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
    max_request_id_chars: int = 1100
    """Characters in an idempotency key: the profiler's longest fits (a work key of 256, then
    ``:profiler:`` and a platform of 64 and an identifier of 200, each of those two escaped:
    ``senders.subject_part``, up to three characters for one), so every sender a turn may carry is
    profiled."""
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

    @property
    def identifiers(self) -> tuple[str, ...]:
        """The handle and the external id it was named by (whichever it has)."""
        return tuple(x for x in (self.handle, self.external_id) if x)

    def names(self, profile: Profile) -> bool:
        """Whether ``profile`` is this subject's, by either identifier: one of them is the row's
        key, handle or external id (handles and external ids share one key space per platform, as
        the unique index has it), on the same platform. A row filed under one identifier is found
        by the other once it has learned it."""
        return profile.subject.platform == self.platform and not identifiers_of(profile).isdisjoint(self.identifiers)


def identifiers_of(profile: Profile) -> set[str]:
    """Every identifier a row knows its subject by: its key, its handle, its external id."""
    return {x for x in (profile.subject_key, profile.subject.handle, profile.subject.external_id) if x}


def linked(subject: Subject, rows: Iterable[Profile]) -> list[Profile]:
    """The rows of ``subject``, oldest first: the ones it names, and the ones those name in turn (a
    row under the handle that learned the external id links the row filed under that external id
    alone): one person, however the rows were filed before an upsert found a row by either id."""
    pool = [p for p in rows if p.subject.platform == subject.platform]
    known = set(subject.identifiers)
    mine: dict[uuid.UUID, Profile] = {}
    grew = True
    while grew:
        grew = False
        for p in pool:
            if p.id not in mine and not identifiers_of(p).isdisjoint(known):
                mine[p.id] = p
                known |= identifiers_of(p)
                grew = True
    return sorted(mine.values(), key=lambda p: (p.create_time, str(p.id)))


def grouped(rows: Iterable[Profile]) -> list[list[Profile]]:
    """``rows`` by person, each oldest first: the rows sharing an identifier on their platform,
    directly or through another of them, as ``linked`` finds one subject's; one pass over the
    rows' identifiers (a union-find), not ``linked`` from every row."""
    pool = list({p.id: p for p in rows}.values())
    parent = list(range(len(pool)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, p in enumerate(pool):
        for x in identifiers_of(p):
            parent[root(i)] = root(first.setdefault((p.subject.platform, x), i))
    people: dict[int, list[Profile]] = {}
    for i, p in enumerate(pool):
        people.setdefault(root(i), []).append(p)
    return [sorted(mine, key=lambda p: (p.create_time, str(p.id))) for mine in people.values()]


def newest(rows: Iterable[Profile]) -> Profile:
    """The most recently updated of a person's rows, by (update_time, id) as ListProfiles orders
    rows: where the person is listed, its rows combined (``combine``)."""
    return max(rows, key=lambda p: (p.update_time, p.id))


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


def _learned(profile: Profile, handle: str | None, external_id: str | None) -> Subject:
    """The row's subject once it has seen ``handle`` and ``external_id``: it learns whichever it
    lacks; a known handle stays, and so does the external id of a row filed under it (its key never
    changes: the table's CHECK holds the key to one of the two), while the external id beside a
    handle key follows the newest."""
    keyed_by_external = profile.subject_key != profile.subject.handle
    return Subject(
        platform=profile.subject.platform,
        handle=profile.subject.handle or handle,
        external_id=(
            profile.subject.external_id if keyed_by_external else (external_id or profile.subject.external_id)
        ),
    )


def combine(rows: Sequence[Profile], limits: Limits) -> Profile:
    """Several rows of one person as one: rows written before an upsert found a row by either
    identifier (a person first seen by external id, then by handle, got a second row), or by two
    first observations that shared no identifier. The first created keeps its id, key and creation
    time; the lists are the newest row's items ahead of the older rows' (each once, bounded as a
    merge bounds them), the style and last turn the newest non-empty, the counts summed. A read
    answers this, and the next upsert naming the person writes it (folding the others away)."""
    first = min(rows, key=lambda p: (p.create_time, str(p.id)))
    if len(rows) == 1:
        return first
    newest = sorted(rows, key=lambda p: (p.update_time, str(p.id)), reverse=True)
    subject = first.subject
    for p in newest:
        subject = _learned(replace(first, subject=subject), p.subject.handle, p.subject.external_id)
    lists = {f: merge_list([x for p in newest for x in getattr(p, f)], (), limits.bound(f)) for f in LIST_FIELDS}
    return replace(
        first,
        subject=subject,
        communication_style=next((p.communication_style for p in newest if p.communication_style), ""),
        past_decisions=lists["past_decisions"],
        sensitivities=lists["sensitivities"],
        topics=lists["topics"],
        observation_count=sum(p.observation_count for p in rows),
        update_time=newest[0].update_time,
        last_turn_id=next((p.last_turn_id for p in newest if p.last_turn_id), None),
    )


def merge(profile: Profile, subject: Subject, obs: Observation, limits: Limits, now: datetime) -> Profile:
    """The stored profile with one more observation of ``subject`` merged into it."""
    lists = {f: merge_list(getattr(obs, f), getattr(profile, f), limits.bound(f)) for f in LIST_FIELDS}
    # The row's id, owner, key and creation stay; the rest is the observation merged in.
    return replace(
        profile,
        # The row learns whichever of the subject's handle and external id it lacks (_learned).
        subject=_learned(profile, subject.handle, subject.external_id),
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
