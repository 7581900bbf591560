#!/usr/bin/env bash
# One device command for a session whose machine starts are scarce: the
# whole GPU suite on this tree (scripts/gpu_run.sh), then, in the time left
# of the command, this tree's kernels beside the LL floor probe
# (scripts/latency_ab.sh, into $OUT/standing.jsonl). Carry the three
# module files scripts/build_for_gpu.sh writes and ./probes (a copy of
# ../shared/probes). The suite took 499 s on an H100 on 2026-12-06
# (320-378 s on 2026-12-05's H100s) and the standing about 100 s,
# so the standing may not finish within one 600 s command: its fused part
# runs last, and a standing cut short still leaves its finished lines in
# $OUT.
#
#   bash scripts/gpu_session.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_results}"
# Under the device tool's 600 s with room for what runs after the limit:
# latency_ab.sh's exit stops the MPS daemon (up to 20 s). At 588 s the
# 2026-12-06 command was killed at 600 s, its $OUT intact but its log
# tail lost.
LIMIT_S="${JAX_AR_SESSION_LIMIT_S:-570}"
# The suite may take all but the time its summary needs (542 s under the
# default limit; the suite took 499 s on 2026-12-06).
SUITE_BUDGET_S=$((LIMIT_S - 28))
mkdir -p "$OUT"
start=$SECONDS
JAX_AR_GPU_PREBUILT=1 JAX_AR_GPU_BUDGET_S=$SUITE_BUDGET_S \
  JAX_AR_GPU_ALONE="tests/test_comm_faults.py tests/test_ops_all_reduce.py tests/test_cuda_kernels.py tests/test_ops_fuzz.py" \
  OUT="$OUT" bash scripts/gpu_run.sh build tests > "$OUT/suite_log.txt" 2>&1
echo "suite rc=$? after $((SECONDS - start)) s" >> "$OUT/suite_log.txt"
left=$((LIMIT_S - (SECONDS - start)))
echo "the standing gets $left s" >> "$OUT/suite_log.txt"
if [ "$left" -gt 30 ]; then
  all_reduce="--bytes 1K,16K,64K,256K --algorithms oneshot,twoshot --copy-bytes= --repeats 3"
  fused="--bytes 16K,64K,256K,512K,1M,2M --algorithms oneshot --norm-algorithms auto"
  fused="$fused --norm-hidden 4096,8192 --copy-bytes= --repeats 3"
  timeout "$left" bash scripts/latency_ab.sh "$OUT/standing.jsonl" "probe 1K,16K,64K,256K" \
    "tree main . $all_reduce" "tree main . $fused"
fi
tail -30 "$OUT/suite_log.txt"
