"""What a process holds that jax_ar could leak: shared-memory names, file
descriptors, mappings of jax_ar segments, registered ranks, GPU memory."""
from __future__ import annotations

import ctypes
import os


def shm_names_of(pid: int) -> list[str]:
    """jax_ar names in /dev/shm that process `pid` created."""
    if not os.path.isdir("/dev/shm"):
        return []
    return [n for n in os.listdir("/dev/shm") if n.startswith("jax_ar_") and f"_{pid}_" in n]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def jax_ar_mappings() -> int:
    """Mappings of jax_ar shared-memory segments in this process."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/jax_ar_" in line)


def all_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def live_ranks() -> int | None:
    """Rank states registered with the compiled module serving this
    process's devices, or None if that module cannot tell."""
    import jax
    from jax_ar import _native

    platform = "cpu" if jax.devices()[0].platform == "cpu" else "gpu"
    try:
        module = _native.backend_module(platform)
    except RuntimeError:
        return None
    count = getattr(module, "live_ranks", None)
    return count() if count else None


def gpu_free_bytes() -> int | None:
    """Free memory of the current GPU (cudaMemGetInfo), or None off GPUs."""
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            cudart = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        try:
            import cupy

            return int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:
            return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        return None
    return free.value
