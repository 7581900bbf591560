#!/usr/bin/env bash
# Device command: variants beside main in turn (main, each variant, each
# variant again in reverse order, main) with the LL floor probe, at 2, 4
# and 8 ranks:
#   bash experiments/ab.sh NAME[,NAME...] PROBE_SIZES PER_CALL_ARGS...
# Carry the root modules (jax_ar/_jax_ar_cuda*.so, jax_ar/_jax_ar_cpu*.so,
# jax_ar/PREBUILT), ab/NAME.tar.gz of each and probes (experiments/prepare.sh).
# PER_CALL_ARGS go to benchmarks/per_call_overhead.py; PROBE_SIZES is "" for
# no probe. Writes $OUT/latency.jsonl (scripts/latency_ab.sh), its log,
# benchmarks/latency_table.py's table of it and experiments/pick.py's choice
# among CANDIDATES (comma-separated; default every variant, so name them
# when diagnostics run beside), and leaves that choice in /tmp/ab_pick.txt
# for experiments/land.sh on the same warm machine.
set -u
cd "$(dirname "$0")/.."
IFS=, read -r -a names <<< "$1"
sizes="$2"; shift 2
for name in "${names[@]}"; do
  mkdir -p "ab/m$name" && tar -xzf "ab/$name.tar.gz" -C "ab/m$name"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
jobs=()
[ -n "$sizes" ] && jobs+=("probe $sizes")
jobs+=("tree main . $*")
for name in "${names[@]}"; do jobs+=("tree $name ab/m$name $*"); done
for ((i = ${#names[@]} - 1; i >= 0; i--)); do jobs+=("tree ${names[i]} ab/m${names[i]} $*"); done
jobs+=("tree main . $*")
JOB_TIMEOUT_S="${JOB_TIMEOUT_S:-120}" timeout "${AB_TIMEOUT_S:-540}" \
  bash scripts/latency_ab.sh "$OUT/latency.jsonl" "${jobs[@]}"
python3 benchmarks/latency_table.py "$OUT/latency.jsonl" | tee "$OUT/table.md"
python3 experiments/pick.py "$OUT/latency.jsonl" ${CANDIDATES:+--candidates "$CANDIDATES"} \
  | tee "$OUT/pick.txt" /tmp/ab_pick.txt
