"""The vector fill ("The holder fills what is missing"), run against a scripted OpenAI-compatible
embeddings endpoint over real HTTP. Each test is one or more minutes of the pass."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentlearn.diary.v1 import diary_service_pb2 as pb
from agentlearn.diary.v1 import diary_service_pb2_grpc as pb_grpc
from tests.support.app import open_app
from tests.support.fill import FillMinutes, inputs, refusing
from tests.support.scripted_openai import Reply


class Fill(FillMinutes):
    """Writes notes with no embedder (so they have no vector), then runs minutes of the fill."""

    ROWS_SQL = (
        "SELECT id, content, embedding_model, embedding_dims, indexed, fill_held_until, fill_alone FROM agent_diary"
    )

    def settings(self, model: str = "scripted-embed", dims: int | None = None, **fill):  # type: ignore[no-untyped-def]
        emb = self.embeddings(model, dims, fill)
        return self.make_settings(providers={"embeddings": emb}, learning={"fill": fill})

    async def write(self, seat: str, *contents: str, company: str = "acme") -> list[str]:
        ids = []
        async with open_app(
            self.make_settings(), self.dsn, names=["diary"], clock=self.clock, embedder=None, index=self.index
        ) as app:
            stub = pb_grpc.DiaryServiceStub(app.channel)
            for content in contents:
                self.clock.advance(seconds=1)
                resp = await stub.WriteNote(
                    pb.WriteNoteRequest(company=company, seat=seat, content=content, tier=pb.NOTE_TIER_LONG)
                )
                assert resp.note.embedding_model == ""
                ids.append(resp.note.id)
        return ids

    async def minute(self, settings=None, **fill):  # type: ignore[no-untyped-def]
        results = await self.run_passes(settings or self.settings(**fill), ["diary"], {"diary": "diary-fill"})
        return results["diary"]["fill"]


@pytest.fixture
def fill(make_settings, dsn, clock, scripted_openai, vector_index):
    return Fill(make_settings, dsn, clock, scripted_openai, vector_index)


async def test_notes_without_a_vector_are_filled_indexed_and_found(fill, scripted_openai):
    ids = await fill.write("ana", "alpha fact", "beta fact", "gamma fact")
    report = await fill.minute()
    assert report.filled == 3 and report.requests == 1 and report.ended_by is None
    assert fill.filled() == set(ids)
    assert all(r["indexed"] and r["embedding_dims"] == 64 for r in fill.rows.values())
    again = await fill.minute()
    assert again.requests == 0  # nothing left: a filled note is never sent again


async def test_request_budget_ends_the_minute_and_the_next_starts_at_that_seat(fill, scripted_openai):
    for seat in ("a", "b", "c"):
        await fill.write(seat, f"{seat} one", f"{seat} two")
    first = await fill.minute(batch_size=1, requests_per_minute=4)
    assert (first.requests, first.filled, first.ended_by) == (4, 4, "requests")
    assert inputs(scripted_openai) == [["a one"], ["a two"], ["b one"], ["b two"]]
    scripted_openai.clear()
    second = await fill.minute(batch_size=1, requests_per_minute=4)
    assert inputs(scripted_openai) == [["c one"], ["c two"]]
    assert second.ended_by is None and len(fill.filled()) == 6


async def test_byte_budget_is_the_companys_and_shared_by_every_runner(fill, scripted_openai):
    await fill.write("a", *[f"note {i:02d} xxxxxxxxxxxxxxxxxxxxxxxxx" for i in range(6)])  # 33 bytes each
    report = await fill.minute(batch_size=1, company_bytes_per_minute=100)
    assert (report.filled, report.bytes, report.ended_by) == (3, 99, "bytes")
    # A second runner in the same minute finds the company's bytes already spent.
    settings = fill.settings(batch_size=1, company_bytes_per_minute=100)
    fill.clock.advance(seconds=-61)
    same_minute = await fill.minute(settings)
    assert (same_minute.requests, same_minute.ended_by) == (0, "bytes")
    nxt = await fill.minute(batch_size=1, company_bytes_per_minute=100)
    assert nxt.filled == 3


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply(status=429), "rate_limited"),
        (Reply(delay=1.5), "timeout"),
        (Reply(status=503), "unavailable"),
        (Reply(status=401), "configuration"),  # a refused key
        (Reply(status=404), "configuration"),  # a model the endpoint does not serve
    ],
)
async def test_a_provider_failure_ends_the_minute_for_every_seat(fill, scripted_openai, reply, why):
    await fill.write("a", "a one")
    await fill.write("b", "b one")
    scripted_openai.push("embeddings", reply)
    report = await fill.minute()
    assert report.ended_by == why and report.requests == 1 and report.filled == 0
    assert len(scripted_openai.received("embeddings")) == 1  # seat b was not tried this minute
    report = await fill.minute()
    assert report.filled == 2 and len(fill.filled()) == 2


async def test_a_refused_batch_is_halved_to_the_one_note_which_is_held_an_hour_then_offered_alone(
    fill, scripted_openai
):
    ids = await fill.write("a", "ok zero", "ok one", "POISON two", "ok three")
    scripted_openai.rule("embeddings", refusing("POISON"))
    report = await fill.minute()
    assert inputs(scripted_openai) == [
        ["ok zero", "ok one", "POISON two", "ok three"],  # refused: the minute's first answer...
        ["hello"],  # ...so one plain word judges it: accepted, the notes are at fault
        ["ok zero", "ok one"],
        ["POISON two", "ok three"],
        ["POISON two"],
        ["ok three"],
    ]
    assert (report.requests, report.filled, report.refused_held) == (6, 3, 1)
    poison = fill.rows[ids[2]]
    assert poison["fill_alone"] and poison["fill_held_until"] == fill.clock.now() - timedelta(seconds=61) + timedelta(
        hours=1
    )
    assert [e["payload"]["row"] for e in fill.events_of("memory_fill_input_refused")] == [ids[2]]
    # Within the hour nothing is sent for it.
    scripted_openai.clear()
    await fill.minute()
    assert inputs(scripted_openai) == []
    # After the hour it is offered again, alone, beside a new note that is batched normally.
    fill.clock.advance(hours=1)
    new = await fill.write("a", "ok four")
    scripted_openai.clear()
    await fill.minute()
    assert ["POISON two"] in inputs(scripted_openai)
    assert ["ok four"] in inputs(scripted_openai)
    assert new[0] in fill.filled()


async def test_a_refused_configuration_pauses_the_fill_for_an_hour(fill, scripted_openai):
    await fill.write("a", "one", "two")
    scripted_openai.rule("embeddings", lambda body: Reply(status=400))  # refuses everything
    report = await fill.minute()
    assert report.ended_by == "configuration_refused"
    assert inputs(scripted_openai) == [["one", "two"], ["hello"]]
    assert [e["kind"] for e in fill.events].count("memory_fill_configuration_refused") == 1
    assert all(r["fill_held_until"] is None for r in fill.rows.values())  # the notes are not blamed
    scripted_openai.clear()
    paused = await fill.minute()
    assert paused.ended_by == "paused" and inputs(scripted_openai) == []
    # An apply that changes the model releases the pause at once.
    changed = await fill.minute(fill.settings(model="another-model"))
    assert changed.ended_by == "configuration_refused"  # judged again, sent again
    assert inputs(scripted_openai)[0] == ["one", "two"]
    # After the hour, the first refusal is judged again with the original model too.
    scripted_openai.rule("embeddings", None)
    fill.clock.advance(hours=1)
    report = await fill.minute()
    assert report.filled == 2


async def test_a_vector_with_no_direction_costs_only_its_note(fill, scripted_openai):
    ids = await fill.write("a", "fine one", "ZERO two", "fine three")
    scripted_openai.rule(
        "embeddings",
        lambda body: Reply(vectors=lambda inp: [[0.0] * 64 if "ZERO" in t else [1.0] + [0.0] * 63 for t in inp]),
    )
    report = await fill.minute()
    assert (report.requests, report.filled, report.unusable_held) == (1, 2, 1)
    held = fill.rows[ids[1]]
    assert held["embedding_model"] is None and held["fill_held_until"] is not None and not held["fill_alone"]
    [event] = fill.events_of("memory_fill_vector_unusable")
    assert event["payload"]["row"] == ids[1] and event["payload"]["bytes"] == len("ZERO two")
    # After the hour it goes again with its neighbours, in one request.
    scripted_openai.rule("embeddings", None)
    fill.clock.advance(hours=1)
    await fill.write("a", "fine four")
    scripted_openai.clear()
    report = await fill.minute()
    assert inputs(scripted_openai) == [["ZERO two", "fine four"]]
    assert report.filled == 2


async def test_notes_of_a_model_the_company_left_are_filled_again(fill, scripted_openai):
    ids = await fill.write("a", "one", "two")
    await fill.minute()
    assert {r["embedding_model"] for r in fill.rows.values()} == {"scripted-embed"}
    scripted_openai.clear()
    report = await fill.minute(fill.settings(model="new-model", dims=32))
    assert report.filled == 2
    assert {(r["embedding_model"], r["embedding_dims"]) for r in fill.rows.values()} == {("new-model", 32)}
    assert set(ids) == fill.filled()


async def test_a_change_of_model_width_limits_or_endpoint_releases_every_held_note(fill, scripted_openai):
    ids = await fill.write("a", "ok one", "POISON two")
    scripted_openai.rule("embeddings", refusing("POISON"))
    await fill.minute()
    assert fill.rows[ids[1]]["fill_held_until"] is not None
    scripted_openai.rule("embeddings", None)
    scripted_openai.clear()
    await fill.minute(fill.settings())  # same provider: still held
    assert inputs(scripted_openai) == []
    report = await fill.minute(fill.settings(max_input_tokens=512))  # limits changed: released at once
    # Only the held note goes: a note whose vector is of the current model and width is done.
    assert inputs(scripted_openai) == [["POISON two"]]
    assert report.filled == 1


async def test_a_long_row_goes_a_request_at_a_time_across_minutes_and_resumes_where_it_stopped(fill, scripted_openai):
    words = " ".join(f"w{i:03d}" for i in range(380))  # 1,899 bytes
    [row] = await fill.write("a", words)
    settings, sent_first, cont = await fill.first_minute_of_a_long_row()
    assert cont["payload"]["row"] == row and cont["payload"]["pieces_in"] == len(sent_first)
    total = cont["payload"]["pieces_total"]
    second, sent_second = await fill.next_minute(settings)
    assert len(sent_first) + len(sent_second) == total  # nothing sent twice
    assert " ".join(sent_first + sent_second) == words
    assert second.filled == 1 and row in fill.filled()


async def test_a_refused_piece_holds_the_row_and_the_retry_resumes_at_that_piece(fill, scripted_openai):
    words = " ".join(f"w{i:03d}" for i in range(380))
    poisoned = words.replace("w200", "POISON")
    [row] = await fill.write("a", poisoned)
    # The refused chunk spends the first minute's bytes before the piece can be found...
    settings = await fill.first_minute_refusing("POISON")
    # ...so the row's pieces now go one per request, and the next minute finds it.
    report = await fill.minute(settings)
    assert report.refused_held == 1
    assert all(len(body) == 1 for body in inputs(scripted_openai)[2:])
    kept = [e["payload"]["pieces_in"] for e in fill.events_of("memory_fill_input_continued")]
    assert kept  # the pieces before the refused one are kept
    scripted_openai.rule("embeddings", None)
    fill.clock.advance(hours=1)
    scripted_openai.clear()
    await fill.minute(settings)
    first_sent = inputs(scripted_openai)[0][0]
    assert "POISON" in first_sent  # resumed at the refused piece, not at the first
    await fill.minute(settings)
    assert row in fill.filled()


async def test_a_batch_is_bounded_by_the_bytes_left_so_it_always_goes(fill, scripted_openai):
    """Three 60-byte notes, a 100-byte minute, batches of three: a batch of all three could never be
    sent; bounded by the bytes left, one note goes each minute and every minute makes progress."""
    notes = [f"{i} " + "x" * 58 for i in range(3)]
    await fill.write("a", *notes)
    for minute in range(1, 4):
        report = await fill.minute(batch_size=3, company_bytes_per_minute=100)
        assert (report.filled, report.ended_by) == (1, "bytes" if minute < 3 else None)
    assert len(fill.filled()) == 3


async def test_one_companys_spent_bytes_do_not_stop_the_others(fill, scripted_openai):
    await fill.write("a", *[f"acme note {i} " + "x" * 40 for i in range(5)], company="acme")
    [beta] = await fill.write("b", "the beta company's only note", company="beta")
    report = await fill.minute(batch_size=1, company_bytes_per_minute=120)
    assert report.ended_by == "bytes"  # acme ran out of its bytes...
    assert beta in fill.filled()  # ...and beta was filled in the same minute
