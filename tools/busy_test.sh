#!/bin/bash
# `make test` in a fresh clone of this checkout while stress-ng keeps one core busy: what to run
# before resolving an issue (CI's machine may be busy too). RUNS=n repeats it. Results: one line a
# run in /tmp/busyn.out, the whole output in /tmp/cb-busy<i>.log. About 25 minutes a run on 2 cores.
set -u
RUNS=${RUNS:-1}
SRC=$(cd "$(dirname "$0")/.." && pwd)
command -v stress-ng >/dev/null || apt-get install -y -q stress-ng >/dev/null
for i in $(seq 1 "$RUNS"); do
  rm -rf /tmp/cb && git clone -q "$SRC" /tmp/cb
  stress-ng --cpu 1 --timeout 3600 >/dev/null 2>&1 & S=$!
  start=$(date +%s)
  (cd /tmp/cb && make test) > "/tmp/cb-busy$i.log" 2>&1; rc=$?
  kill "$S" 2>/dev/null
  # pytest's summary line (make test prints mypy's report after it)
  echo "run $i: rc=$rc $(( $(date +%s) - start )) s $(grep -E "[0-9]+ (passed|failed)" "/tmp/cb-busy$i.log" | tail -1)" >> /tmp/busyn.out
done
