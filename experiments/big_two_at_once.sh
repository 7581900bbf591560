#!/usr/bin/env bash
# Device diagnostic: two 2-rank jobs of experiments/big_all_reduce.py at
# once on the one GPU, under one MPS daemon, as two test files of the suite
# run beside each other (scripts/gpu_run.sh PARALLEL=2). A 128 MiB one-shot
# at 2 ranks launches 64 blocks a rank (the whole block budget, layout.h
# kMaxBlocksAllRanks, one block an SM), and each rank's blocks spin until
# its peer's are resident: with another job's spinning kernels on the SMs,
# each job may wait for SMs the other holds until a deadline passes. That is
# this script's question for the fuzz file's failure of 2026-12-07 (a 30 s
# deadline would explain the file's 63 s against 25, and the wrong values
# it saw: docs/latency_log.md "forty-fourth push").
#
#   bash experiments/big_two_at_once.sh LOG [MIB] [CALLS]
#
# Each job gets JAX_AR_TIMEOUT_S (default 10 s here) and writes its ranks'
# lines, prefixed "job A" or "job B", to LOG.
set -u
cd "$(dirname "$0")/.."
log="$(realpath "$1")"; mib="${2:-128}"; calls="${3:-2}"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 JAX_AR_TEST_PLATFORM=gpu
export JAX_AR_TIMEOUT_S="${JAX_AR_TIMEOUT_S:-10}"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/jax_ar_two_mps CUDA_MPS_LOG_DIRECTORY=/tmp/jax_ar_two_mps_log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || echo "MPS did not start (already running?)" >> "$log"
trap 'echo quit | timeout 20 nvidia-cuda-mps-control' EXIT
job() {
  timeout 200 python3 -m jax_ar launch --platform gpu -n 2 experiments/big_all_reduce.py \
    "$mib" "$calls" oneshot 2>&1 | sed "s/^/job $1: /" >> "$log"
}
echo "two jobs at once ($(date -u +%H:%M:%S)), ${mib} MiB, $calls calls, deadline ${JAX_AR_TIMEOUT_S} s" >> "$log"
job A & job B & wait
echo "both ended ($(date -u +%H:%M:%S))" >> "$log"
