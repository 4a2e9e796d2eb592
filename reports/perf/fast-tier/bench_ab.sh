#!/bin/bash
# distsim bench's sweep, GPT-3 and engine figures for two checkouts, interleaved in one run
# (before, after, before, after), each with its own Python:
#   reports/perf/fast-tier/bench_ab.sh BEFORE_DIR BEFORE_PYTHON AFTER_DIR AFTER_PYTHON OUT_DIR
set -e
before=$1; before_py=$2; after=$3; after_py=$4; out=$5
mkdir -p "$out"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then dir=$before; py=$before_py; else dir=$after; py=$after_py; fi
    (cd "$dir" && PYTHONPATH="$dir" "$py" -m distsim bench --only sweep --only gpt3 \
       --only engine --json --out "$out/${side}_$round.json" > /dev/null)
  done
done
