#!/usr/bin/env bash
# The GPU run of jax_ar on the device machine (NVIDIA GPUs, no network),
# from the repository root:
#
#   bash scripts/gpu_run.sh all            # build, every test file, the benchmarks
#   bash scripts/gpu_run.sh STAGE...       # build | smoke | tests | bench
#
# `all` is resumable: each command runs within JAX_AR_GPU_BUDGET_S (default
# 560 s, for a device tool that allows 600 s per command), records what it
# finished under $JAX_AR_GPU_STATE (default /tmp/jax_ar_gpu_run, which
# outlives a command on a warm machine), and the next `all` skips it: the
# build is reused, finished test files and benchmarks are not run again.
# Two commands are enough for the whole run; each writes the summary of
# everything finished so far.
#
#   build  pip install -e . (CUDA module for CMAKE_CUDA_ARCHITECTURES, default 90);
#          with JAX_AR_GPU_PREBUILT=1, the modules scripts/build_for_gpu.sh
#          put in jax_ar/ on the CPU machine (carried to the device), no build
#   smoke  2 ranks, no pytest: the CUDA kernels' suites and all_reduce values
#   tests  every tests/test_*.py under JAX_AR_TEST_PLATFORM=gpu, one pytest per
#          file, JAX_AR_GPU_PARALLEL (default 2) files at a time (ranks share
#          the GPU under CUDA MPS; JAX_AR_GPU_TESTS overrides the list), after
#          the files that kill ranks on purpose or launch the whole block
#          budget for long, which run alone (JAX_AR_GPU_ALONE, default
#          tests/test_comm_faults.py, tests/test_cuda_kernels.py and
#          tests/test_ops_fuzz.py)
#   bench  benchmarks/per_call_overhead.py at 2, 4 and 8 ranks (breakdown
#          stages at 16 KB), benchmarks/rms_norm_bench.py (one GPU and
#          --fused at 2 ranks), python -m jax_ar bench at 2 ranks, and
#          python -m jax_ar bench --op rms_norm at 2 and 4 ranks
#
# CUDA MPS is started before the first stage that runs ranks and stopped at
# exit. JAX's persistent compilation cache is shared by every rank launch
# (JAX_AR_GPU_CACHE=0 turns it off). Results go to $OUT (default
# ./gpu_results), five files (the device tool brings back at most 8):
# summary.txt (machine, date, commit, one line per step and per test file:
# PASS/FAIL/SKIP/TIME with seconds, benchmark figures), build.log, tests.log
# (every test file's output, in order of completion), bench.log, and
# results.tar.gz (the benchmarks' JSON files).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/gpu_results}"
STATE="${JAX_AR_GPU_STATE:-/tmp/jax_ar_gpu_run}"
mkdir -p "$OUT" "$STATE/done" "$STATE/logs" "$STATE/results"
RESULTS="$STATE/results"
SUMMARY="$OUT/summary.txt"
BUDGET_S="${JAX_AR_GPU_BUDGET_S:-560}"
START_S=$(date +%s)
PYTHON="${PYTHON:-python3}"
# 2 files at a time: on 2026-12-02, with 4, the three configurations of
# test_ops_all_reduce.py started together beside test_cuda_kernels.py (18
# rank processes on 16 cores) and all failed (likely cause, not proven:
# ranks finishing their compiles more than JAX_AR_TIMEOUT_S apart).
PARALLEL="${JAX_AR_GPU_PARALLEL:-2}"
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(all)
export PYTHONUNBUFFERED=1
if [ "${JAX_AR_GPU_CACHE:-1}" != 0 ]; then
  export JAX_COMPILATION_CACHE_DIR="$STATE/jax_cache"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
fi

left() { echo $(( BUDGET_S - ($(date +%s) - START_S) )); }
# Result lines of finished steps live in $STATE/done/<step> (so that a later
# command's summary shows them too); this command's notes go to $STATE/notes.
record() { echo "$2" > "$STATE/done/$1"; }
done_already() { [ -e "$STATE/done/$1" ]; }
note() { echo "NOTE  $*" >> "$STATE/notes"; echo "NOTE  $*"; }

# step NAME LOG CMD...: runs CMD with what is left of the budget (at most
# JAX_AR_STEP_MAX_S), appends its output to LOG and records PASS/FAIL/TIME.
step() {
  local name="$1" log="$2"; shift 2
  local key; key=$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_')
  if done_already "$key"; then return 0; fi
  local budget; budget=$(left)
  [ -n "${JAX_AR_STEP_MAX_S:-}" ] && [ "$budget" -gt "$JAX_AR_STEP_MAX_S" ] && budget=$JAX_AR_STEP_MAX_S
  if [ "$budget" -lt 30 ]; then note "not started: $name (budget spent; run again)"; return 1; fi
  echo "===== $name ($(date -u +%H:%M:%S), up to ${budget}s): $*" >> "$log"
  local t0 rc dt; t0=$(date +%s)
  timeout --kill-after=15 "$budget" "$@" >> "$log" 2>&1
  rc=$?; dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then record "$key" "PASS  $name (${dt}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "TIME  $name (killed after ${dt}s; run again)"
  else record "$key" "FAIL  $name (exit $rc, ${dt}s; see $(basename "$log"))"; fi
  return $rc
}

MPS_STARTED=0
start_mps() {
  [ $MPS_STARTED -eq 1 ] && return
  export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/jax_ar_mps}"
  export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/jax_ar_mps_log}"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! command -v nvidia-cuda-mps-control > /dev/null; then
    note "nvidia-cuda-mps-control not found: ranks sharing a GPU will fall back to psum"
  elif nvidia-cuda-mps-control -d; then
    MPS_STARTED=1
  else
    note "CUDA MPS did not start (already running?)"
  fi
}
stop_mps() {
  if [ $MPS_STARTED -eq 1 ]; then
    echo quit | timeout 20 nvidia-cuda-mps-control || note "MPS did not quit cleanly"
    MPS_STARTED=0
  fi
}

write_summary() {
  {
    # The device tool copies the working tree with a .git that may be older:
    # JAX_AR_COMMIT, else the prebuilt modules' record, names the commit.
    local commit="${JAX_AR_COMMIT:-}"
    [ -z "$commit" ] && [ -e jax_ar/PREBUILT ] && commit=$(sed -n 's/^commit \([0-9a-f]*\).*/\1/p' jax_ar/PREBUILT)
    [ -z "$commit" ] && commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
    echo "jax_ar GPU run: commit $commit, summary written $(date -u '+%Y-%m-%d %H:%M UTC')"
    [ -e jax_ar/PREBUILT ] && echo "prebuilt modules: $(cat jax_ar/PREBUILT)"
    echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -), $(nproc) CPUs"
    echo "python: $($PYTHON -c 'import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)' 2>/dev/null)"
    echo "commands so far: $(cat "$STATE/commands" 2>/dev/null | paste -sd ';' -)"
    cat "$STATE/done/"* 2>/dev/null | sort -k2
    [ -e "$STATE/notes" ] && cat "$STATE/notes"
    [ -e "$STATE/figures" ] && { echo "--- figures"; cat "$STATE/figures"; }
  } > "$SUMMARY"
}
finish() {
  stop_mps
  write_summary
  [ -n "$(ls -A "$RESULTS" 2>/dev/null)" ] && tar -czf "$OUT/results.tar.gz" -C "$RESULTS" .
}
trap finish EXIT
echo "$(date -u +%H:%M:%S) ${STAGES[*]} (budget ${BUDGET_S}s)" >> "$STATE/commands"
: > "$STATE/notes"

stage_build() {
  if [ "${JAX_AR_GPU_PREBUILT:-0}" = 1 ]; then
    # Modules compiled on the CPU machine (same nvcc, this Python's ABI:
    # scripts/build_for_gpu.sh) lie in jax_ar/ of the carried tree; the tree
    # is then imported from where it is.
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if (cd /tmp && "$PYTHON" -c "import jax_ar._jax_ar_cpu, jax_ar._jax_ar_cuda") \
        > "$OUT/build.log" 2>&1; then
      record build "PASS  build: prebuilt modules ($(cat jax_ar/PREBUILT 2>/dev/null || echo '?'))"
      return 0
    fi
    record build "FAIL  build: the prebuilt modules do not import (see build.log)"; exit 1
  fi
  if done_already build && (cd /tmp && "$PYTHON" -c "import jax_ar._jax_ar_cuda" 2> /dev/null); then
    return 0
  fi
  rm -f "$STATE/done/build"
  export CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}"
  step build "$OUT/build.log" "$PYTHON" -m pip install --no-build-isolation --no-deps -e . \
    || { note "build failed: stopping"; exit 1; }
  (cd /tmp && "$PYTHON" -c "import jax_ar._jax_ar_cuda") >> "$OUT/build.log" 2>&1 \
    || { record build "FAIL  build: the CUDA module does not import (see build.log)"; exit 1; }
}

# The launcher kills its ranks at its own deadline (they run in sessions of
# their own, so the step's timeout would leave them running): give it a
# little less than what is left.
launcher() { echo "$PYTHON" -m jax_ar launch --platform gpu --timeout $(( $(left) - 20 )) -n "$1"; }

stage_smoke() {
  start_mps
  export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}" JAX_AR_TEST_PLATFORM=gpu
  step "smoke: cuda_kernels sizes back_to_back, 2 ranks" "$OUT/tests.log" $(launcher 2) \
    tests/workers/cuda_kernels.py sizes back_to_back
  step "smoke: ops_all_reduce values specials, 8 ranks" "$OUT/tests.log" $(launcher 8) \
    tests/workers/ops_all_reduce.py values specials
}

# One pytest per file; its line: PASS (passed, none failed), SKIP (nothing
# passed, something skipped), FAIL, or TIME (killed: the next command runs it).
# An entry is a test file, or FILE@CONFIG: the tests of FILE whose id starts
# with [CONFIG- (one launch configuration of a worker file, JAX_AR_GPU_SPLIT).
run_test_file() {
  local entry="$1" file key log t0 rc dt counts verdict select=()
  file="${entry%@*}"
  key="test_$(basename "$file" .py)"
  if [ "$entry" != "$file" ]; then
    key="${key}_${entry#*@}"
    select=(-k "[${entry#*@}-")
  fi
  log="$STATE/logs/$key.log"
  t0=$(date +%s)
  # SIGINT at the budget, not SIGTERM: pytest then ends the test it is in
  # with a KeyboardInterrupt and prints where it was and what the ranks said
  # (2026-12-02: three files killed at the budget left nothing to read).
  timeout -s INT --kill-after=15 "$(( $(left) - 5 ))" "$PYTHON" -m pytest -q -rfEs \
    -p no:cacheprovider "$file" "${select[@]}" > "$log" 2>&1
  rc=$?; dt=$(( $(date +%s) - t0 ))
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ in [0-9.]*s.*//')
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "TIME  $entry (killed after ${dt}s; run again)"
  else
    if [ $rc -eq 0 ] && grep -q "passed" <<< "$counts"; then verdict=PASS
    elif [ $rc -eq 0 ] || [ $rc -eq 5 ]; then verdict=SKIP
    else verdict=FAIL; fi
    record "$key" "$verdict  $entry (${dt}s: ${counts:-no tests ran})"
  fi
  { echo "===== $entry ($(date -u +%H:%M:%S), ${dt}s, exit $rc)"; cat "$log"; } >> "$OUT/tests.log"
}

stage_tests() {
  start_mps
  # Deadlines long enough for ranks that finish compiling at different
  # times on 16 cores shared by two test files, short enough for the
  # skipped-call tests that wait for them.
  export JAX_AR_TEST_PLATFORM=gpu JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-30}"
  local files=()
  if [ -n "${JAX_AR_GPU_TESTS:-}" ]; then
    read -r -a files <<< "$JAX_AR_GPU_TESTS"
  else
    # The longest first, so that the pool ends together; then the rest.
    local first=(tests/test_cuda_kernels.py tests/test_comm_faults.py tests/test_ops_all_reduce.py
                 tests/test_comm_lifecycle.py tests/test_ops_all_reduce_rms_norm.py
                 tests/test_ops_fuzz.py tests/test_ops_scatter_gather.py tests/test_ops_load.py
                 tests/test_tools_bench.py)
    local f
    for f in "${first[@]}"; do [ -e "$f" ] && files+=("$f"); done
    for f in tests/test_*.py; do
      [[ " ${files[*]} " == *" $f "* ]] || files+=("$f")
    done
  fi
  # Files longer than one command's budget run one launch configuration at
  # a time (test_ops_all_reduce.py: 14 suites per launch, over 290 s alone
  # for its first configuration on the H200, 2026-12-01).
  local split=" ${JAX_AR_GPU_SPLIT:-tests/test_ops_all_reduce.py} " entries=() file config
  for file in "${files[@]}"; do
    if [[ "$split" == *" $file "* ]]; then
      for config in $("$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "$file" 2>/dev/null \
                      | sed -n 's/.*\[\(.*\)-[^-]*\]$/\1/p' | sort -u); do
        entries+=("$file@$config")
      done
    else
      entries+=("$file")
    fi
  done
  # Files that kill ranks on purpose run first and alone: under MPS a GPU
  # fault in one client (a kernel writing to a killed peer's memory) is
  # reported to the other clients that have work on the GPU at that moment.
  # Beside test_comm_faults.py, test_cuda_kernels.py's back_to_back rank 1
  # died of CUDA_ERROR_ILLEGAL_ADDRESS in the second that file's kill
  # scenarios ran (2026-12-02), and passed six times when run apart.
  # test_cuda_kernels.py runs alone as well: its one-shot of a whole 64 MiB
  # workspace at 8 ranks launches the whole block budget (layout.h: 128
  # blocks over the ranks, one an SM), and its ranks spin until every block
  # is resident; beside another file's spinning kernels each may wait for
  # SMs the other holds until a deadline passes. That call returned wrong
  # sums at 8 ranks while test_ops_all_reduce_rms_norm.py ran beside it
  # (2026-12-03, docs/latency_log.md "Latency, eleventh push").
  # test_ops_fuzz.py too: its 128 MiB one-shot at 2 ranks is 64 launches of
  # the whole block budget; beside another file it came back wrong on both
  # ranks, with the file 38 s (a 30 s deadline) longer than alone
  # (2026-12-07, docs/latency_log.md "forty-fourth push").
  local alone=" ${JAX_AR_GPU_ALONE:-tests/test_comm_faults.py tests/test_cuda_kernels.py tests/test_ops_fuzz.py} " entry key pass
  for pass in alone pool; do
    for entry in "${entries[@]}"; do
      if [[ "$alone" == *" ${entry%@*} "* ]]; then [ $pass = alone ] || continue
      else [ $pass = pool ] || continue; fi
      key="test_$(basename "${entry%@*}" .py)"
      [ "$entry" != "${entry%@*}" ] && key="${key}_${entry#*@}"
      done_already "$key" && continue
      # The budget is checked once a slot is free: a file that waited for
      # one may find it spent (and a negative timeout is no timeout).
      [ $pass = pool ] && while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do sleep 1; done
      if [ "$(left)" -lt 60 ]; then note "not started: $entry (budget spent; run again)"; continue; fi
      if [ $pass = alone ]; then run_test_file "$entry"; continue; fi
      run_test_file "$entry" &
    done
  done
  wait
}

figure() { echo "$*" >> "$STATE/figures"; }

stage_bench() {
  start_mps
  export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}"
  local n
  for n in 2 4 8; do
    if step "per-call cost, $n ranks" "$OUT/bench.log" $(launcher "$n") benchmarks/per_call_overhead.py \
        --bytes 1K,16K,64K,256K --calls 200 --repeats 7 --launches 10 --json "$RESULTS/per_call.jsonl"; then
      grep -h "per call:" "$OUT/bench.log" | sed 's/^\[rank 0\] //' | tail -12 | \
        while read -r line; do figure "$n ranks $line"; done
    fi
  done
  step "per-call breakdown, 2 and 8 ranks" "$OUT/bench.log" bash -c "
    $(launcher 2) benchmarks/per_call_overhead.py --bytes 16K --algorithms '' --stages all \
      --calls 200 --repeats 7 --launches 10 --json '$RESULTS/per_call.jsonl' &&
    $(launcher 8) benchmarks/per_call_overhead.py --bytes 16K --algorithms '' --stages all \
      --calls 200 --repeats 7 --launches 10 --json '$RESULTS/per_call.jsonl'" \
    && grep -h "per call: *stage" "$OUT/bench.log" | sed 's/^\[rank 0\] //' | tail -14 | \
      while read -r line; do figure "breakdown $line"; done
  local dir; dir="$(mktemp -d)"
  step "python -m jax_ar bench --op rms_norm, 2 ranks, hidden 4096" "$OUT/bench.log" \
    "$PYTHON" -m jax_ar bench -N 2 --timeout $(( $(left) - 20 )) --platform gpu --op rms_norm \
    -d bfloat16 --hidden 4096 -b 8K -e 16M --out-dir "$dir/norm2" \
    && cp "$dir/norm2/bench.json" "$RESULTS/jax_ar_bench_rms_norm_2ranks_h4096.json"
  step "python -m jax_ar bench, 2 ranks" "$OUT/bench.log" "$PYTHON" -m jax_ar bench -N 2 \
    --timeout $(( $(left) - 20 )) --platform gpu -d bfloat16 -e "${JAX_AR_BENCH_MAX_BYTES:-16M}" \
    --out-dir "$dir/ar" && cp "$dir/ar/bench.json" "$RESULTS/jax_ar_bench_2ranks.json"
  step "python -m jax_ar bench --op rms_norm, 4 ranks, hidden 4096" "$OUT/bench.log" \
    "$PYTHON" -m jax_ar bench -N 4 --timeout $(( $(left) - 20 )) --platform gpu --op rms_norm \
    -d bfloat16 --hidden 4096 -b 8K -e 16M --out-dir "$dir/norm4" \
    && cp "$dir/norm4/bench.json" "$RESULTS/jax_ar_bench_rms_norm_4ranks_h4096.json"
  step "benchmarks/rms_norm_bench.py" "$OUT/bench.log" "$PYTHON" benchmarks/rms_norm_bench.py \
    --tokens 1 128 2048 8192 32768 --json "$RESULTS/rms_norm_bench.json"
  step "python -m jax_ar bench --op rms_norm, 2 ranks, hidden 8192" "$OUT/bench.log" \
    "$PYTHON" -m jax_ar bench -N 2 --timeout $(( $(left) - 20 )) --platform gpu --op rms_norm \
    -d bfloat16 --hidden 8192 -b 16K -e 32M --out-dir "$dir/norm2h" \
    && cp "$dir/norm2h/bench.json" "$RESULTS/jax_ar_bench_rms_norm_2ranks_h8192.json"
  grep -hE "^ +[0-9]+ .*(\*|x)" "$OUT/bench.log" | tail -80 | while read -r line; do figure "bench $line"; done
}

for stage in "${STAGES[@]}"; do
  case "$stage" in
    all) stage_build; stage_tests; stage_bench ;;
    build|smoke|tests|bench) "stage_$stage" ;;
    *) note "unknown stage $stage (stages: all build smoke tests bench)" ;;
  esac
done
