"""The episode lifecycle pass (spec "Episode lifecycle"): the per-seat gate, the four horizons in
order, greedy tool-set Jaccard compaction with exemplars, condensation, and the no-model rule.

Rows are recorded over gRPC with end times in the past relative to a ManualClock; the pass runs as
the runner runs it (``app.passes()["episode-lifecycle"].run()``). Model-backed paths use the
scripted OpenAI-compatible server; the rest use the offline rules bootstrap registers. The gate is
lowered to 5 raw rows a seat so a test needs six rows, not 501, to make a seat due.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from agentlearn.episodes.v1 import episode_service_pb2 as pb
from agentlearn.episodes.v1 import episode_service_pb2_grpc as pb_grpc
from libs.common.events import read_events
from services.episodes.domain import Episode, EpisodeKind, TurnOutcome
from services.episodes.lifecycle import greedy_clusters, jaccard
from services.episodes.store import SQL
from tests.support.app import open_app
from tests.support.scripted_openai import Reply
from tests.support.turns import raw_episode

GATE = 5
DONE, FAILED, SELF_ITERATE = pb.TURN_OUTCOME_DONE, pb.TURN_OUTCOME_FAILED, pb.TURN_OUTCOME_SELF_ITERATE


class Seats:
    """Records turns for seats of company ``acme`` and runs the pass."""

    def __init__(self, app, clock):  # type: ignore[no-untyped-def]
        self.app, self.clock = app, clock
        self.stub = pb_grpc.EpisodeServiceStub(app.channel)
        self._ids = itertools.count(1)

    async def add(  # type: ignore[no-untyped-def]
        self,
        days_ago: float,
        tools=("jira.search", "jira.update"),
        *,
        seat: str = "ana",
        outcome: int = DONE,
        label: str = "Message from Ana: Jira ticket",
        ask: str = "",
        what: str = "Updated the ticket.",
        role: str = "",
        subjects=(),
        conversation: str = "",
    ) -> str:
        turn_id = f"run-{next(self._ids):04d}"
        end = self.clock.now() - timedelta(days=days_ago)
        await self.stub.RecordEpisode(
            raw_episode(
                seat,
                turn_id,
                end,
                label,
                ask,
                what,
                tools,
                outcome,
                minutes=3,
                tools_called=list(tools),
                role=role,
                subjects=list(subjects),
                conversation_id=conversation,
            )
        )
        return turn_id

    async def due(self, seat: str = "ana", role: str = "") -> None:
        """Recent turns that make the seat cross its gate and are never dropped or folded."""
        for i in range(GATE + 1):
            await self.add(1, (f"recent.tool{i}",), seat=seat, role=role)

    async def run(self):  # type: ignore[no-untyped-def]
        return await self.app.passes()["episode-lifecycle"].run()

    async def rows(self, seat: str = "ana") -> dict[str, dict]:
        """Raw rows by run id, compacted rows by their id."""
        rows = await self.app.infra.pool.fetch("SELECT * FROM episodes WHERE company = 'acme' AND seat = $1", seat)
        return {r["turn_id"] or str(r["id"]): dict(r) for r in rows}

    async def compacted(self, seat: str = "ana") -> list[dict]:
        return [r for r in (await self.rows(seat)).values() if r["kind"] == "compacted"]

    async def events(self, kind: str) -> list[dict]:
        return [e["payload"] for e in await read_events(self.app.infra.pool, kind)]


def scripted_llm(server) -> dict:  # type: ignore[no-untyped-def]
    return {"scripted": {"kind": "openai", "base_url": server.base_url, "api_key": "k", "model": "scripted-chat"}}


@pytest.fixture
def lifecycle_settings(make_settings):
    def make(**lifecycle):  # type: ignore[no-untyped-def]
        providers = lifecycle.pop("providers", None)
        company_defaults = lifecycle.pop("company_defaults", None)
        overrides: dict = {"learning": {"episode_lifecycle": {"max_raw_episodes_per_agent": GATE, **lifecycle}}}
        if providers is not None:
            overrides["providers"] = providers
        if company_defaults is not None:
            overrides["company_defaults"] = company_defaults
        return make_settings(**overrides)

    return make


@pytest.fixture
def open_seats(dsn, clock, tmp_path):
    """Opens the episodes service (no embedder, Qdrant's embedded engine) with given settings."""
    from contextlib import asynccontextmanager

    from libs.common.vectorindex.qdrant_edge_index import QdrantEdgeIndex

    @asynccontextmanager
    async def opened(settings, *, embedder=None, index=None):  # type: ignore[no-untyped-def]
        idx = index or QdrantEdgeIndex(tmp_path / f"edge-{uuid.uuid4().hex[:6]}")
        try:
            async with open_app(settings, dsn, names=["episodes"], clock=clock, embedder=embedder, index=idx) as app:
                yield Seats(app, clock)
        finally:
            if index is None:
                await idx.close()

    return opened


# ------------------------------------------------------------------------------------------- gate


async def test_a_seat_at_its_threshold_costs_one_count_and_nothing_else(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.add(20, outcome=SELF_ITERATE)
        await seats.add(100, tools=())
        for _ in range(3):
            await seats.add(40)
        report = await seats.run()
        assert (report.seats_checked, report.seats_due) == (1, 0)
        assert len(await seats.rows()) == GATE  # nothing dropped, nothing folded
        assert await seats.events("compaction_completed") == []
        assert await seats.events("compaction_requested") == []
        await seats.add(1)  # the sixth raw row: now over the threshold
        report = await seats.run()
        assert (report.seats_checked, report.seats_due) == (1, 1)
        assert (report.non_terminal_dropped, report.tool_free_dropped, report.clusters_compacted) == (1, 1, 1)
        [requested] = await read_events(seats.app.infra.pool, "compaction_requested")
        assert (requested["company"], requested["seat"]) == ("acme", "ana")
        assert requested["payload"] == {"raw_episodes": GATE + 1, "max_raw_episodes": GATE}
        [completed] = await seats.events("compaction_completed")
        assert completed["failure"] is None and completed["clusters_compacted"] == 1


async def test_the_gate_is_one_index_only_count(open_seats, lifecycle_settings):
    """20,000 rows over 200 seats: the gate reads one seat's index entries, not the table."""
    async with open_seats(lifecycle_settings()) as seats:
        pool = seats.app.infra.pool
        await pool.execute(
            """INSERT INTO episodes (id, company, seat, kind, turn_id, label, outcome,
                                     start_time, end_time, record_time)
               SELECT gen_random_uuid(), 'acme', 'seat' || (i % 200), 'raw', 'r' || i, 'label', 'done',
                      now(), now(), now()
               FROM generate_series(1, 20000) AS i"""
        )
        await pool.execute("VACUUM ANALYZE episodes")
        plan = "\n".join(r[0] for r in await pool.fetch(f"EXPLAIN {SQL['raw_count']}", "acme", "seat7"))
        assert "Index Only Scan using episodes_seat_raw" in plan, plan
        assert await seats.app.components["episodes"].service.store.raw_count("acme", "seat7") == 100


async def test_only_seats_over_their_threshold_are_touched(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due("ana")
        for seat in ("ana", "bob"):
            await seats.add(20, seat=seat, outcome=SELF_ITERATE)
            await seats.add(100, (), seat=seat)
            for _ in range(3):
                await seats.add(40, seat=seat)
        before = await seats.rows("bob")
        report = await seats.run()
        assert (report.seats_checked, report.seats_due) == (2, 1)
        assert await seats.rows("bob") == before
        assert len(await seats.compacted("ana")) == 1


# -------------------------------------------------------------------------------------- horizons


async def test_non_terminal_rows_go_after_fourteen_days(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        young = await seats.add(13.9, outcome=SELF_ITERATE)
        old = await seats.add(14.1, outcome=SELF_ITERATE)
        settled = await seats.add(20)
        report = await seats.run()
        rows = await seats.rows()
        assert young in rows and settled in rows and old not in rows
        assert report.non_terminal_dropped == 1


async def test_tool_free_rows_go_after_ninety_days_and_are_reported_alone(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        young = await seats.add(89, ())
        old = await seats.add(91, ())
        chatty_mid_state = await seats.add(91, (), outcome=SELF_ITERATE)  # dropped first, as non-terminal
        lone_tool_user = await seats.add(91, ("pagerduty.ack",))  # no cluster of three: no horizon at all
        report = await seats.run()
        rows = await seats.rows()
        assert young in rows and lone_tool_user in rows
        assert old not in rows and chatty_mid_state not in rows
        assert (report.non_terminal_dropped, report.tool_free_dropped) == (1, 1)
        [event] = await seats.events("episode_lifecycle_pass")
        assert (event["non_terminal_dropped"], event["tool_free_dropped"]) == (1, 1)
        [completed] = await seats.events("compaction_completed")
        assert completed["non_terminal_dropped"] == 2  # the spec's event folds the tool-free drops in


async def test_consolidated_rows_go_after_the_grace_and_are_never_folded(open_seats, lifecycle_settings, clock):
    async with open_seats(lifecycle_settings()) as seats:
        absorbed = await seats.add(45, ("github.pr",))
        await seats.stub.MarkEpisodesConsolidated(
            pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", turn_ids=[absorbed], skill_id="sk-1")
        )
        clock.advance(days=31)
        fresh = await seats.add(40)  # with two like it this would be a cluster of three...
        await seats.stub.MarkEpisodesConsolidated(
            pb.MarkEpisodesConsolidatedRequest(company="acme", seat="ana", turn_ids=[fresh], skill_id="sk-2")
        )
        others = [await seats.add(40), await seats.add(40)]
        await seats.due()
        report = await seats.run()
        rows = await seats.rows()
        assert absorbed not in rows  # 76 days old, stamped 31 days ago: past the grace
        assert fresh in rows and rows[fresh]["consolidated_into_skill_id"] == "sk-2"  # stamped today: audit window
        assert all(o in rows for o in others)  # ...but an absorbed row is never folded: two are no cluster
        assert (report.consolidated_dropped, report.clusters_compacted) == (1, 0)


async def test_a_stamped_exemplar_outlives_the_consolidated_grace(open_seats, lifecycle_settings, clock):
    """An exemplar is kept raw on purpose: a skill stamping it later does not make the consolidated
    sweep delete it once the grace has run; it goes only with its summary."""
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        members = [await seats.add(40) for _ in range(3)]
        await seats.run()
        [summary] = await seats.compacted()
        exemplars = list(summary["exemplar_turn_ids"])
        assert len(exemplars) == 2 and set(exemplars) < set(members)
        absorbed = await seats.add(35, ("github.pr",))  # an ordinary row stamped alongside them
        await seats.stub.MarkEpisodesConsolidated(
            pb.MarkEpisodesConsolidatedRequest(
                company="acme", seat="ana", turn_ids=[*exemplars, absorbed], skill_id="sk-1"
            )
        )
        clock.advance(days=31)
        await seats.due()
        report = await seats.run()
        rows = await seats.rows()
        assert absorbed not in rows and report.consolidated_dropped == 1
        assert all(rows[e]["exemplar_of"] == summary["id"] for e in exemplars)
        # A reader that counts turns as evidence can leave the exemplars out of a listing.
        listed = await seats.stub.ListEpisodes(
            pb.ListEpisodesRequest(
                company="acme",
                seat="ana",
                page_size=200,
                filter=pb.EpisodeFilter(kind=pb.EPISODE_KIND_RAW, exclude_exemplars=True),
            )
        )
        assert listed.total_size == len(listed.episodes) == 2 * (GATE + 1)  # the two due() batches
        assert not {e.turn_id for e in listed.episodes} & set(exemplars)
        everything = await seats.stub.ListEpisodes(
            pb.ListEpisodesRequest(company="acme", seat="ana", filter=pb.EpisodeFilter(kind=pb.EPISODE_KIND_RAW))
        )
        assert everything.total_size == 2 * (GATE + 1) + 2


async def test_only_rows_older_than_thirty_days_are_folded(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        young = [await seats.add(29, ("a", "b")) for _ in range(3)]
        old = [await seats.add(31, ("c", "d")) for _ in range(3)]
        report = await seats.run()
        rows = await seats.rows()
        assert all(y in rows for y in young)
        assert sum(o in rows for o in old) == 2  # two exemplars kept, one folded away
        assert report.clusters_compacted == 1 and report.episodes_compacted == 3


async def test_compacted_rows_are_evicted_past_their_max_age_with_their_exemplars(
    open_seats, lifecycle_settings, clock
):
    async with open_seats(lifecycle_settings(compacted_max_age_days=60)) as seats:
        await seats.due()
        for _ in range(3):
            await seats.add(40)
        await seats.run()
        [summary] = await seats.compacted()
        exemplars = list(summary["exemplar_turn_ids"])
        clock.advance(days=25)  # the summary's window now ended 65 days ago
        await seats.due()
        report = await seats.run()
        rows = await seats.rows()
        assert str(summary["id"]) not in rows and not any(e in rows for e in exemplars)
        assert (report.compacted_evicted, report.exemplars_evicted) == (1, 2)


async def test_compacted_rows_are_kept_forever_by_default(open_seats, lifecycle_settings, clock):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        for _ in range(3):
            await seats.add(40)
        await seats.run()
        clock.advance(days=3650)
        await seats.due()
        report = await seats.run()
        assert report.compacted_evicted == 0 and len(await seats.compacted()) == 1


# ------------------------------------------------------------------------------------ clustering


def _ep(*tools: str) -> Episode:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Episode(
        id=uuid.uuid4(),
        company="acme",
        seat="ana",
        kind=EpisodeKind.RAW,
        outcome=TurnOutcome.DONE,
        start_time=now,
        end_time=now,
        tool_sequence=tools,
        tools_called=tools,
    )


def test_jaccard_is_over_tool_sets():
    assert jaccard(frozenset("abc"), frozenset("cba")) == 1.0
    assert jaccard(frozenset("abc"), frozenset("abd")) == 0.5
    assert jaccard(frozenset("abc"), frozenset("abcd")) == 0.75
    rows = [_ep("a", "b", "c"), _ep("c", "b", "a", "a"), _ep("a", "b", "d"), _ep("a", "b", "c", "d"), _ep("x")]
    clusters = greedy_clusters(rows, 0.6)
    assert [[rows.index(e) for e in c] for c in clusters] == [[0, 1, 3], [2], [4]]


async def test_clusters_are_by_tool_set_whatever_the_order(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        same = [
            await seats.add(40, ("jira.search", "jira.update", "slack.post")),
            await seats.add(41, ("slack.post", "jira.update", "jira.search")),
            await seats.add(42, ("jira.update", "jira.search", "slack.post", "slack.post")),
        ]
        unalike = [await seats.add(40, (tool,)) for tool in ("github.pr", "pagerduty.ack", "gmail.send")]
        pair = [await seats.add(40, ("x.one", "x.two")), await seats.add(40, ("x.two", "x.one"))]
        report = await seats.run()
        rows = await seats.rows()
        [summary] = await seats.compacted()
        assert summary["count"] == 3 and set(summary["exemplar_turn_ids"]) < set(same)
        assert sum(s in rows for s in same) == 2
        assert all(u in rows for u in unalike) and all(p in rows for p in pair)  # a pair is no cluster of three
        assert report.clusters_compacted == 1


async def test_a_fold_counts_from_its_members_and_keeps_three_exemplars(open_seats, lifecycle_settings, clock):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        ids = []
        for i, outcome in enumerate([DONE, DONE, FAILED, DONE, FAILED, DONE]):
            ids.append(await seats.add(45 - i, outcome=outcome, subjects=[f"user{i % 2}"]))
        report = await seats.run()
        [summary] = await seats.compacted()
        rows = await seats.rows()
        assert summary["count"] == 6 and summary["done_count"] == 4
        assert summary["success_rate"] == pytest.approx(4 / 6)
        assert summary["outcome"] == "done" and summary["turn_id"] is None and summary["work_item"] is None
        assert summary["embedding"] is None and not summary["indexed"]
        assert summary["start_time"] == clock.now() - timedelta(days=45, minutes=3)
        assert summary["end_time"] == clock.now() - timedelta(days=40)
        assert list(summary["tool_sequence"]) == ["jira.search", "jira.update"]
        assert {"user0", "user1"} <= set(summary["subjects_involved"])
        # Three exemplars of six: the newest done, the newest failed, the newest of the rest.
        assert list(summary["exemplar_turn_ids"]) == [ids[5], ids[4], ids[3]]
        for kept in summary["exemplar_turn_ids"]:
            assert rows[kept]["kind"] == "raw" and rows[kept]["exemplar_of"] == summary["id"]
        assert not any(i in rows for i in ids[:3])
        assert (report.episodes_compacted, report.episodes_deleted, report.exemplars_kept) == (6, 3, 3)
        [completed] = await seats.events("compaction_completed")
        assert completed["clusters_compacted"] == 1 and completed["episodes_deleted"] == 3
        got = await seats.stub.GetEpisode(
            pb.GetEpisodeRequest(company="acme", seat="ana", episode_id=str(summary["id"]))
        )
        assert got.episode.kind == pb.EPISODE_KIND_COMPACTED and got.episode.count == 6


async def test_a_retained_exemplar_is_never_folded_again_nor_takes_a_batch_slot(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings(compaction_batch_size=3)) as seats:
        await seats.due()
        for _ in range(3):
            await seats.add(50)
        await seats.run()
        [first] = await seats.compacted()
        # Older than the next cluster, and the batch is three: were exemplars or tool-free rows
        # counted in it, they would take every slot and the pass would fold nothing.
        await seats.add(60, ())
        await seats.add(60, ())
        newer = [await seats.add(35) for _ in range(3)]
        report = await seats.run()
        assert report.clusters_compacted == 1
        summaries = await seats.compacted()
        assert len(summaries) == 2
        second = next(s for s in summaries if s["id"] != first["id"])
        assert set(second["exemplar_turn_ids"]) < set(newer)
        rows = await seats.rows()
        for kept in first["exemplar_turn_ids"]:
            assert rows[kept]["exemplar_of"] == first["id"]  # still the first summary's, still raw
        report = await seats.run()  # nothing left to fold: exemplars only
        assert report.clusters_compacted == 0 and len(await seats.compacted()) == 2


async def test_a_fold_of_one_conversation_is_filed_under_it(open_seats, lifecycle_settings):
    """The conversation path returns both kinds: a summary whose members were all in one
    conversation carries it; a cluster spanning several belongs to none of them."""
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        one = [await seats.add(40 + i, conversation="C1/17.1") for i in range(3)]
        mixed = [
            await seats.add(40 + i, ("gmail.read", "gmail.send"), conversation=c)
            for i, c in enumerate(["C2", "C2", "C3"])
        ]
        await seats.run()
        summaries = {tuple(s["tool_sequence"]): s for s in await seats.compacted()}
        filed = summaries[("jira.search", "jira.update")]
        spread = summaries[("gmail.read", "gmail.send")]
        assert filed["conversation_id"] == "C1/17.1" and spread["conversation_id"] is None
        listed = await seats.stub.ListEpisodes(
            pb.ListEpisodesRequest(company="acme", seat="ana", filter=pb.EpisodeFilter(conversation_id="C1/17.1"))
        )
        kinds = [(e.kind, e.turn_id) for e in listed.episodes]
        assert (pb.EPISODE_KIND_COMPACTED, "") in kinds
        assert {t for k, t in kinds if k == pb.EPISODE_KIND_RAW} == set(filed["exemplar_turn_ids"])
        assert set(filed["exemplar_turn_ids"]) < set(one)
        for conv in ("C2", "C3"):
            got = await seats.stub.ListEpisodes(
                pb.ListEpisodesRequest(company="acme", seat="ana", filter=pb.EpisodeFilter(conversation_id=conv))
            )
            assert {e.kind for e in got.episodes} <= {pb.EPISODE_KIND_RAW}
            assert {e.turn_id for e in got.episodes} <= set(mixed)


async def test_the_offline_rules_summarise_with_no_model_at_all(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        await seats.add(40, ("jira.search", "jira.update"), label="Message from Ana: weekly report request")
        await seats.add(41, ("jira.search", "jira.update", "slack.post"), label="Ana asked for the weekly report")
        await seats.add(42, ("jira.update", "jira.search"), label="weekly report reminder", outcome=FAILED)
        await seats.run()
        [summary] = await seats.compacted()
        assert "weekly report" in summary["common_task_pattern"]
        assert "jira.search" in summary["common_task_pattern"]
        assert summary["common_outcome"] == "2 of 3 ended done, 1 failed"
        assert any("slack.post" in n for n in summary["notable_patterns"])


# ---------------------------------------------------------------------------- model-backed paths


class Chat:
    """The scripted server's chat handler: condensations answered, summaries recorded."""

    def __init__(self, server, summary: str | None = None):  # type: ignore[no-untyped-def]
        self.summaries: list[str] = []
        self.condensed: list[str] = []
        self.roles_seen: list[str] = []
        self._summary = summary or json.dumps(
            {
                "common_task_pattern": "Jira triage for Ana",
                "common_outcome": "tickets updated",
                "subjects_involved": ["ana"],
                "notable_patterns": ["one failed on permissions"],
            }
        )
        self._lock = threading.Lock()
        server.chat_handler = self.handle

    @staticmethod
    def is_condense(body: dict) -> bool:
        return body["messages"][0]["content"].startswith("You condense")

    def handle(self, body: dict) -> str:
        user = body["messages"][1]["content"]
        if self.is_condense(body):
            with self._lock:
                self.condensed.append(user)
                return f"short version {len(self.condensed)}"
        with self._lock:
            self.summaries.append(user)
        return self._summary


def long_text(tag: str) -> str:
    return f"{tag}: " + " ".join(f"Traceback frame {i} in module_{tag}.py line {i * 7}" for i in range(12))


async def test_long_tasks_and_outcomes_are_condensed_first_and_labelled(
    open_seats, lifecycle_settings, scripted_openai
):
    chat = Chat(scripted_openai)
    settings = lifecycle_settings(providers={"llm": scripted_llm(scripted_openai), "auxiliary_chain": ["scripted"]})
    async with open_seats(settings) as seats:
        await seats.due()
        await seats.add(40, ask=long_text("A"), what="Fixed the import.")
        await seats.add(41, ask="Short ask", what=long_text("B"))
        await seats.add(42, ask="", label="Ops ping", what="Closed it.")
        report = await seats.run()
        assert report.condensed == 2 and report.condense_failed == 0
        assert sorted(chat.condensed) == sorted([long_text("A"), long_text("B")])  # each sent whole
        [summary_prompt] = chat.summaries
        assert summary_prompt.count("(condensed) short version") == 2
        assert "Traceback" not in summary_prompt  # a rewrite, never the text cut
        assert "task: Short ask" in summary_prompt and "task: Ops ping" in summary_prompt  # told nothing: label
        assert "outcome: Fixed the import." in summary_prompt
        assert "jira.search → jira.update" in summary_prompt  # the whole tool sequence
        [compacted] = await seats.compacted()
        assert compacted["common_task_pattern"] == "Jira triage for Ana"


async def test_at_most_four_rewrites_run_at_once(open_seats, lifecycle_settings, scripted_openai):
    total = 9
    state = {"in_flight": 0, "started": 0, "max": 0}
    cond = threading.Condition()
    summary = json.dumps({"common_task_pattern": "p", "common_outcome": "o"})

    def handle(body: dict) -> str:
        if not Chat.is_condense(body):
            return summary
        with cond:
            state["in_flight"] += 1
            state["started"] += 1
            state["max"] = max(state["max"], state["in_flight"])
            cond.notify_all()
            # Hold each rewrite until four are in flight (or every rewrite has started), so a bound
            # looser than four would show; the deadline only guards against a hang.
            deadline = time.monotonic() + 30
            while state["in_flight"] < 4 and state["started"] < total and time.monotonic() < deadline:
                cond.wait(0.5)
            state["in_flight"] -= 1
        return "condensed"

    scripted_openai.chat_handler = handle
    settings = lifecycle_settings(providers={"llm": scripted_llm(scripted_openai), "auxiliary_chain": ["scripted"]})
    async with open_seats(settings) as seats:
        await seats.due()
        for i in range(3):
            await seats.add(40, ask=long_text(f"ask{i}"), what=long_text(f"did{i}"))
        for i in range(3):
            await seats.add(40, ("gmail.read", "gmail.send"), ask=long_text(f"mail{i}"))
        report = await seats.run()
        assert report.condensed == total
        assert state["started"] == total and state["max"] == 4
        assert report.clusters_compacted == 2


async def test_a_failed_rewrite_is_carried_whole(open_seats, lifecycle_settings, scripted_openai):
    chat = Chat(scripted_openai)
    scripted_openai.rule("chat", lambda body: Reply(status=500) if Chat.is_condense(body) else None)
    settings = lifecycle_settings(providers={"llm": scripted_llm(scripted_openai), "auxiliary_chain": ["scripted"]})
    async with open_seats(settings) as seats:
        await seats.due()
        await seats.add(40, ask=long_text("A"))
        await seats.add(41)
        await seats.add(42)
        report = await seats.run()
        assert (report.condensed, report.condense_failed, report.clusters_compacted) == (0, 1, 1)
        [summary_prompt] = chat.summaries
        assert long_text("A") in summary_prompt and "(condensed)" not in summary_prompt


@pytest.mark.parametrize("reply", ["not json at all", '["a list"]', '{"common_outcome": "no pattern"}', None])
async def test_a_summary_that_fails_leaves_its_cluster_raw(open_seats, lifecycle_settings, scripted_openai, reply):
    Chat(scripted_openai, summary=reply or "{}")
    if reply is None:
        scripted_openai.rule("chat", lambda body: Reply(status=503))
    settings = lifecycle_settings(providers={"llm": scripted_llm(scripted_openai), "auxiliary_chain": ["scripted"]})
    async with open_seats(settings) as seats:
        await seats.due()
        ids = [await seats.add(40 + i) for i in range(3)]
        report = await seats.run()
        rows = await seats.rows()
        assert all(i in rows for i in ids) and await seats.compacted() == []
        assert (report.compaction_failed, report.clusters_compacted) == (1, 0)
        [failed] = await seats.events("compaction_failed")
        assert failed["members"] == 3


async def test_one_seats_fault_is_counted_and_the_pass_goes_on_to_the_next_seat(
    open_seats, lifecycle_settings, scripted_openai, caplog
):
    """A real fault confined to one seat: its summary holds U+0000, which PostgreSQL text cannot
    store, so its fold fails (and rolls back). The seat is logged and counted, what it dropped
    before the fault is still reported, the next seat is compacted, and the pass is announced."""
    chat = Chat(scripted_openai)
    poison = json.dumps({"common_task_pattern": "Jira\u0000triage", "common_outcome": "o"})

    def handle(body: dict) -> str:
        return poison if "seat ana" in body["messages"][1]["content"] else chat.handle(body)

    scripted_openai.chat_handler = handle
    settings = lifecycle_settings(providers={"llm": scripted_llm(scripted_openai), "auxiliary_chain": ["scripted"]})
    caplog.set_level("ERROR", logger="services.episodes.lifecycle")
    async with open_seats(settings) as seats:
        for seat in ("ana", "bob"):  # ana is listed first
            await seats.due(seat)
            await seats.add(20, seat=seat, outcome=SELF_ITERATE)
            for i in range(3):
                await seats.add(40 + i, seat=seat)
        report = await seats.run()
        assert (report.seats_due, report.seats_failed, report.clusters_compacted) == (2, 1, 1)
        [(kind, count)] = report.failures.items()
        assert count == 1 and kind
        assert report.non_terminal_dropped == 2  # ana's drop happened before its fault: still counted
        assert await seats.compacted("ana") == [] and len(await seats.compacted("bob")) == 1
        assert sum(r["kind"] == "raw" for r in (await seats.rows("ana")).values()) == GATE + 1 + 3
        assert any("acme/ana" in r.getMessage() for r in caplog.records if r.name == "services.episodes.lifecycle")
        [event] = await seats.events("episode_lifecycle_pass")
        assert event["seats_failed"] == 1 and event["failures"] == report.failures
        # Each seat's pass is announced as requested and as completed, the failed one too: with
        # what it did before the fault (its drop) and the fault's kind.
        pool = seats.app.infra.pool
        assert [e["seat"] for e in await read_events(pool, "compaction_requested")] == ["ana", "bob"]
        completed = {e["seat"]: e["payload"] for e in await read_events(pool, "compaction_completed")}
        assert completed["ana"]["failure"] == kind and completed["ana"]["non_terminal_dropped"] == 1
        assert completed["ana"]["clusters_compacted"] == 0
        assert completed["bob"]["failure"] is None and completed["bob"]["clusters_compacted"] == 1


async def test_each_seat_is_summarised_by_its_own_roles_chain(open_seats, lifecycle_settings, scripted_openai):
    chat = Chat(scripted_openai)
    settings = lifecycle_settings(
        providers={
            "llm": {**scripted_llm(scripted_openai), "offline": {"kind": "offline"}},
            "auxiliary_chain": ["offline"],
        },
        company_defaults={"roles": {"swe": {"llm_auxiliary": ["scripted"]}, "quiet": {"llm_auxiliary": []}}},
    )
    async with open_seats(settings) as seats:
        for seat, role in (("ana", "swe"), ("bob", ""), ("cy", "quiet")):
            await seats.due(seat, role=role)
            for i in range(3):
                await seats.add(40 + i, seat=seat, role=role)
            await seats.add(20, seat=seat, role=role, outcome=SELF_ITERATE)
        report = await seats.run()
        assert len(chat.summaries) == 1 and "seat ana" in chat.summaries[0]  # only the swe seat's chain
        [ana] = await seats.compacted("ana")
        assert ana["common_task_pattern"] == "Jira triage for Ana" and ana["role"] == "swe"
        [bob] = await seats.compacted("bob")
        assert "jira.search" in bob["common_task_pattern"]  # the default chain: offline rules
        # A role with no chain: its rows are dropped on their horizons but never folded.
        assert await seats.compacted("cy") == [] and report.seats_without_model == 1
        assert report.non_terminal_dropped == 3
        spend = await read_events(seats.app.infra.pool, "auxiliary_spend")
        assert {(e["seat"], e["payload"]["purpose"], e["payload"]["stage"]) for e in spend} == {
            ("ana", "episode_compaction", "background"),
            ("bob", "episode_compaction", "background"),
        }


async def test_with_no_auxiliary_model_anywhere_the_pass_does_not_run_and_deletes_nothing(
    open_seats, lifecycle_settings
):
    settings = lifecycle_settings(providers={"llm": {}, "auxiliary_chain": []})
    async with open_seats(settings) as seats:
        await seats.due()
        await seats.add(20, outcome=SELF_ITERATE)
        await seats.add(100, ())
        for _ in range(3):
            await seats.add(40)
        before = await seats.rows()
        report = await seats.run()
        assert (report.ran, report.reason, report.seats_checked) == (False, "no_auxiliary_model", 0)
        assert await seats.rows() == before
        [event] = await seats.events("episode_lifecycle_pass")
        assert event["ran"] is False and event["reason"] == "no_auxiliary_model"


async def test_a_second_pass_with_nothing_new_changes_nothing(open_seats, lifecycle_settings):
    async with open_seats(lifecycle_settings()) as seats:
        await seats.due()
        for _ in range(4):
            await seats.add(40)
        await seats.add(20, outcome=SELF_ITERATE)
        await seats.run()
        after_first = await seats.rows()
        report = await seats.run()
        assert await seats.rows() == after_first
        assert (report.non_terminal_dropped, report.clusters_compacted) == (0, 0)


async def test_dropped_and_folded_rows_leave_the_index(open_seats, lifecycle_settings, local_embedder, vector_index):
    from libs.common.vectorindex import collection_name

    async with open_seats(lifecycle_settings(), embedder=local_embedder, index=vector_index) as seats:
        await seats.due()
        await seats.add(20, outcome=SELF_ITERATE, label="Mid-state review round")
        for i in range(3):
            await seats.add(40 + i, label=f"Ana asked about ticket OPS-{i}")
        coll = collection_name("episodes", 384)
        assert await vector_index.count(coll) == GATE + 1 + 4
        await seats.run()
        rows = await seats.rows()
        raw_with_vectors = [r for r in rows.values() if r["kind"] == "raw" and r["embedding"] is not None]
        assert await vector_index.count(coll) == len(raw_with_vectors) == GATE + 1 + 2
        hits = await seats.stub.SearchEpisodes(
            pb.SearchEpisodesRequest(company="acme", seat="ana", query="Ana asked about ticket OPS", limit=20)
        )
        assert {h.episode.kind for h in hits.hits} == {pb.EPISODE_KIND_RAW}
        [summary] = await seats.compacted()
        assert str(summary["id"]) not in {h.episode.id for h in hits.hits}
