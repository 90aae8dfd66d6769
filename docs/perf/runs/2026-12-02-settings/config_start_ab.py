"""Interleaved A/B: CPU of a fresh interpreter importing libs.common.config and calling load_settings().

    .venv/bin/python docs/perf/runs/2026-12-02-settings/config_start_ab.py THIS_TREE OTHER_TREE RUNS PYTHON

Each round runs both trees once (PYTHONPATH = the tree, cwd = the tree); the first round only
writes each tree's bytecode (a PYTHONPYCACHEPREFIX of its own), the others are timed with the
kernel's accounting of the child (user + system).
"""

import os
import resource
import statistics
import subprocess
import sys
import tempfile

trees = {"this": sys.argv[1], "parent": sys.argv[2]}
runs = int(sys.argv[3])
py = sys.argv[4]
code = "from libs.common.config import load_settings; load_settings(None, env={})"
cache = tempfile.mkdtemp()
cpu: dict[str, list[float]] = {k: [] for k in trees}
print("uptime:", os.popen("uptime").read().strip())
for i in range(runs + 1):
    for name, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=tree, PYTHONPYCACHEPREFIX=f"{cache}/{name}")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([py, "-c", code], cwd=tree, env=env, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:  # the first round writes bytecode
            cpu[name].append((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
for name, xs in cpu.items():
    xs.sort()
    med, p90, low = statistics.median(xs) * 1000, xs[int(len(xs) * 0.9)] * 1000, xs[0] * 1000
    print(f"{name:7s} median {med:6.1f} ms CPU  p90 {p90:6.1f}  min {low:6.1f}  (n={len(xs)})")
this, other = statistics.median(cpu["this"]), statistics.median(cpu["parent"])
print(f"this / parent: CPU x{this / other:.2f}, difference {1000 * (other - this):.1f} ms")
print("uptime:", os.popen("uptime").read().strip())
