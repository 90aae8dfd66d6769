"""What a worker records with a row it writes (issue 17, ``agentlearn.common.v1.Provenance``): the
turn (run id, work key), the people whose messages it rests on, the model and the prompt version."""

from __future__ import annotations

import hashlib

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from services.reflector.domain import Turn

__all__ = ["prompt_version", "provenance_of"]


def prompt_version(*texts: str) -> str:
    """A prompt's version: a digest of its text (a change to the prompt is a new version)."""
    return hashlib.sha256("\x1f".join(texts).encode()).hexdigest()[:16]


def provenance_of(turn: Turn, writer: str, model: str, version: str) -> provenance_pb2.Provenance:
    """The turn's provenance: every sender but the seat itself, none left out (an erasure finds her
    rows by it). ``ErasureSubject`` takes every sender SubmitTurn accepts, and ``subjects`` as many
    as a turn carries, so the write never fails on who sent the turn."""
    seen: dict[tuple[str, str, str], erasure_pb2.ErasureSubject] = {}
    for inter in turn.interactions:
        s = inter.sender
        if (s.handle or "").casefold() == turn.seat.casefold():
            continue
        if s.handle or s.external_id:
            key = (s.handle, s.external_id, s.platform)
            seen[key] = erasure_pb2.ErasureSubject(handle=s.handle, external_id=s.external_id, platform=s.platform)
    return provenance_pb2.Provenance(
        turn_ids=[turn.turn_id],
        work_key=turn.work_key,
        subjects=list(seen.values()),
        model=model,
        prompt_version=version,
        writer=writer,
    )
