"""The privacy service's domain: an erasure, its states, the owners it asks."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from libs.common.erasure import Kind, Report, Target

__all__ = ["COLLECTORS", "DOMAIN", "ERASE_ORDER", "JOB_KIND", "Erasure", "ErasureState", "subject_digest"]

DOMAIN = "privacy.agentlearn.dev"
JOB_KIND = "erasure"
"""The erasure's kind in the shared durable queue (libs/common/jobs.py)."""

COLLECTORS = ("episodes", "reflector", "sessions")
"""The owners that know which run ids and sessions carried a person (asked first)."""
ERASE_ORDER = (
    "sessions", "knowledge", "diary", "episodes", "profiles", "skills", "reflector", "prefetch", "telemetry",
)  # fmt: skip
"""Every owner, in the order asked: the sessions first, since their erased lessons name the
knowledge pages the knowledge owner removes next."""


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
