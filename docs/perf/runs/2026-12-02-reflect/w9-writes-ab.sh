#!/bin/bash
# UpsertProfile / AppendSkillObservation alone, base and branch interleaved (same interpreter).
PY=/work/wt/reflect/.venv/bin/python
S=/work/wt/reflect/bench/experiments/reflector_writes.py
out=/tmp/reflect-runs
for round in 1 2 3 4; do
  for tree in base branch; do
    f=$out/writes-$round-$tree.txt
    if [ $tree = base ]; then
      echo "# $(date -u +%FT%TZ) round $round base: cd /tmp/base-w9 && PYTHONPATH=/tmp/base-w9:/tmp/base-w9/libs/common/gen $PY $S --calls 400; load $(cut -d' ' -f1 /proc/loadavg)" > $f
      (cd /tmp/base-w9 && PYTHONPATH=/tmp/base-w9:/tmp/base-w9/libs/common/gen $PY $S --calls 400) >> $f 2>/dev/null
    else
      echo "# $(date -u +%FT%TZ) round $round branch: cd /work/wt/reflect && $PY $S --calls 400; load $(cut -d' ' -f1 /proc/loadavg)" > $f
      (cd /work/wt/reflect && $PY $S --calls 400) >> $f 2>/dev/null
    fi
  done
done
echo done > $out/writes.done
