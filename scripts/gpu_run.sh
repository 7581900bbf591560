#!/usr/bin/env bash
# The whole GPU run of jax_ar in one command, on the device machine (one or
# more NVIDIA GPUs, no network), from the repository root:
#
#   bash scripts/gpu_run.sh [STAGE...]
#
# Stages run in the order given (default: build smoke tests bench):
#   build  pip install -e . (CUDA module for CMAKE_CUDA_ARCHITECTURES, default 90)
#   smoke  2 ranks, no pytest: the CUDA-only suites (JAX_AR_SMOKE_SUITES), then
#          all_reduce values/specials/pytree (JAX_AR_SMOKE_VALUES, empty skips);
#          the fastest signal that the kernels work
#   tests  pytest with JAX_AR_TEST_PLATFORM=gpu, ranks sharing the GPU
#          (2, 4, 8): tests/test_gpu.py, tests/test_all_reduce.py and, when
#          present, the norm tests (JAX_AR_GPU_TESTS overrides the list,
#          JAX_AR_GPU_TESTS_K passes -k)
#   norm   benchmarks/rms_norm_bench.py (one GPU; JAX_AR_SKIP_NORM_BENCH skips
#          it) and its --fused part (2 ranks)
#   bench  per-call overhead (2 ranks; command buffers JAX_AR_PER_CALL_MODES,
#          default "on off"; JAX_AR_PER_CALL_CALLS calls per program), then
#          the norm stage and python -m jax_ar bench
#
# CUDA MPS is started before the first stage that runs ranks and stopped at
# exit (several processes on one GPU only run kernels concurrently under MPS).
# Results go to $OUT (default ./gpu_results): summary.txt (machine, date,
# PASS/FAIL/TIME/SKIP per step with seconds, benchmark figures), build.log,
# tests.log (smoke and tests), bench.log (norm and bench; the per-call
# benchmark's JSON lines start with PER_CALL_RESULT), and the benchmarks'
# JSON and plot: at most 8 files, what the device tool brings back. JAX_AR_GPU_BUDGET_S
# (default 570, for a device tool that allows 600 s per command) bounds the
# whole run: each step gets what is left of it (at most JAX_AR_STEP_MAX_S),
# so a run cut short still leaves its summary. Everything takes longer than one such command (build
# about 50 s; each multi-rank test launch 1-3 min): run the stages, or test
# subsets (JAX_AR_GPU_TESTS), in several commands, e.g.
#   bash scripts/gpu_run.sh build smoke bench
#   JAX_AR_GPU_TESTS="tests/test_all_reduce.py" bash scripts/gpu_run.sh build tests
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/gpu_results}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
BUDGET_S="${JAX_AR_GPU_BUDGET_S:-570}"
START_S=$(date +%s)
PYTHON="${PYTHON:-python3}"
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(build smoke tests bench)
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET_S - ($(date +%s) - START_S) )); }
# What one step may take: what is left, at most JAX_AR_STEP_MAX_S (so that
# one hang cannot eat the run).
step_budget() {
  local budget; budget=$(left)
  if [ -n "${JAX_AR_STEP_MAX_S:-}" ] && [ "$budget" -gt "$JAX_AR_STEP_MAX_S" ]; then
    budget=$JAX_AR_STEP_MAX_S
  fi
  echo "$budget"
}

# step NAME LOG CMD...: runs CMD with what is left of the budget, appends
# its output to LOG and a PASS/FAIL/SKIP line to the summary.
step() {
  local name="$1" log="$2"; shift 2
  local budget; budget=$(step_budget)
  if [ "$budget" -lt 30 ]; then say "SKIP  $name (budget spent)"; return 1; fi
  echo "===== $name ($(date -u +%H:%M:%S), up to ${budget}s): $*" >> "$log"
  local t0=$(date +%s) rc
  timeout --kill-after=15 "$budget" "$@" >> "$log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then say "PASS  $name (${dt}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then say "TIME  $name (killed after ${dt}s)"
  else say "FAIL  $name (exit $rc, ${dt}s; see $(basename "$log"))"; fi
  return $rc
}

: > "$SUMMARY"
say "jax_ar GPU run: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), stages: ${STAGES[*]}"
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -), $(nproc) CPUs"
say "python: $($PYTHON -c 'import sys, jax; print(sys.version.split()[0], "jax", jax.__version__)' 2>/dev/null)"

MPS_STARTED=0
MPS_TRIED=0
start_mps() {
  [ $MPS_TRIED -eq 1 ] && return
  MPS_TRIED=1
  export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/jax_ar_mps}"
  export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/jax_ar_mps_log}"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if ! command -v nvidia-cuda-mps-control > /dev/null; then
    say "NOTE  nvidia-cuda-mps-control not found: ranks sharing a GPU will fall back to psum"
  elif nvidia-cuda-mps-control -d; then
    MPS_STARTED=1
    say "NOTE  CUDA MPS started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
  else
    say "NOTE  CUDA MPS did not start (already running?)"
  fi
}
stop_mps() {
  if [ $MPS_STARTED -eq 1 ]; then
    echo quit | timeout 20 nvidia-cuda-mps-control || say "NOTE  MPS did not quit cleanly"
    MPS_STARTED=0
  fi
}
trap stop_mps EXIT

stage_build() {
  export CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}"
  step build "$OUT/build.log" "$PYTHON" -m pip install --no-build-isolation --no-deps -e . \
    || { say "build failed: stopping"; exit 1; }
  "$PYTHON" -c "import jax_ar._jax_ar_cuda" >> "$OUT/build.log" 2>&1 \
    || say "FAIL  the CUDA module does not import (see build.log)"
}

# The launcher kills its ranks at its own deadline (they run in sessions of
# their own, so the step's timeout would leave them running): give it a
# little less than the step gets.
launcher() { echo "$PYTHON" -m jax_ar launch --platform gpu --timeout $(( $(step_budget) - 20 )) -n "$1"; }

stage_smoke() {
  start_mps
  export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}" JAX_AR_TEST_PLATFORM=gpu
  local suites="${JAX_AR_SMOKE_SUITES-fused sizes back_to_back replay_after_close timeout}"
  local values="${JAX_AR_SMOKE_VALUES-values specials pytree}"
  if [ -n "$suites" ]; then
    step "smoke: gpu_worker $suites, 2 ranks" "$OUT/tests.log" $(launcher 2) \
      tests/workers/gpu_worker.py $suites
  fi
  if [ -n "$values" ]; then
    step "smoke: all_reduce_worker $values, 2 ranks" "$OUT/tests.log" $(launcher 2) \
      tests/workers/all_reduce_worker.py $values
  fi
  # The other operations' workers, all their suites, 2 ranks (JAX_AR_SMOKE_OTHERS="" skips).
  local worker
  for worker in ${JAX_AR_SMOKE_OTHERS-norm_all_reduce_rms_norm_worker axes_scatter_gather_worker}; do
    [ -e "tests/workers/$worker.py" ] || continue
    step "smoke: $worker, 2 ranks" "$OUT/tests.log" $(launcher 2) "tests/workers/$worker.py"
  done
}

stage_tests() {
  start_mps
  local files k_args=()
  if [ -n "${JAX_AR_GPU_TESTS:-}" ]; then
    read -r -a files <<< "$JAX_AR_GPU_TESTS"
  else
    # The widest configurations first (smoke covers 2 ranks). pytest keeps
    # the order of node ids, but not when their whole file is listed too.
    files=("tests/test_gpu.py::test_cuda_kernels[8]" "tests/test_all_reduce.py::test_all_reduce[8-1]"
           "tests/test_gpu.py::test_skipped_call_fails_with_named_peer[4]"
           "tests/test_gpu.py::test_cuda_kernels[4]" "tests/test_all_reduce.py::test_all_reduce[4-1]"
           "tests/test_gpu.py::test_command_buffers_off"
           "tests/test_gpu.py::test_cuda_kernels[2]" "tests/test_all_reduce.py::test_all_reduce[2-1]"
           "tests/test_gpu.py::test_skipped_call_fails_with_named_peer[2]")
    for f in tests/test_*rms_norm*.py tests/test_flax*.py tests/test_tp_transformer_block.py; do
      [ -e "$f" ] && files+=("$f")
    done
  fi
  [ -n "${JAX_AR_GPU_TESTS_K:-}" ] && k_args=(-k "$JAX_AR_GPU_TESTS_K")
  export JAX_AR_TEST_PLATFORM=gpu
  step "pytest ${files[*]}" "$OUT/tests.log" \
    "$PYTHON" -m pytest -q -rA --durations=0 -p no:cacheprovider "${k_args[@]}" "${files[@]}"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/tests.log" | tail -40 >> "$SUMMARY"
}

stage_norm() {
  start_mps
  export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}"
  [ -n "${JAX_AR_SKIP_NORM_BENCH:-}" ] || \
    step "benchmarks/rms_norm_bench.py" "$OUT/bench.log" "$PYTHON" benchmarks/rms_norm_bench.py \
      --json "$OUT/rms_norm_bench.json"
  step "benchmarks/rms_norm_bench.py --fused, 2 ranks" "$OUT/bench.log" $(launcher 2) \
    benchmarks/rms_norm_bench.py --fused --json "$OUT/rms_norm_bench_fused.json"
  grep -hE "^ +[0-9]+ +[0-9]+ |^# (target|kernel|copy|rms_norm|all_reduce_rms_norm)|^\[rank 0\] +[0-9]+ +[0-9]+ " \
    "$OUT/bench.log" | tail -50 >> "$SUMMARY"
}

stage_bench() {
  start_mps
  export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-60}"
  local mode calls="${JAX_AR_PER_CALL_CALLS:-500}"
  for mode in ${JAX_AR_PER_CALL_MODES-on off}; do
    (
      [ "$mode" = off ] && export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="
      step "per-call overhead, command buffers $mode" "$OUT/bench.log" $(launcher 2) \
        benchmarks/per_call_overhead.py --calls "$calls"
    )
  done
  grep -h "per call:" "$OUT/bench.log" 2>/dev/null | sed 's/^\[rank 0\] /      /' >> "$SUMMARY"
  stage_norm
  if [ -e jax_ar/tools/bench.py ]; then
    local dir; dir="$(mktemp -d)"
    step "python -m jax_ar bench (2 ranks)" "$OUT/bench.log" "$PYTHON" -m jax_ar bench -N 2 \
      --timeout $(( $(step_budget) - 20 )) --platform gpu -e "${JAX_AR_BENCH_MAX_BYTES:-64M}" --out-dir "$dir" ${JAX_AR_BENCH_ARGS:-}
    [ -e "$dir/bench.json" ] && cp "$dir/bench.json" "$OUT/jax_ar_bench.json"
    [ -e "$dir/bench.png" ] && cp "$dir/bench.png" "$OUT/jax_ar_bench.png"
    grep -hE "^ +[0-9]+ " "$OUT/bench.log" | tail -60 >> "$SUMMARY"
  fi
}

for stage in "${STAGES[@]}"; do
  case "$stage" in
    build|smoke|tests|norm|bench) "stage_$stage" ;;
    *) say "unknown stage $stage (stages: build smoke tests norm bench)" ;;
  esac
done

stop_mps
say "done after $(( $(date +%s) - START_S ))s"
