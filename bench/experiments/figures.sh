#!/usr/bin/env bash
# The issue-14 figures as they stand, one benchmark after another, each log with the load average
# before and after (the machine is shared: read the medians and the ratios).
#   bench/experiments/figures.sh [outdir=docs/perf/runs] [names...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-docs/perf/runs}"; shift || true
NAMES=("${@:-prefetch diary reflector locomo passfill}")
mkdir -p "$OUT"
for name in ${NAMES[*]}; do
  log="$OUT/$name.log"
  { echo "# $(date -u +%FT%TZ) load before: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$log"
  case "$name" in
    reflector) cmd=(./run bench reflector --rates 10,50 --seconds 20) ;;
    passfill)  cmd=(bench/experiments/passfill.sh 5) ;;
    *)         cmd=(./run bench "$name") ;;
  esac
  echo "# ${cmd[*]}" >> "$log"
  start=$(date +%s)
  "${cmd[@]}" >> "$log" 2> "$OUT/$name.stderr"
  echo "# exit $? after $(( $(date +%s) - start )) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
done
