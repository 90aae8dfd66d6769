"""What the proto<->Python conversions of a turn start's read paths cost, in one tree against
another (measurement only, wave 12).

    .venv/bin/python bench/experiments/conversion_costs.py --base /tmp/base-w12-convert [--pairs 41]

Each tree runs in a child process of its own whose import roots are that tree (``PYTHONPATH=<tree>:
<tree>/libs/common/gen``, ahead of the venv's own .pth), so each tree's own ``field_copy``,
``protoconv``, ``RowReader`` and servicers are what is timed. The parent asks the two children for
one timed window at a time, alternating them window by window (ABBA), so the machine's drift (it is
shared) falls on both alike; the table gives each tree's median window, the ratio of the medians
and the median of the paired windows' ratios (> 1: this tree is faster).

1. ``note_to_pb``: one diary Note (aware datetimes, UUID id) through ``services.diary.servicer``.
2. A RecallNotes response of 114 candidates: ``DiaryServicer.RecallNotes`` itself, over a stand-in
   service whose recall answers at once (the coroutine is driven without an event loop).
3. ``from_pb``: RecordEpisode's request to its ``TurnRecord`` (the servicer's own field list).
4. ``RowReader``: one diary row (a dict) through ``services.diary.store._note``.
5. ``episode_to_pb`` and ``skill_to_pb``: one episode, one skill.
6. ``MemoryNote.from_candidate`` over the 114 candidates of 2's response (the prefetch's side).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

THIS = Path(__file__).resolve().parents[2]
CANDIDATES = 114


def _window(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def child() -> dict[str, tuple[Callable[[], Any], int, float]]:
    """The measurements, in whichever tree this process imports from: each a call, the calls a
    window makes, and its unit (per second)."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
    from agentlearn.episodes.v1 import episode_service_pb2 as episodes_pb
    from libs.common.field_copy import from_pb
    from libs.common.vector_path import EmbeddingStatus, VectorSource
    from services.diary import store as diary_store
    from services.diary.domain import Candidate, Note, NoteSource, NoteTier, Recall
    from services.diary.servicer import DiaryServicer, note_to_pb
    from services.episodes.domain import Episode, EpisodeKind, TurnOutcome
    from services.episodes.service import TurnRecord
    from services.episodes.servicer import episode_to_pb
    from services.prefetch.memory import MemoryNote
    from services.skills.domain import Skill, SkillChange, SkillState, SkillTrigger
    from services.skills.servicer import skill_to_pb

    now = datetime(2026, 12, 3, 7, 15, 42, 123456, tzinfo=UTC)

    def note(i: int) -> Note:
        return Note(
            id=uuid.UUID(int=i + 1),
            company="acme",
            seat="seat-7",
            content=f"Prefers terse status updates; the deploy window is Tuesday {i} (ünïcødé ✓)",
            tier=NoteTier.SHORT if i % 3 else NoteTier.LONG,
            source=NoteSource.REFLECT_AND_PERSIST,
            turn_id=f"turn-{i}",
            create_time=now - timedelta(days=i, microseconds=i * 7),
            expire_time=now + timedelta(days=30) if i % 3 else None,
            use_count=i % 5,
            last_used_time=now - timedelta(hours=i) if i % 2 else None,
            embedding_model="all-MiniLM-L6-v2",
            embedding_dims=384,
        )

    notes = [note(i) for i in range(CANDIDATES)]
    recall = Recall(
        candidates=[
            Candidate(n, found_by={"vector", "lexical"} if i % 2 else {"recency"}, similarity=0.5, lexical_rank=0.1)
            for i, n in enumerate(notes)
        ],
        embedding_status=EmbeddingStatus.PROVIDED,
        vector_source=VectorSource.INDEX,
        unreachable_by_vector=0,
        relevance_floor=0.2,
    )

    class _Service:
        async def recall(self, *args: Any) -> Recall:
            return recall

    servicer = DiaryServicer(_Service())  # type: ignore[arg-type]
    request = diary_pb.RecallNotesRequest(company="acme", seat="seat-7", query="deploy window")

    def recall_response() -> diary_pb.RecallNotesResponse:
        coro = servicer.RecallNotes(request, None)  # type: ignore[arg-type]
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        raise RuntimeError("RecallNotes awaited something")

    response = recall_response()
    assert len(response.candidates) == CANDIDATES

    record = episodes_pb.RecordEpisodeRequest(
        company="acme",
        seat="seat-7",
        turn_id="turn-1",
        label="deploy",
        ask="ship the release",
        what_it_did="ran the pipeline",
        tool_sequence=["git", "make", "kubectl"],
        tools_called=["git", "make", "kubectl"],
        skills_used=["deploy"],
    )
    record.start_time.FromDatetime(now - timedelta(minutes=3))
    record.end_time.FromDatetime(now)
    record_names = (
        "company seat turn_id start_time end_time label ask what_it_did role work_item review_outcome"
        " tool_sequence tools_called skills_used subjects conversation_id work_key"
    )

    row = {
        "id": uuid.UUID(int=9),
        "company": "acme",
        "seat": "seat-7",
        "content": "Prefers terse status updates",
        "tier": "short",
        "source": "operator",
        "turn_id": "turn-9",
        "create_time": now,
        "expire_time": now + timedelta(days=30),
        "use_count": 2,
        "last_used_time": now,
        "embedding_model": "all-MiniLM-L6-v2",
        "embedding_dims": 384,
    }
    episode = Episode(
        id=uuid.UUID(int=3),
        company="acme",
        seat="seat-7",
        kind=EpisodeKind.RAW,
        outcome=TurnOutcome.DONE,
        start_time=now - timedelta(minutes=3),
        end_time=now,
        turn_id="turn-1",
        label="deploy",
        ask="ship the release",
        what_it_did="ran the pipeline",
        tool_sequence=("git", "make", "kubectl"),
        tools_called=("git", "make", "kubectl"),
        embedding_model="all-MiniLM-L6-v2",
        embedding_dims=384,
    )
    skill = Skill(
        name="deploy",
        summary="ship a release",
        body="1. make\n2. kubectl apply\n" * 10,
        tool_sequence=("git", "make", "kubectl"),
        trigger=SkillTrigger.CLUSTERED,
        cluster_size=3,
        source_turn_ids=("t1", "t2", "t3"),
        id=uuid.UUID(int=4),
        company="acme",
        seat="seat-7",
        state=SkillState.ACTIVE,
        pinned=False,
        version=2,
        use_count=5,
        last_used_time=now - timedelta(days=1),
        last_offered_time=None,
        unused_since=now - timedelta(days=1),
        state_change_time=now - timedelta(days=9),
        create_time=now - timedelta(days=9),
        update_time=now - timedelta(days=1),
        change=SkillChange.REFINED,
        change_reason="observation",
        restored_from_version=None,
    )

    return {
        "note_to_pb_us": (lambda: note_to_pb(notes[1]), 2000, 1e6),
        "recall_response_114_ms": (recall_response, 20, 1e3),
        "from_pb_turn_record_us": (
            lambda: from_pb(TurnRecord, record, record_names, outcome=TurnOutcome.DONE),
            2000,
            1e6,
        ),
        "row_reader_note_us": (lambda: diary_store._note(row), 5000, 1e6),
        "episode_to_pb_us": (lambda: episode_to_pb(episode), 1000, 1e6),
        "skill_to_pb_us": (lambda: skill_to_pb(skill, now), 1000, 1e6),
        "from_candidate_114_ms": (lambda: [MemoryNote.from_candidate(c) for c in response.candidates], 20, 1e3),
    }


def serve() -> None:
    """The child's loop: told a measurement's name on stdin, it answers one window's time per call
    (in the measurement's unit) on stdout; told nothing, it names the field_copy it imported."""
    from libs.common import field_copy

    measurements = child()
    for fn, _, _ in measurements.values():
        fn()  # compiled conversions are compiled on the first call: not part of a call's cost
    print(json.dumps({"field_copy": field_copy.__file__, "names": list(measurements)}), flush=True)
    for line in sys.stdin:
        fn, number, unit = measurements[line.strip()]
        print(_window(fn, number) * unit, flush=True)


class _Child:
    def __init__(self, tree: Path):
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'libs' / 'common' / 'gen'}")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child"],
            env=env,
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        hello = json.loads(self.stdout.readline())
        if not hello["field_copy"].startswith(str(tree)):
            raise SystemExit(f"the child for {tree} imported {hello['field_copy']}")
        self.names: list[str] = hello["names"]

    def window(self, name: str) -> float:
        self.stdin.write(name + "\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, help="the tree to compare with (built as the preamble says)")
    parser.add_argument("--pairs", type=int, default=41, help="windows of each tree per measurement")
    parser.add_argument("--json", type=Path, help="write every window's figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        serve()
        return
    if args.base is None:
        parser.error("--base is required")
    trees = {"base": args.base.resolve(), "this": THIS}
    children = {name: _Child(tree) for name, tree in trees.items()}
    windows: dict[str, dict[str, list[float]]] = {}
    try:
        for key in children["base"].names:
            got: dict[str, list[float]] = {"base": [], "this": []}
            for i in range(args.pairs):
                for name in ("base", "this") if i % 2 == 0 else ("this", "base"):
                    got[name].append(children[name].window(key))
            windows[key] = got
            print(f"{key} done", file=sys.stderr)
    finally:
        for c in children.values():
            c.close()
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "windows": windows}, indent=1))
    print(f"base: {trees['base']}\nthis: {trees['this']}")
    print(f"{args.pairs} windows of each tree per measurement, alternated window by window (ABBA)\n")
    print(f"{'measurement':<26} {'base':>10} {'this':>10} {'base/this':>10} {'pair ratio':>11}")
    for key, got in windows.items():
        base, this = statistics.median(got["base"]), statistics.median(got["this"])
        pairs = statistics.median(b / t for b, t in zip(got["base"], got["this"], strict=True))
        print(f"{key:<26} {base:>10.2f} {this:>10.2f} {base / this:>9.2f}x {pairs:>10.2f}x")


if __name__ == "__main__":
    main()
