"""GPU-only checks of the CUDA backend, with ranks sharing the device
machine's GPU under CUDA MPS (scripts/gpu_run.sh sets JAX_AR_TEST_PLATFORM=gpu
and starts MPS). tests/test_all_reduce.py covers values, special values,
pytrees, gradients and bad input on GPUs too; this file adds what only the
CUDA kernels have: sizes around and above one launch's capacity, 1,000
back-to-back calls through CUDA-graph replays, XLA command buffers off, the
fused all_reduce_rms_norm kernel, replays after close(), and the deadline
path when a rank skips a call.
"""
import os

import pytest

from harness import check_suite, run_ranks, runs_on

pytestmark = runs_on("gpu", reason="these are checks of the CUDA kernels alone")


COMMAND_BUFFERS_OFF = {
    "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip(),
}


KERNEL_SUITES = ("sizes", "back_to_back", "fused", "replay_after_close")


@pytest.mark.parametrize("suite", KERNEL_SUITES)
@pytest.mark.parametrize("processes", [2, 4, 8])
def test_cuda_kernels(processes, suite):
    check_suite("cuda_kernels.py", suite, *KERNEL_SUITES, processes=processes, timeout_s=900)


@pytest.mark.parametrize("suite", ["values", "specials", "repeat"])
def test_command_buffers_off_all_reduce(suite):
    check_suite("ops_all_reduce.py", suite, "values", "specials", "repeat", processes=2,
                env=COMMAND_BUFFERS_OFF, timeout_s=900)


@pytest.mark.parametrize("suite", ["back_to_back", "fused"])
def test_command_buffers_off_kernels(suite):
    check_suite("cuda_kernels.py", suite, "back_to_back", "fused", processes=4,
                env=COMMAND_BUFFERS_OFF, timeout_s=900)


@pytest.mark.parametrize("processes", [2, 4])
def test_skipped_call_fails_with_named_peer(processes):
    run_ranks("cuda_kernels.py", "timeout", processes=processes, timeout_s=300)
