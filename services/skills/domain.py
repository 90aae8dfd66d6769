"""The skills' domain: skills, versions, the gates' arithmetic, the body's practice section and the
greedy clustering of turns. Everything here is pure (no I/O), so the rules read as data."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.clustering import ToolCluster, greedy_groups, jaccard, tool_set
from libs.common.text_fold import fold as normalized  # case and spacing do not make a name or body new

__all__ = [
    "BERLOT_ATTWELL_THRESHOLD",
    "DOMAIN",
    "PRACTICE_HEADING",
    "CandidateVerdict",
    "Cluster",
    "Gate",
    "LearningHealth",
    "ObservationKind",
    "Skill",
    "SkillChange",
    "SkillDraft",
    "SkillEdit",
    "SkillKey",
    "SkillState",
    "SkillTrigger",
    "SkillVersion",
    "Turn",
    "append_practice_bullet",
    "best_match",
    "greedy_clusters",
    "jaccard",
    "normalized",
    "practice_bullet",
    "remove_practice_bullets",
    "tool_set",
]

DOMAIN = "skills.agentlearn.dev"
PRACTICE_HEADING = "## What practice added"
BERLOT_ATTWELL_THRESHOLD = 0.1
"""avg_uses_per_skill below this: the library is not doing what it claims (Berlot-Attwell et al.)."""
NAME_MAX_CHARS = 100
SUMMARY_MAX_CHARS = 1000
REASON_MAX_CHARS = 1000
OBSERVATION_MAX_CHARS = 1000
MAX_IDS_PER_CALL = 500
MAX_TOOLS = 500


class SkillState(StrEnum):
    ACTIVE = "active"
    STALE = "stale"
    ARCHIVED = "archived"


class SkillTrigger(StrEnum):
    SINGLE = "single"
    CLUSTERED = "clustered"


class SkillChange(StrEnum):
    CREATED = "created"
    REFINED = "refined"
    OBSERVATION_APPENDED = "observation_appended"
    ROLLED_BACK = "rolled_back"


class ObservationKind(StrEnum):
    OBSERVED = "observed"
    COUNTER_EXAMPLE = "counter_example"


class ObservationSkip(StrEnum):
    """Why an observation was not appended (the proto's ObservationSkipReason)."""

    BODY_CAP = "body_cap"  # the bullet would take the body past max_body_chars
    ARCHIVED = "archived"  # archived meanwhile: the refiner does not resurrect it


class Gate(StrEnum):
    OPEN = "open"
    CATALOGUE_FULL = "catalogue_full"
    DUPLICATE = "duplicate"


_BULLET_PREFIX = {
    ObservationKind.OBSERVED: "Observed in practice:",
    ObservationKind.COUNTER_EXAMPLE: "Counter-example:",
}


@dataclass(frozen=True)
class SkillDraft:
    """What a new skill is written from, whichever path drafted it (CreateSkill, an approved
    proposal, the clustered pass): ``SkillService.create`` and the store's insert take it, and a
    :class:`Skill` is one as the catalogue keeps it."""

    name: str
    summary: str
    body: str
    tool_sequence: tuple[str, ...]
    trigger: SkillTrigger
    cluster_size: int
    source_turn_ids: tuple[str, ...]

    @staticmethod
    def single(name: str, summary: str, body: str, tools: Sequence[str], source: str) -> SkillDraft:
        """A draft from one source (a turn, a session, a proposal): a cluster of one."""
        return SkillDraft(name, summary, body, tuple(tools), SkillTrigger.SINGLE, 1, (source,))

    @staticmethod
    def clustered(name: str, summary: str, body: str, tools: Sequence[str], sources: Sequence[str]) -> SkillDraft:
        """A draft from a cluster of turns: its size is how many they are."""
        return SkillDraft(name, summary, body, tuple(tools), SkillTrigger.CLUSTERED, len(sources), tuple(sources))


@dataclass(frozen=True)
class Skill(SkillDraft):
    """A draft in a seat's catalogue: its identity, its lifecycle state and its use."""

    id: uuid.UUID
    company: str
    seat: str
    state: SkillState
    pinned: bool
    version: int
    use_count: int
    last_used_time: datetime | None
    last_offered_time: datetime | None
    unused_since: datetime
    state_change_time: datetime
    create_time: datetime
    update_time: datetime
    change: SkillChange
    change_reason: str
    restored_from_version: int | None

    @property
    def live(self) -> bool:
        return self.state is not SkillState.ARCHIVED

    def days_unused(self, now: datetime) -> int:
        return max(0, (now - self.unused_since).days)


@dataclass(frozen=True)
class SkillEdit:
    """A new body for a skill (a refinement, an observation, a rollback) and what its version keeps
    beside it: the change and its reason, where the body came from, the version it restores and
    the idempotency key of the call that made it."""

    body: str
    change: SkillChange
    reason: str
    provenance: Provenance
    restored_from: int | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class SkillVersion:
    skill_id: uuid.UUID
    version: int
    body: str
    change: SkillChange
    reason: str
    restored_from_version: int | None
    create_time: datetime
    supersede_time: datetime | None
    current: bool


@dataclass(frozen=True)
class CandidateVerdict:
    gate: Gate
    live_count: int
    max_skills: int
    threshold: float
    duplicate: tuple[Skill, float] | None = None


@dataclass(frozen=True)
class LearningHealth:
    company: str
    seat: str
    total_skills: int = 0
    skills_used_at_least_once: int = 0
    total_skill_uses: int = 0
    most_recent_skill_use: datetime | None = None
    avg_uses_per_skill: float = 0.0
    avg_skill_age_days: float = 0.0
    active_skills: int = 0
    stale_skills: int = 0
    archived_skills: int = 0

    @property
    def below_threshold(self) -> bool:
        """Only a seat that has skills can be below it: an empty library claims nothing."""
        return self.total_skills > 0 and self.avg_uses_per_skill < BERLOT_ATTWELL_THRESHOLD


# ------------------------------------------------------------------------------ tool-set gates


def best_match(tools: Iterable[str], skills: Sequence[Skill]) -> tuple[Skill, float] | None:
    """The skill whose tool set is most similar (ties: the older skill, then the name)."""
    candidate = tool_set(tools)
    best: tuple[Skill, float] | None = None
    for skill in sorted(skills, key=lambda s: (s.create_time, s.name)):
        sim = jaccard(candidate, skill.tool_sequence)
        if best is None or sim > best[1]:
            best = (skill, sim)
    return best


# ------------------------------------------------------------------------ the practice section

_HEADING_LINE = re.compile(r"^#{1,2}\s")


def practice_bullet(kind: ObservationKind, observation: str) -> str:
    """One line: the kind's prefix and the observation, its line breaks folded into spaces. A
    prefix the writer already put there is not doubled."""
    text = " ".join(observation.split())
    prefix = _BULLET_PREFIX[kind]
    for known in _BULLET_PREFIX.values():
        if text.lower().startswith(known.lower()):
            text = text[len(known) :].strip()
            break
    return f"- {prefix} {text}"


def append_practice_bullet(body: str, bullet: str) -> str:
    """The body with ``bullet`` under the one ``## What practice added`` heading at its end.

    The first bullet creates the heading at the end. Later bullets go at the end of that section;
    if the section is no longer last (a manual refinement wrote after it), it is moved to the end
    with the new bullet, so the reader still meets the procedure first and what practice added
    second, under one heading.
    """
    lines = body.rstrip("\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == PRACTICE_HEADING), None)
    if start is None:
        sep = "\n\n" if body.strip() else ""
        return f"{body.rstrip()}{sep}{PRACTICE_HEADING}\n\n{bullet}\n"
    end = next((i for i in range(start + 1, len(lines)) if _HEADING_LINE.match(lines[i])), len(lines))
    section = [line for line in lines[start + 1 : end] if line.strip()]
    rest = lines[:start] + lines[end:]
    head = "\n".join(rest).rstrip()
    bullets = "\n".join([*section, bullet])
    sep = "\n\n" if head else ""
    return f"{head}{sep}{PRACTICE_HEADING}\n\n{bullets}\n"


def remove_practice_bullets(body: str, bullets: Iterable[str]) -> str:
    """The body without ``bullets`` (one line each, as appended) under the practice heading; the
    heading goes too when no bullet is left under it. The inverse of :func:`append_practice_bullet`,
    so an erasure re-renders a skill from its remaining bullets without a model. Lines outside the
    section are never touched."""
    lines = body.rstrip("\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == PRACTICE_HEADING), None)
    if start is None:
        return body
    end = next((i for i in range(start + 1, len(lines)) if _HEADING_LINE.match(lines[i])), len(lines))
    section = [line for line in lines[start + 1 : end] if line.strip()]
    for bullet in bullets:
        if bullet in section:
            section.remove(bullet)  # one occurrence per bullet: another's identical line stays
    head = "\n".join(lines[:start]).rstrip()
    tail = "\n".join(lines[end:]).strip("\n")
    parts = [head] if head else []
    if section:
        parts.append(PRACTICE_HEADING + "\n\n" + "\n".join(section))
    if tail:
        parts.append(tail)
    return "\n\n".join(parts) + "\n" if parts else ""


# ----------------------------------------------------------------------------------- clustering


@dataclass(frozen=True)
class Turn:
    """A settled raw turn as the clustered pass reads it."""

    turn_id: str
    tool_sequence: tuple[str, ...]
    """The final round's tools, in order."""
    label: str = ""
    ask: str = ""
    what_it_did: str = ""
    outcome: str = ""  # "done" | "failed"
    end_time: datetime | None = None
    consolidated_into_skill_id: str = ""
    """Set when a skill was already drafted from this turn: it is not evidence again."""
    role: str = ""
    """The seat's role when the turn ran: whose llm_auxiliary chain drafts from it."""
    tools_called: tuple[str, ...] = ()
    """Every tool call the turn made, in order."""
    subjects: tuple[str, ...] = ()
    """The people whose messages the turn answered (handles or external ids): a draft from it
    rests on them (issue 17)."""

    @property
    def run(self) -> tuple[str, ...]:
        """The turn's run of tools: every call it made, in order, or its final round when no calls
        were recorded. Its set is the turn's tool set — the same definition the single-turn
        synthesizer and CreateSkill use, so a skill drafted by either path is compared with new
        turns on one footing (a final round is often the answer alone)."""
        return self.tools_called or self.tool_sequence


class Cluster(ToolCluster[Turn]):
    """One seat's turns that ran the same procedure."""

    @staticmethod
    def tools_of(member: Turn) -> Sequence[str]:
        return member.run


def greedy_clusters(turns: Sequence[Turn], threshold: float) -> list[Cluster]:
    """Greedy single pass: each turn joins the first cluster whose seed's tool set is at least
    ``threshold`` similar, else seeds a new one. Returned largest first; among equals, the one
    whose seed is newest (``turns`` come newest first)."""
    clusters = [Cluster(group) for group in greedy_groups(turns, Cluster.tools_of, threshold)]
    order = {id(c): i for i, c in enumerate(clusters)}
    return sorted(clusters, key=lambda c: (-c.size, order[id(c)]))


# ----------------------------------------------------------------------------------- proposals


class ProposalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class ProposalOrigin(StrEnum):
    SESSION_CHECK = "session_check"
    DISTILL_SKILL = "distill_skill"


class ProposalDisposition(StrEnum):
    CREATED = "created"
    ALREADY_PROPOSED = "already_proposed"
    DUPLICATE_PROPOSAL = "duplicate_proposal"
    DUPLICATE_SKILL = "duplicate_skill"
    SUPPRESSED = "suppressed"


class DuplicateCheck(StrEnum):
    EXACT_NAME = "exact_name"
    EXACT_BODY = "exact_body"
    TOOL_SET = "tool_set"
    EMBEDDING = "embedding"


@dataclass(frozen=True)
class SkillProposal:
    """A skill candidate waiting for (or past) a person's decision. Never a live skill by itself."""

    id: uuid.UUID
    company: str
    seat: str
    name: str
    summary: str
    body: str
    tool_sequence: tuple[str, ...]
    origin: ProposalOrigin
    session_id: str
    check_id: str
    evidence_ids: tuple[str, ...]
    turn_id: str
    state: ProposalState
    create_time: datetime
    decide_time: datetime | None = None
    decided_by: str = ""
    decision_reason: str = ""
    skill_id: uuid.UUID | None = None
    # What the proposer recorded beyond its source (issue 17): the model and prompt version that
    # proposed it, the people it rests on. An approval carries it onto the live skill.
    provenance: Provenance = field(default_factory=Provenance)

    @property
    def source_ref(self) -> str:
        """What the live skill names as its source: the turn, else the session, else the proposal."""
        if self.turn_id:
            return self.turn_id
        if self.session_id:
            return f"session:{self.session_id}"
        return f"proposal:{self.id}"

    def as_draft(self) -> SkillDraft:
        """What its approval writes: a SINGLE skill from its source, with its text and tools."""
        return SkillDraft.single(self.name, self.summary, self.body, self.tool_sequence, self.source_ref)


@dataclass(frozen=True)
class ProposalDecision:
    """A person's decision on a pending proposal: the state it moves to, who decided and why, and
    for an approval the skill it became."""

    state: ProposalState
    reviewer: str
    reason: str
    skill_id: uuid.UUID | None = None


@dataclass(frozen=True)
class ProposalMatch:
    check: DuplicateCheck
    name: str
    similarity: float
    skill_id: uuid.UUID | None = None
    proposal_id: uuid.UUID | None = None


def describe_skill(name: str, summary: str) -> str:
    """What a skill's embedding is of: its name and its summary."""
    return f"{name}: {summary}"


@dataclass(frozen=True)
class SkillKey:
    """One skill of a seat: by id or by name (exactly one is set)."""

    company: str
    seat: str
    id: uuid.UUID | None = None
    name: str | None = None

    def args(self) -> tuple[str, str, uuid.UUID | None, str | None]:
        return self.company, self.seat, self.id, self.name

    def describe(self) -> str:
        return str(self.id) if self.id is not None else repr(self.name)
