#!/bin/bash
# A/B of bench/experiments/reflector_writes.py (this branch's script), arms alternated in each round:
#   writes-ab.sh "1 2" "base branch"          (16:22-16:28 UTC)
#   writes-ab.sh "3 4" "base branch patch"    (16:28-16:36 UTC)
# base: main 6abc384 in /tmp/base-w10; branch: /work/wt/reflectdb; patch: a copy of the branch at
# 635dceb with lever2-append-observation.patch applied (/tmp/reflectdb-l2). The other trees' modules
# go first on PYTHONPATH; the same interpreter for all.
R=/work/wt/reflectdb/docs/perf/runs/2026-12-02-w10-reflectdb
S=/work/wt/reflectdb/bench/experiments/reflector_writes.py
PY=/work/wt/reflectdb/.venv/bin/python
declare -A TREE=([base]=/tmp/base-w10 [branch]=/work/wt/reflectdb [patch]=/tmp/reflectdb-l2)
for round in $1; do
  for arm in $2; do
    t=${TREE[$arm]}
    (cd "$t" && { date -u; uptime; PYTHONPATH=$t:$t/libs/common/gen $PY $S --calls 400 2>/dev/null; uptime; } \
      > "$R/writes-$round-$arm.txt")
  done
done
