"""The compiled modules and the one loop that registers their FFI targets.

`_jax_ar_cpu` (CPU devices) is always built; `_jax_ar_cuda` exists when the
package was built with a CUDA compiler. Each module's `registrations()`
returns {target name: handler capsule}.
"""
from __future__ import annotations

import functools
import importlib
import threading

import jax

import jax_ar._jax_ar_cpu as cpu  # the compiled CPU module (always built)

__all__ = ["ALGORITHM_CODES", "OP_CODES", "backend_module", "cpu", "limits", "targets"]

# The numbering the FFI attributes carry, as the compiled modules export it
# (cuda/common/protocol.h; both modules build it from the same header).
OP_CODES = dict(cpu.codes()["op"])
ALGORITHM_CODES = dict(cpu.codes()["algorithm"])

# XLA's platform names for the two kinds of device jax_ar serves.
_PLATFORMS = {"cpu": ("_jax_ar_cpu", "cpu"), "gpu": ("_jax_ar_cuda", "CUDA")}
_lock = threading.Lock()
_loaded: dict[str, object] = {}


def limits(platform: str = "cpu") -> dict:
    """The compiled module's limits (cuda/common/module_util.h CommonLimits,
    plus the CUDA module's own): the one source of these numbers. The CPU
    module answers for a platform whose module was not built."""
    try:
        module = backend_module(platform)
    except RuntimeError:
        module = cpu
    return dict(module.limits())


@functools.lru_cache(maxsize=None)
def targets(platform: str) -> frozenset:
    """The FFI targets of `platform`'s module, registered with XLA on first
    use. Raises RuntimeError when the module was not built."""
    return frozenset(backend_module(platform).registrations())


def backend_module(platform: str):
    """The compiled module serving `platform` ("cpu" or "gpu"), its FFI
    targets registered with XLA. Raises RuntimeError when it was not built."""
    with _lock:
        if platform in _loaded:
            return _loaded[platform]
        if platform not in _PLATFORMS:
            raise RuntimeError(f"jax_ar has no backend for {platform!r} devices")
        module_name, xla_platform = _PLATFORMS[platform]
        try:
            module = importlib.import_module(f"jax_ar.{module_name}")
        except ImportError as e:
            raise RuntimeError(
                f"jax_ar was built without its {platform.upper()} module ({module_name}): "
                "reinstall on a machine with nvcc on PATH (or CUDACXX set) to build it"
            ) from e
        for name, capsule in module.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform=xla_platform)
        _loaded[platform] = module
        return module
