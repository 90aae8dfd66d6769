"""A person's naming takes every sender a turn may carry (SubmitTurn's ``Sender``): a one-letter
GitHub login, a platform written "MS Teams", as many people as a turn's 1000 interactions. The
protection the contract gave (a one-letter handle matched as a word in every text) is the erasure
matcher's: such an identifier is matched in structured columns only."""

from __future__ import annotations

import uuid

from agentlearn.common.v1 import erasure_pb2, provenance_pb2
from libs.common.contract import violations
from libs.common.erasure import Kind, Target


def test_every_sender_submit_turn_accepts_is_a_person_and_a_turns_senders_fit_one_provenance() -> None:
    for person in (
        erasure_pb2.ErasureSubject(handle="q", platform="github"),
        erasure_pb2.ErasureSubject(handle="dana", platform="MS Teams"),
        erasure_pb2.ErasureSubject(external_id="7", platform="slack"),
    ):
        assert not violations(person), person
    people = [erasure_pb2.ErasureSubject(handle=f"user{i}", platform="slack") for i in range(1000)]
    assert not violations(provenance_pb2.Provenance(turn_ids=["run-1"], subjects=people))
    people.append(erasure_pb2.ErasureSubject(handle="one-more", platform="slack"))
    assert violations(provenance_pb2.Provenance(turn_ids=["run-1"], subjects=people))


def test_a_one_letter_identifier_is_hers_in_columns_but_never_a_word_in_text() -> None:
    target = Target(uuid.uuid4(), "acme", Kind.SUBJECT, handle="q", external_id="U7", names=("Quinn",))
    assert target.identifiers == ["q", "U7"]  # her rows by column: every identifier
    assert target.terms == ["Quinn", "U7"]
    assert not target.names_text("pick option q, then press enter")
    assert target.names_text("ask Quinn about it", "user U7 asked")
    alone = Target(uuid.uuid4(), "acme", Kind.SUBJECT, handle="q")
    assert alone.terms == [] and alone.sql_pattern() == "a^"  # matches no text at all
