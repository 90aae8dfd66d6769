#!/usr/bin/env bash
# The flame graphs of docs/perf/ (issue 14, "measure before you change anything"), reproduced.
#
#   bench/profile.sh [all|prefetch|diary|reflector|diary-fill|summary|ab] [stem-prefix=before]
#
# Each writes docs/perf/<prefix>-<name>.svg (py-spy's flame graph) and <prefix>-<name>.txt (the exact
# py-spy command, the load, the latencies while sampling, the event-loop lag, the spans per request).
# py-spy attaches to a running process, which needs root (or ptrace rights). Run it on a quiet
# machine if you can; the shares of samples hold up under load far better than the latencies.
#
# What runs (bench/experiments/profile_load.py says more):
#   prefetch    BuildTurnContext, rich trigger, 100 seats x (500 notes, 500 episodes, 20 skills, a profile)
#               loaded by bench/prefetch.py's own loader; 1 caller back to back for 40 s; the server is a
#               subprocess with tracing installed as ./run up installs it; py-spy on the server's pid.
#   diary       WriteNote from 16 concurrent writers for 40 s, the diary alone in a subprocess.
#   reflector   bench reflector's all-in-one: 300 turns queued, then drained by 2 harness workers;
#               py-spy on that process for the drain.
#   diary-fill  `python -m services.runner pass diary-fill` with nothing to do, whole life under py-spy
#               (against an already migrated PostgreSQL, as a CronJob pod finds it), and its
#               `python -X importtime` log.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
P="${2:-before}"
PY=.venv/bin/python
SPY=.venv/bin/py-spy
OUT=docs/perf
mkdir -p "$OUT"
./run env >/dev/null 2>&1 || ./run env

prefetch()  { $PY bench/experiments/profile_load.py prefetch  --seats 100 --concurrency 1 --seconds 40 --rate 100 --out "$OUT/$P-prefetch"; }
diary()     { $PY bench/experiments/profile_load.py diary     --writers 16 --seconds 40 --rate 100 --out "$OUT/$P-diary"; }
reflector() { $PY bench/experiments/profile_load.py reflector --turns 300 --workers 2 --rate 100 --out "$OUT/$P-reflector"; }

diary_fill() {
  local tmp; tmp="$(mktemp -d /tmp/profile-fill-XXXX)"
  # An embedded PostgreSQL with every migration applied, held open for the pass to connect to.
  exec 3> >($PY bench/experiments/pg_hold.py "$tmp" > "$tmp/dsn.txt")
  for _ in $(seq 1 240); do grep -q '^DSN ' "$tmp/dsn.txt" 2>/dev/null && break; sleep 0.5; done
  local dsn; dsn="$(sed -n 's/^DSN //p' "$tmp/dsn.txt")"
  DATABASE_URL="$dsn" $PY -m services.runner pass diary-fill --data-dir "$tmp/data" >/dev/null 2>&1  # warm the page cache
  DATABASE_URL="$dsn" $SPY record --native --full-filenames --rate 250 --format flamegraph --output "$OUT/$P-diary-fill.svg" -- \
    $PY -m services.runner pass diary-fill --data-dir "$tmp/data" 2>&1 | tail -2 > "$tmp/spy.txt"
  DATABASE_URL="$dsn" $PY -X importtime -m services.runner pass diary-fill --data-dir "$tmp/data" \
    2> "$OUT/$P-diary-fill-importtime.log" >/dev/null
  {
    echo "scenario: python -m services.runner pass diary-fill, nothing to do, against a migrated embedded PostgreSQL"
    echo "py-spy: $SPY record --native --full-filenames --rate 250 --format flamegraph --output $OUT/$P-diary-fill.svg -- $PY -m services.runner pass diary-fill --data-dir <scratch>"
    echo "py-spy said: $(tail -1 "$tmp/spy.txt")"
    echo "load average at the end: $(cat /proc/loadavg)"
    echo "importtime: $PY -X importtime -m services.runner pass diary-fill > $OUT/$P-diary-fill-importtime.log"
    $PY bench/experiments/importtime.py "$OUT/$P-diary-fill-importtime.log"
  } > "$OUT/$P-diary-fill.txt"
  cat "$OUT/$P-diary-fill.txt"
  exec 3>&-
  sleep 2
  rm -rf "$tmp"
}

summary() {
  for f in "$OUT/$P"-{prefetch,diary,reflector,diary-fill}.svg; do
    # Paths shortened for reading: site-packages/, the worktree and the stdlib prefix dropped.
    [ -f "$f" ] && $PY bench/experiments/flamesummary.py "$f" \
      | sed -E "s#$PWD/\.venv/lib/python3\.[0-9]+/site-packages/##g; s#$PWD/##g; s#/root/\.pyenv/versions/[^/]+/lib/python3\.[0-9]+/##g" \
      > "${f%.svg}.summary.txt" && echo "wrote ${f%.svg}.summary.txt"
  done
}

case "$what" in
  all) prefetch; diary; reflector; diary_fill; summary ;;
  # The A/B experiments behind analysis.md's measured gains (two servers, calls alternated).
  ab)
    $PY bench/experiments/profile_load.py onnx-ab --variant onnx1 --seats 30 --ab 150 --out docs/perf/runs/onnx-ab
    $PY bench/experiments/profile_load.py onnx-ab --variant gc-freeze --seats 30 --ab 150 --out docs/perf/runs/gc-freeze-ab
    $PY bench/experiments/profile_load.py writenote-ab --writers 16 --seconds 10 --windows 6 --out docs/perf/runs/writenote-ab
    $PY bench/experiments/profile_load.py reflector --census-only --out docs/perf/runs/reflector-census ;;
  prefetch|diary|reflector|summary) "$what" ;;
  diary-fill) diary_fill ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
