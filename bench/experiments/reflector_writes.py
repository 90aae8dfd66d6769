"""The reflector's heaviest writes alone: UpsertProfile, AppendSkillObservation and a pass's end.

    python bench/experiments/reflector_writes.py [--calls 400] [--subjects 40]

Calls each use case in this process (the service, no gRPC hop) one after the other, on the app
``bench reflector`` builds (embedded PostgreSQL), as a reflected turn's profiler and refiner do:
``--calls`` upserts spread over ``--subjects`` subjects of 20 seats (first a create, then merges),
and ``--calls`` observations appended to the skill seeded for each seat; then ``--calls`` turns
submitted, claimed and taken, and each pass ended as the harness ends a completed one (its job
finished and its record closed, the completion event held as a pass holds it). Prints, per use case,
wall ms per call (p50, p90) and this process's CPU ms per call. An A/B runs it from each tree in
turn (the other tree's modules first on ``PYTHONPATH``), interleaved: the machine's load moves between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path

from agentlearn.reflector.v1 import reflector_service_pb2 as pb
from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc
from bench.harness import quantile
from bench.reflector import SEATS, _app, _turn
from libs.common.events import bookkeeping
from services.reflector.convert import turn_from_pb
from services.reflector.domain import JOB_KIND, ReflectionState, WorkerOutcome, WorkerStatus
from services.skills.domain import ObservationKind, SkillKey


def _line(name: str, walls: list[float], cpu_s: float) -> str:
    n = len(walls)
    p50, p90 = quantile(walls, 0.5) * 1000, quantile(walls, 0.9) * 1000
    return f"{name:>24} {n:>6} {p50:>9.2f} {p90:>9.2f} {cpu_s * 1000 / n:>12.2f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--subjects", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reflector-writes-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            # The reflector benchmark's app (its services, one skill seeded a seat).
            _, components, channel, seeded = await _app(Path(tmp), 1, stack)
            profiles, skills = components["profiles"].service, components["skills"].service
            print(f"{'use case':>24} {'calls':>6} {'p50 ms':>9} {'p90 ms':>9} {'CPU ms/call':>12}")
            walls: list[float] = []
            cpu0 = time.process_time()
            for i in range(args.calls):
                seat = SEATS[i % len(SEATS)]
                t0 = time.perf_counter()
                await profiles.upsert_profile(
                    "acme",
                    seat,
                    (f"person{i % args.subjects}", "", "slack"),
                    "Writes brief, polite messages.",
                    [f"Let's ship release {i}."],
                    [],
                    ["release", f"notes{i % 7}"],
                    f"run-{i:05d}",
                    request_id=f"run-{i:05d}:profiler:{i % args.subjects}",
                )
                walls.append(time.perf_counter() - t0)
            print(_line("UpsertProfile", walls, time.process_time() - cpu0))
            walls = []
            cpu0 = time.process_time()
            for i in range(args.calls):
                seat = SEATS[i % len(SEATS)]
                t0 = time.perf_counter()
                await skills.append_observation(
                    SkillKey("acme", seat, id=uuid.UUID(seeded[seat][0])),
                    ObservationKind.OBSERVED,
                    f"Collected the merged PRs for release {i} first.",
                    f"run-{i:05d}",
                    request_id=f"run-{i:05d}:refiner",
                )
                walls.append(time.perf_counter() - t0)
            print(_line("AppendSkillObservation", walls, time.process_time() - cpu0))
            await _pass_ends(components["reflector"].service.harness, channel, seeded, args.calls)


async def _pass_ends(harness, channel, seeded, calls: int) -> None:  # type: ignore[no-untyped-def]
    """``calls`` passes ended one after the other, timed alone: the turns are submitted, claimed with
    the harness's worker id and taken first, and each pass is ended by the harness's own
    ``_finish`` (the same call in every tree, whatever its statements)."""
    stub = pb_grpc.ReflectorServiceStub(channel)
    now = harness._clock.now()
    for i in range(calls):
        seat = SEATS[i % len(SEATS)]
        await stub.SubmitTurn(pb.SubmitTurnRequest(turn=_turn(i, seat, seeded[seat], now)))
    jobs = await harness._queue.claim_many(JOB_KIND, harness._worker_id, harness._clock.now(), 3600, calls)
    turns = [turn_from_pb(pb.TurnCompleted.FromString(job.payload)) for job in jobs]
    for t in turns:
        await harness._store.take(t.company, t.seat, t.turn_id)
    outcomes = [WorkerOutcome("persist_decider", WorkerStatus.WROTE)]
    walls: list[float] = []
    cpu0 = time.process_time()
    for job, t in zip(jobs, turns, strict=True):
        t0 = time.perf_counter()
        with bookkeeping():  # the completion event is held, as in a pass, and not written
            await harness._finish(job, t, ReflectionState.COMPLETED, None, outcomes, outcomes)
        walls.append(time.perf_counter() - t0)
    print(_line("pass end (finish+close)", walls, time.process_time() - cpu0))


if __name__ == "__main__":
    asyncio.run(main())
