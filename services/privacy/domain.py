"""The privacy service's domain: an erasure, its states, the owners it asks."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from libs.common.erasure import ERASE_ROUNDS, Kind, Report, Target

__all__ = [
    "COLLECTORS",
    "DOMAIN",
    "ERASE_ORDER",
    "JOB_KIND",
    "MAX_ROUNDS",
    "ClaimLost",
    "Erasure",
    "ErasureState",
    "Holder",
    "report_key",
    "request_digest",
    "same_request",
    "subject_digest",
]

DOMAIN = "privacy.agentlearn.dev"
JOB_KIND = "erasure"
"""The erasure's kind in the shared durable queue (libs/common/jobs.py)."""

COLLECTORS = ("episodes", "reflector", "sessions", "profiles")
"""The owners that know which run ids and sessions carried a person, or which other identifiers
are theirs (the reflector's senders and the profiles pair a handle with its external id), asked
first."""
ERASE_ORDER = (
    "sessions", "knowledge", "diary", "episodes", "profiles", "skills", "reflector", "prefetch", "telemetry",
)  # fmt: skip
"""Every owner, in the order asked: the sessions first, since their erased lessons name the
knowledge pages the knowledge owner removes next."""
MAX_ROUNDS = ERASE_ROUNDS
"""Erase rounds of one erasure: a verification that finds rows written after the erase step (a
reflection of the person that was running when it started) erases again, at most this many times
in all; what a last round still finds is reported (FAILED, the residues named)."""


@dataclass(frozen=True)
class Holder:
    """The claim an erasure runs under: its job's id, the holder, the claim's attempt (the fence of
    ``libs.common.jobs``). Every write of a run is made only while this claim is held, in the same
    statement that checks it: a holder whose lease lapsed and whose erasure another holder finished
    writes nothing (it used to write the person's identifiers back into a SUCCEEDED audit row)."""

    job_id: int
    worker: str
    attempts: int


class ClaimLost(Exception):
    """The run's claim is no longer held (its lease lapsed; another holder has the erasure): the
    run stops, its new holder's outcome stands."""


def report_key(owner: str, round_: int) -> str:
    """Where an owner's report of a round is kept in ``erasures.reports``."""
    return owner if round_ <= 1 else f"{owner}#{round_}"


class ErasureState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (ErasureState.SUCCEEDED, ErasureState.FAILED)


def subject_digest(target: Target) -> str:
    """Names a person's erasure in the audit without naming the person."""
    if target.kind is not Kind.SUBJECT:
        return ""
    key = "\x1f".join([target.platform, target.handle, target.external_id])
    return hashlib.sha256(key.encode()).hexdigest()


def request_digest(target: Target) -> str:
    """What a retry under the same ``request_id`` must repeat: the kind, the seat, the person's
    identifiers and the names (as a set, folded as the owners match them: case-insensitively, as
    whole words). A digest, like ``subject_digest``: the audit row outlives the target and keeps no
    copy of the person."""
    names = sorted({" ".join(n.split()).casefold() for n in target.names} - {""})
    key = "\x1f".join([str(target.kind), target.seat, target.platform, target.handle, target.external_id, *names])
    return hashlib.sha256(key.encode()).hexdigest()


def same_request(erasure: Erasure, target: Target) -> bool:
    """``target`` is a retry of the request that queued ``erasure`` (both under one key). A row
    queued before the request digest was kept has none: its person is compared by
    ``subject_digest`` (the names it was given are gone)."""
    if erasure.request_digest:
        return erasure.request_digest == request_digest(target)
    same_scope = erasure.kind is target.kind and erasure.seat == target.seat
    return same_scope and erasure.subject_digest == subject_digest(target)


@dataclass
class Erasure:
    id: uuid.UUID
    company: str
    kind: Kind
    seat: str
    subject_digest: str
    requested_by: str
    state: ErasureState
    create_time: datetime
    target: Target | None = None
    collected: bool = False
    reports: dict[str, Report] = field(default_factory=dict)
    residues: dict[str, Report] = field(default_factory=dict)
    verified: bool = False
    reason: str = ""
    finish_time: datetime | None = None
    round: int = 1
    pending_checks: list[str] = field(default_factory=list)
    request_digest: str = ""
    """``request_digest`` of the request that queued it (empty on a row queued before it was kept)."""

    def receipt(self) -> dict[str, Report]:
        """One report per owner: every round's folded into the first's."""
        out: dict[str, Report] = {}
        for key in sorted(self.reports, key=lambda k: (k.partition("#")[0], int(k.partition("#")[2] or 1))):
            owner = key.partition("#")[0]
            report = self.reports[key]
            if owner not in out:
                out[owner] = Report.from_json(report.to_json())
                out[owner].owner = owner
            else:
                out[owner].merge(report)
        return out
