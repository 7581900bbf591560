#!/usr/bin/env bash
# Per-call latency of several jax_ar trees and settings beside the LL floor
# probe, in one device command (ranks sharing one GPU under CUDA MPS), so
# that every ratio comes from one session. Every figure is one JSON line in
# OUT (benchmarks/per_call_overhead.py's fields: commit, variant, ranks,
# bytes_per_rank, case, us_per_call, ...; the probe's lines have
# "case": "ll_floor").
#
#   bash scripts/latency_ab.sh OUT JOB...
#
# JOB is one quoted word list:
#   "probe SIZES"                       ../shared/probes/ll_floor.py (carried in
#                                       ./probes), SIZES like 1K,16K,256K
#   "tree VARIANT DIR ARGS"             benchmarks/per_call_overhead.py ARGS with
#                                       the jax_ar of DIR (its prebuilt modules:
#                                       scripts/build_for_gpu.sh)
#   "own VARIANT DIR ARGS"              DIR's own benchmarks/per_call_overhead.py
#                                       (an older tree's method: one launch per
#                                       sample), its "per call" lines in the log
#   "bench VARIANT DIR ARGS"            python -m jax_ar bench --platform gpu ARGS
#                                       with the jax_ar of DIR (its own -N ranks:
#                                       --op rms_norm for the fused kernel), its
#                                       table in the log as "bench (VARIANT): ..."
#   "run CMD..."                        any command under the same MPS daemon
#                                       (python -m jax_ar bench --op rms_norm, a
#                                       test worker), with this tree's jax_ar
# each at RANKS (default "2 4 8") ranks, each run of a job at most JOB_TIMEOUT_S
# seconds (default 300: a kernel variant that hangs costs no more). Logs go
# to OUT.log.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(realpath "$1")"; shift
LOG="$OUT.log"
RANKS="${RANKS:-2 4 8}"
JOB_TIMEOUT_S="${JOB_TIMEOUT_S:-300}"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/jax_ar_ab_mps CUDA_MPS_LOG_DIRECTORY=/tmp/jax_ar_ab_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || echo "MPS did not start (already running?)" >> "$LOG"
trap 'echo quit | timeout 20 nvidia-cuda-mps-control' EXIT

bytes_of() { "$PYTHON" -c "
import sys
units = {'K': 1 << 10, 'M': 1 << 20}
print(' '.join(str(int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)) for s in sys.argv[1].split(',')))" "$1"; }

probe() {  # probe SIZES
  local n b r d pids
  for n in $RANKS; do
    for b in $(bytes_of "$1"); do
      d="$(mktemp -d)"; pids=""
      for r in $(seq 0 $((n - 1))); do
        timeout 120 "$PYTHON" "$here/probes/ll_floor.py" "$r" "$n" "$d" "$b" > "$d/out$r" 2>> "$LOG" &
        pids="$pids $!"
      done
      wait $pids
      "$PYTHON" - "$d/out0" "$OUT" <<'PY' >> "$LOG"
import datetime, json, sys
for line in open(sys.argv[1]):
    p = json.loads(line)
    row = {"commit": "probe", "variant": "ll_floor", "case": "ll_floor", "ranks": p["world"],
           "bytes_per_rank": p["bytes"], "dtype": "float32", "us_per_call": p["ll_us_per_call"],
           "copy_us_per_call": p["copy_us_per_call"], "blocks": p["blocks"],
           "no_timeouts": p["no_timeouts"],
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    open(sys.argv[2], "a").write(json.dumps(row) + "\n")
    print("ll_floor", row["ranks"], row["bytes_per_rank"], row["us_per_call"])
PY
    done
  done
}

# launch_each LABEL DIR SCRIPT ARGS...: SCRIPT (relative to DIR) with DIR's
# jax_ar, at each of $RANKS ranks; rank 0's "per call:" lines go to the log
# as "per call (LABEL, N ranks):".
launch_each() {
  local label="$1" dir; dir="$(realpath "$2")"; local script="$3"; shift 3
  local n
  for n in $RANKS; do
    echo "===== $label, $n ranks ($(date -u +%H:%M:%S)): $*" >> "$LOG"
    (cd "$dir" && PYTHONPATH="$dir" timeout "$JOB_TIMEOUT_S" "$PYTHON" -m jax_ar launch --platform gpu \
      --timeout $((JOB_TIMEOUT_S - 20)) -n "$n" "$script" "$@") 2>&1 \
      | sed "s/^\(\[rank 0\] \)\?per call:/per call ($label, $n ranks):/" >> "$LOG" \
      || echo "FAILED: $label at $n ranks" | tee -a "$LOG"
  done
}

tree() {  # tree VARIANT DIR ARGS...
  local variant="$1" dir="$2"; shift 2
  launch_each "$variant" "$dir" "$here/benchmarks/per_call_overhead.py" \
    --variant "$variant" --json "$OUT" "$@"
}

own() {  # own VARIANT DIR ARGS...
  local variant="$1" dir="$2"; shift 2
  launch_each "$variant (own benchmark)" "$dir" benchmarks/per_call_overhead.py "$@"
}

bench() {  # bench VARIANT DIR ARGS...
  local variant="$1" dir; dir="$(realpath "$2")"; shift 2
  echo "===== bench $variant ($(date -u +%H:%M:%S)): $*" >> "$LOG"
  (cd "$dir" && PYTHONPATH="$dir" timeout "$JOB_TIMEOUT_S" "$PYTHON" -m jax_ar bench --platform gpu "$@") 2>&1 \
    | sed "s/^/bench ($variant): /" >> "$LOG" \
    || echo "FAILED: bench $variant" | tee -a "$LOG"
}

run() {  # run CMD...
  echo "===== run ($(date -u +%H:%M:%S)): $*" >> "$LOG"
  PYTHONPATH="$here" JAX_AR_TEST_PLATFORM=gpu timeout "$JOB_TIMEOUT_S" "$@" >> "$LOG" 2>&1 \
    || echo "FAILED: $*" | tee -a "$LOG"
}

for job in "$@"; do
  read -r -a words <<< "$job"
  "${words[@]}"
done
grep -h "^per call (\|^ll_floor\|^bench (\|FAILED" "$LOG"
