"""Summarise a ``python -X importtime`` log: the total, the heaviest top-level packages (cumulative,
each counted once at its outermost import) and the heaviest single modules (self time).

    .venv/bin/python bench/experiments/importtime.py docs/perf/before-diary-fill-importtime.log [--top 25]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows = []
    for line in a.log.read_text().splitlines():
        if m := _LINE.match(line):
            rows.append((int(m[1]), int(m[2]), len(m[3]) // 2, m[4]))
    total = sum(c for _, c, depth, _ in rows if depth == 0)
    self_total = sum(s for s, _, _, _ in rows)
    print(f"{len(rows)} modules imported; {total / 1e6:.2f} s cumulative at top level ({self_total / 1e6:.2f} s self)")
    # Self time per top-level package (the first dotted part): where the import seconds belong.
    by_pkg: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for s, _, _, name in rows:
        by_pkg[name.split(".")[0]] += s
        count[name.split(".")[0]] += 1
    print(f"\nself import time by top-level package (top {a.top}):")
    for pkg, us in by_pkg.most_common(a.top):
        print(f"  {us / 1000:8.1f} ms  {100 * us / self_total:5.1f}%  {pkg} ({count[pkg]} modules)")
    print(f"\nheaviest modules by cumulative time, outermost import only (top {a.top}):")
    for _s, c, depth, name in sorted((r for r in rows if r[2] <= 1), key=lambda r: -r[1])[: a.top]:
        print(f"  {c / 1000:8.1f} ms  depth {depth}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
