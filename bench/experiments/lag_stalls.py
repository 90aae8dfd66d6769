"""Where the reflector's mid-run lag stalls come from: the lag run lined up with the disk and CPU.

    .venv/bin/python bench/experiments/lag_stalls.py [--rate 30] [--seconds 20] [--probe 60]

1. ``--probe S``: S seconds of 4 KiB writes each followed by ``fdatasync`` (what a PostgreSQL commit
   waits on), alone, before anything else runs: the disk's own flush latency, p50/p99/max, and every
   flush over 50 ms with when it happened.
2. ``bench/reflector.py --rates R --lag-timeline`` in a child process while this process samples
   ``/proc/diskstats`` (the root disk: writes completed, ms spent writing, ms busy),
   ``/proc/stat`` (idle, iowait, steal) every 50 ms. Then every window of 0.25 s or more in which the
   queue was behind (turns sent and not done) yet no turn completed is printed with what the disk and
   the CPUs did meanwhile: did the disk complete writes, was it busy, were the CPUs idle in iowait or
   stolen by the hypervisor.

A stall the disk causes reads as: zero writes completed for the window while the disk is 100% busy,
then one burst of writes whose summed wait is the window's length, and the CPUs idle in iowait. The
probe shows whether the disk does that with nothing of ours running.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def root_disk() -> str:
    """The block device ``/`` lives on, as ``/proc/diskstats`` names it (``vda``, ``sda``, ``nvme0n1``)."""
    dev = os.stat("/").st_dev
    major, minor = os.major(dev), os.minor(dev)
    for line in open("/proc/diskstats"):
        f = line.split()
        if int(f[0]) == major and int(f[1]) == minor:
            return f[2]
    return open("/proc/diskstats").readline().split()[2]


def probe(seconds: float) -> None:
    """The disk's flush latency alone: 4 KiB pwrite + fdatasync, ~200 a second."""
    with tempfile.NamedTemporaryFile(dir=ROOT) as f:
        fd, buf, out = f.fileno(), os.urandom(4096), []
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            a = time.perf_counter()
            os.pwrite(fd, buf, (i % 256) * 4096)
            os.fdatasync(fd)
            out.append((a - start, time.perf_counter() - a))
            i += 1
            time.sleep(0.005)
    lat = sorted(x for _, x in out)

    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

    print(
        f"disk alone: {len(lat)} fdatasyncs in {seconds:.0f} s: p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, "
        f"p99.9 {q(0.999):.1f} ms, max {lat[-1] * 1000:.0f} ms"
    )
    slow = [(at, x) for at, x in out if x > 0.05]
    print("  over 50 ms: " + (", ".join(f"{x * 1000:.0f} ms at {at:.1f} s" for at, x in slow) or "none"))


class Sampler(threading.Thread):
    """Disk and CPU counters every 50 ms until stopped."""

    def __init__(self, disk: str):
        super().__init__(daemon=True)
        self.disk, self.rows, self.done = disk, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.time()
            for line in open("/proc/diskstats"):
                f = line.split()
                if f[2] == self.disk:
                    writes, write_ms, busy_ms = int(f[7]), int(f[10]), int(f[12])
            cpu = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
            self.rows.append((t, writes, write_ms, busy_ms, cpu))
            time.sleep(0.05)


def stalls(timeline: list[dict[str, float]], rows: list[tuple], min_s: float) -> None:
    """Windows of >= min_s with turns outstanding and none completing, and the disk and CPUs meanwhile."""
    first = min(r["sent"] for r in timeline)
    dones = sorted(r["done"] for r in timeline)
    sents = sorted(r["sent"] for r in timeline)
    found = 0
    for prev, nxt in itertools.pairwise(dones):
        gap = nxt - prev
        outstanding = sum(1 for s in sents if s <= prev) - sum(1 for d in dones if d <= prev)
        if gap < min_s or outstanding <= 0:
            continue
        found += 1
        inside = [r for r in rows if prev <= r[0] <= nxt]
        if len(inside) < 2:
            continue
        a, b = inside[0], inside[-1]
        span_ms = (b[0] - a[0]) * 1000
        cpu = [y - x for x, y in zip(a[4], b[4], strict=True)]
        total = sum(cpu) or 1
        # the longest run of samples with no write completed while the disk was busy
        frozen, run = 0.0, 0.0
        for x, y in itertools.pairwise(inside):
            if y[1] == x[1] and y[3] > x[3]:
                run += y[0] - x[0]
                frozen = max(frozen, run)
            else:
                run = 0.0
        print(
            f"  {prev - first:6.2f} s: no turn completed for {gap * 1000:4.0f} ms ({outstanding} outstanding); "
            f"disk: {b[1] - a[1]} writes completed, busy {(b[3] - a[3]) / span_ms * 100:3.0f}%, "
            f"no write completed while busy for {frozen * 1000:3.0f} ms; CPUs: idle {cpu[3] * 100 / total:3.0f}%, "
            f"iowait {cpu[4] * 100 / total:3.0f}%, steal {cpu[7] * 100 / total:3.0f}%"
        )
    if not found:
        print(f"  none (no window of {min_s * 1000:.0f} ms or more with turns outstanding and none completing)")
    whole = [y - x for x, y in zip(rows[0][4], rows[-1][4], strict=True)]
    total = sum(whole) or 1
    print(
        f"  over the whole sampling: CPUs idle {whole[3] * 100 / total:.0f}%, iowait {whole[4] * 100 / total:.0f}%, "
        f"steal {whole[7] * 100 / total:.0f}% (steal: time the hypervisor ran something else on our vCPUs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="SubmitTurn calls a second (the lag run's rate)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--probe", type=float, default=60.0, help="seconds of the disk-alone probe first (0: skip)")
    parser.add_argument("--min-stall", type=float, default=0.25, help="shortest window reported, seconds")
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} load {open('/proc/loadavg').read().strip()}")
    if args.probe:
        probe(args.probe)
    disk = root_disk()
    sampler = Sampler(disk)
    sampler.start()
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as tl:
        cmd = [
            sys.executable, "bench/reflector.py", "--turns", "40", "--concurrency", "16",
            "--rates", f"{args.rate:g}", "--seconds", f"{args.seconds:g}", "--lag-timeline", tl.name,
        ]  # fmt: skip
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        sampler.done.set()
        sampler.join()
        timeline = [json.loads(line) for line in open(tl.name)]
    for line in run.stdout.splitlines():
        if line.strip().startswith(("rate/s", f"{args.rate:.1f}", f"{args.rate:g}/s")):
            print(line)
    lags = [r["done"] - r["sent"] for r in timeline]
    print(f"lag median {statistics.median(lags) * 1000:.0f} ms over {len(lags)} turns; stalls (disk {disk}):")
    stalls(timeline, sampler.rows, args.min_stall)


if __name__ == "__main__":
    main()
