"""The builtin requests' enum fields beside the deprecated strings they replace (the enum decides,
the string is still honoured alone, the two disagreeing is refused naming both), and failure texts
that say the service and a status code, never an exception's text. Real services over gRPC."""

from __future__ import annotations

import grpc
import pytest

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as diary_grpc
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.prefetch.v1 import prefetch_service_pb2 as pb
from libs.common.errors import InvalidArgument
from services.prefetch.downstream_errors import rpc_failure
from tests.test_prefetch_support import default_settings, open_env, refused


@pytest.fixture
async def env(make_settings, dsn, clock, local_embedder, edge_index):
    async with open_env(default_settings(make_settings), dsn, clock, embedder=local_embedder, index=edge_index) as e:
        yield e


def persist(env, **kw):  # type: ignore[no-untyped-def]
    return env.builtins.ReflectAndPersist(
        pb.ReflectAndPersistRequest(company="acme", seat="ana", turn_id="t1", content="Sprint freeze this week.", **kw)
    )


async def tier_of_note(env, note_id: str) -> int:  # type: ignore[no-untyped-def]
    return (await env.diary.GetNote(diary_pb.GetNoteRequest(company="acme", seat="ana", note_id=note_id))).note.tier


async def test_note_tier_decides_and_the_deprecated_tier_is_still_honoured(env):
    by_enum = await persist(env, note_tier=diary_pb.NOTE_TIER_SHORT, ttl_days=5)
    assert await tier_of_note(env, by_enum.note_id) == diary_pb.NOTE_TIER_SHORT
    by_string = await persist(env, tier="short", ttl_days=5)
    assert await tier_of_note(env, by_string.note_id) == diary_pb.NOTE_TIER_SHORT
    agreeing = await persist(env, tier="SHORT", note_tier=diary_pb.NOTE_TIER_SHORT, ttl_days=5)
    assert await tier_of_note(env, agreeing.note_id) == diary_pb.NOTE_TIER_SHORT
    default = await persist(env)
    assert await tier_of_note(env, default.note_id) == diary_pb.NOTE_TIER_LONG

    code, info, bad = await refused(persist(env, tier="long", note_tier=diary_pb.NOTE_TIER_SHORT, ttl_days=5))
    assert code.name == "INVALID_ARGUMENT" and info.reason == "FIELD_CONFLICT"
    assert [v.field for v in bad.field_violations] == ["tier", "note_tier"]
    assert info.metadata["note_tier"] == "NOTE_TIER_SHORT" and info.metadata["tier"] == "long"
    _, info, bad = await refused(persist(env, note_tier=7))
    assert info.reason == "FIELD_INVALID" and bad.field_violations[0].field == "note_tier"


async def test_outcome_filters_episodes_and_the_deprecated_outcome_filter_is_still_honoured(env):
    done = await env.turn("Task assigned: export", "Run the export", "Ran it.")
    failed = await env.turn("Task assigned: deploy", "Deploy the api", "It failed.", outcome=ep_pb.TURN_OUTCOME_FAILED)

    def query(**kw):  # type: ignore[no-untyped-def]
        return env.builtins.QueryEpisodes(pb.QueryEpisodesRequest(company="acme", seat="ana", **kw))

    assert list((await query(outcome=ep_pb.TURN_OUTCOME_FAILED)).episode_ids) == [failed.id]
    assert list((await query(outcome_filter="done")).episode_ids) == [done.id]
    assert set((await query()).episode_ids) == {done.id, failed.id}
    code, info, bad = await refused(query(outcome_filter="done", outcome=ep_pb.TURN_OUTCOME_FAILED))
    assert code.name == "INVALID_ARGUMENT" and info.reason == "FIELD_CONFLICT"
    assert {v.field for v in bad.field_violations} == {"outcome_filter", "outcome"}


async def test_a_failure_text_is_the_service_and_a_status_code_never_an_exceptions_text():
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nothing listens on port 1
        with pytest.raises(grpc.aio.AioRpcError) as unreachable:
            await diary_grpc.DiaryServiceStub(channel).ListNotes(
                diary_pb.ListNotesRequest(company="acme", seat="ana"), timeout=5
            )
    assert str(unreachable.value).startswith("<AioRpcError")  # what a summary must never carry
    assert rpc_failure("diary", unreachable.value) == "diary: UNAVAILABLE"
    assert rpc_failure("personal_memory", unreachable.value) == "diary: UNAVAILABLE"  # a block names its source
    assert rpc_failure("similar_prior_work", TimeoutError()) == "episodes: DEADLINE_EXCEEDED"
    refusal = InvalidArgument("bad", reason="FIELD_INVALID", field="x")
    assert rpc_failure("skills", refusal) == "skills: INVALID_ARGUMENT"
    assert rpc_failure("relevant_knowledge", ConnectionRefusedError()) == "knowledge: UNAVAILABLE"
    bug = RuntimeError("<object object at 0x7f00>")
    assert rpc_failure("counterparty", bug) == "profiles: INTERNAL"
