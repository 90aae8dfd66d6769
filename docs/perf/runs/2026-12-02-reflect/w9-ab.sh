#!/bin/bash
# A/B, interleaved: base tree (/tmp/base-w9, main 9bb5110) and this branch, same virtualenv.
ARGS="--turns 200 --concurrency 4,16 --rates 50 --seconds 10"
PY=/work/wt/reflect/.venv/bin/python
out=/tmp/reflect-runs
for round in 1 2 3; do
  for tree in base branch; do
    if [ $tree = base ]; then dir=/tmp/base-w9; env="PYTHONPATH=/tmp/base-w9:/tmp/base-w9/libs/common/gen"
    else dir=/work/wt/reflect; env="PYTHONPATH="; fi
    f=$out/ab-$round-$tree.txt
    { echo "# $(date -u +%FT%TZ) round $round $tree: cd $dir && $env $PY bench/reflector.py $ARGS"; echo "# load: $(cat /proc/loadavg)"; } > $f
    (cd $dir && env $env $PY bench/reflector.py $ARGS) >> $f 2>$out/ab-$round-$tree.err
    echo "# end $(date -u +%FT%TZ) load: $(cat /proc/loadavg)" >> $f
  done
done
echo ALLDONE > $out/ab.done
