#!/usr/bin/env bash
# `./run pass diary-fill` with nothing to do: wall time and peak RSS of the whole process, N runs,
# against an already-running, already-migrated PostgreSQL (what a CronJob pod sees: the database
# is there; the pod starts, connects, finds nothing, exits). The vector index is the embedded one
# in a scratch data dir. Prints one line per run and the medians.
#   bench/experiments/passfill.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${1:-5}"
TMP="$(mktemp -d /tmp/passfill-XXXX)"
exec 3> >(.venv/bin/python bench/experiments/pg_hold.py "$TMP" > "$TMP/dsn.txt")
for _ in $(seq 1 120); do grep -q '^DSN ' "$TMP/dsn.txt" 2>/dev/null && break; sleep 0.5; done
DSN="$(sed -n 's/^DSN //p' "$TMP/dsn.txt")"
echo "database: $DSN (embedded, migrated, empty); load: $(cut -d' ' -f1-3 /proc/loadavg)"
# This sandbox exports PYTHONDONTWRITEBYTECODE=1 (so the repo's own modules compile from source on
# every start); the image compiles its bytecode at build time. Measure both: "./run pass" as the
# issue states it, and the image's command with the bytecode precompiled (into a scratch prefix).
PYC="$TMP/pyc"
# A cache prefix is used for EVERY import, the standard library's too (compiling only libs,
# services and the venv into it left the standard library compiled from source on every start, and
# the "precompiled" runs slower than the plain ones): one run that may write bytecode fills it with
# exactly what the pass imports.
DATABASE_URL="$DSN" env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PYC" \
  .venv/bin/python -m services.runner pass diary-fill --data-dir "$TMP/data" >/dev/null 2>&1 || true
measure() {  # label, command...
  local label="$1"; shift
  : > "$TMP/times.txt"
  for _ in $(seq 1 "$RUNS"); do
    DATABASE_URL="$DSN" /usr/bin/time -f "%e s wall, %M KB peak RSS, %U s user, %S s sys" \
      "$@" 2>&1 >/dev/null | tail -1 >> "$TMP/times.txt"
  done
  .venv/bin/python - "$label" "$TMP/times.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[2])]
wall = [float(r[0]) for r in rows]; rss = [int(r[3]) / 1024 for r in rows]; cpu = [float(r[7]) + float(r[10]) for r in rows]
print(f"{sys.argv[1]}: median of {len(rows)}: {statistics.median(wall):.2f} s wall, {statistics.median(cpu):.2f} s CPU, "
      f"{statistics.median(rss):.0f} MB peak RSS (wall min {min(wall):.2f}, max {max(wall):.2f})")
PY
}
measure "./run pass diary-fill" ./run pass diary-fill --data-dir "$TMP/data"
measure "python -m services.runner pass diary-fill, bytecode precompiled" \
  env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PYC" .venv/bin/python -m services.runner pass diary-fill --data-dir "$TMP/data"
exec 3>&-
sleep 2
rm -rf "$TMP"
