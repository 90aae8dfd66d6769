"""Where a reflected turn's CPU goes: cProfile on the event loop, each thread's CPU unprofiled.

    .venv/bin/python bench/experiments/reflector_cprofile.py [--turns 200] [--concurrency 16] [--out PREFIX]

One process, the all-in-one of ``./run bench reflector`` (bench/reflector.py's ``_app`` and
``_turn``: every service on one loopback gRPC server, embedded PostgreSQL and Qdrant, the local
MiniLM model, the offline auxiliary provider; the reflector's workers call diary, episodes, profiles
and skills over gRPC). After a warm-up of 40 turns, two phases, each with ``--turns`` new turns:

1. unprofiled: the turns are submitted (SubmitTurn, served in this process) and then drained by the
   harness (``--concurrency`` at once); for each of the two steps, the process's CPU per turn and
   each thread's (``/proc/self/task/*/stat``: the event loop's, gRPC's, ONNX's pool...), per turn;
2. profiled: the same with cProfile on the event-loop thread only, timed by that thread's CPU clock
   (``time.thread_time``: waiting on a socket or on the model's threads costs nothing here; the
   model's threads are in phase 1), printing the top functions by own and by cumulative CPU, in ms
   per turn, and the calls per turn (cProfile counts each resumption of a coroutine as a call).

To profile another tree (an A/B), put its root and its stubs first on PYTHONPATH and run this file
from there with this tree's interpreter, e.g. from the base tree (W: this worktree):
``PYTHONPATH=$PWD:$PWD/libs/common/gen $W/.venv/bin/python $W/bench/experiments/reflector_cprofile.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from bench.harness import script as bench_module  # noqa: E402
from bench.harness import thread_cpu as harness_thread_cpu  # noqa: E402


def thread_cpu() -> dict[int, tuple[str, float]]:
    """{thread id: (its name, user + system CPU seconds)} of this process's threads."""
    return {tid: (name, user + system) for tid, (name, user, system) in harness_thread_cpu(os.getpid()).items()}


def by_thread(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], n: int) -> dict[str, float]:
    """CPU ms per turn by thread name (threads of one name summed; a thread born meanwhile counts
    from zero)."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        out[name] = out.get(name, 0.0) + (cpu - before.get(tid, (name, 0.0))[1]) * 1000 / n
    return out


def top(stats: pstats.Stats, n: int, key: int, limit: int) -> list[str]:
    """The ``limit`` functions with the most own (key 2) or cumulative (key 3) time: ms per turn,
    calls per turn."""
    rows: list[tuple[Any, ...]] = [(*value[:4], func) for func, value in stats.stats.items()]  # type: ignore[attr-defined]
    rows.sort(key=lambda r: -r[key])
    lines = [f"{'own ms/turn':>12} {'cum ms/turn':>12} {'calls/turn':>11}  function"]
    for _cc, nc, tt, ct, (file, line, fn) in rows[:limit]:
        where = re.sub(r"^.*/(site-packages|python3\.\d+|wt/[^/]+|base-[^/]+)/", "", file)
        lines.append(f"{tt * 1000 / n:>12.3f} {ct * 1000 / n:>12.3f} {nc / n:>11.2f}  {where}:{line}({fn})")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200, help="turns per phase (unprofiled, profiled)")
    parser.add_argument("--concurrency", type=int, default=16, help="turns reflected at once")
    parser.add_argument("--top", type=int, default=30, help="functions listed per table")
    parser.add_argument("--out", type=Path, default=None, help="write PREFIX.pstats (the reflect phase's profile)")
    args = parser.parse_args()
    rb = bench_module("reflector")
    n = args.turns
    with tempfile.TemporaryDirectory(prefix="cprofile-reflector-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            infra, components, channel, skills = await rb._app(Path(tmp), args.concurrency, stack)
            from agentlearn.reflector.v1 import reflector_service_pb2 as pb
            from agentlearn.reflector.v1 import reflector_service_pb2_grpc as pb_grpc

            stub = pb_grpc.ReflectorServiceStub(channel)
            harness = components["reflector"].service.harness
            seats = rb.SEATS

            async def submit(count: int, first: int) -> None:
                for i in range(first, first + count):
                    seat = seats[i % len(seats)]
                    t = rb._turn(i, seat, skills[seat], infra.clock.now())
                    await stub.SubmitTurn(pb.SubmitTurnRequest(turn=t))

            async def drain() -> None:
                async with asyncio.TaskGroup() as group:
                    for _ in range(1 if hasattr(harness, "_dispatch") else args.concurrency):
                        group.create_task(harness.drain())

            async def phase(first: int, profiler: cProfile.Profile | None, step: str) -> tuple[float, dict[str, float]]:
                """One step (submit or reflect) of ``n`` turns: process CPU ms per turn, by thread."""
                threads0, cpu0 = thread_cpu(), time.process_time()
                if profiler is not None:
                    profiler.enable()
                try:
                    await (submit(n, first) if step == "submit" else drain())
                finally:
                    if profiler is not None:
                        profiler.disable()
                return (time.process_time() - cpu0) * 1000 / n, by_thread(threads0, thread_cpu(), n)

            await submit(40, 10**6)  # warm-up: the model, the pools, the prepared statements
            await drain()
            print(f"reflector cProfile: {n} turns a phase, {args.concurrency} reflected at once (all-in-one, offline)")
            cpu_s, threads_s = await phase(0, None, "submit")
            cpu_r, threads_r = await phase(0, None, "reflect")
            for step, cpu, threads in (("submit", cpu_s, threads_s), ("reflect", cpu_r, threads_r)):
                ranked = sorted(threads.items(), key=lambda kv: -kv[1])
                shares = ", ".join(f"{k} {v:.1f}" for k, v in ranked if v >= 0.05)
                print(f"unprofiled {step}: process CPU {cpu:.1f} ms/turn; by thread (ms/turn): {shares}")
            done = await infra.pool.fetchval("SELECT count(*) FROM reflections WHERE state = 'completed'")
            assert done == n + 40, f"{done} of {n + 40} reflected"
            profiles = {step: cProfile.Profile(time.thread_time) for step in ("submit", "reflect")}
            loop_cpu: dict[str, float] = {}
            for step, profiler in profiles.items():
                t0 = time.thread_time()
                await phase(10**5, profiler, step)
                loop_cpu[step] = (time.thread_time() - t0) * 1000 / n
    for step, profiler in profiles.items():
        stats = pstats.Stats(profiler)
        if args.out is not None and step == "reflect":
            stats.dump_stats(str(args.out.with_suffix(".pstats")))
        print(f"\nprofiled {step}: event-loop thread CPU {loop_cpu[step]:.1f} ms/turn (with the profiler's own cost)")
        print(f"top {args.top} by own time ({step}):")
        print("\n".join(top(stats, n, 2, args.top)))
        print(f"top {args.top} by cumulative time ({step}):")
        print("\n".join(top(stats, n, 3, args.top)))


if __name__ == "__main__":
    asyncio.run(main())
