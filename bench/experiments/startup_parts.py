"""The parts of a short-lived process's life, measured from inside (issue 14: diary-fill with nothing
to do): importing the runner, loading the embedding model, and the interpreter's teardown (the
process's exit, measured by the parent as wall time after the child's last line). Measurement only.

    .venv/bin/python bench/experiments/startup_parts.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CHILD = r"""
import time, sys, gc, resource
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
r0 = rss()
t0 = time.perf_counter()
import services.runner.cli  # everything ./run pass imports
t1 = time.perf_counter()
r1 = rss()
from libs.common.embeddings.local_onnx import LocalMiniLMEmbedder
e = LocalMiniLMEmbedder(); e.load()
t2 = time.perf_counter()
r2 = rss()
if "freeze" in sys.argv:
    gc.freeze()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {len(gc.get_objects())} {len(sys.modules)} {r0} {r1} {r2}", flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    for mode in ("", "freeze"):
        rows = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()  # type: ignore[union-attr]
            t_line = time.perf_counter()
            p.wait()
            t_end = time.perf_counter()
            imp, load, objs, mods, r0, r1, r2 = line.split()
            rows.append(
                (float(imp), float(load), t_end - t_line, t_line - t0, int(objs), int(mods), int(r0), int(r1), int(r2))
            )
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(
            f"{'gc.freeze() before exit' if mode else 'as is':<24} import runner {med[0]:.2f} s, "
            f"load MiniLM {med[1]:.2f} s, "
            f"exit (teardown) {med[2]:.2f} s, start to last line {med[3]:.2f} s; {rows[0][4]:,} objects tracked by "
            f"the GC, {rows[0][5]} modules (median of {a.runs}; load {open('/proc/loadavg').read().split()[0]}); "
            f"peak RSS: interpreter {rows[0][6]} MB, after the imports {rows[0][7]} MB, after MiniLM {rows[0][8]} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
