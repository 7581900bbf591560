"""jax_ar: fast all-reduce and fused all-reduce + RMSNorm for tensor-parallel
JAX on one NVLink node. See README.md and ../docs for the API and limits."""
import pkgutil as _pkgutil

# Run from a source checkout after `pip install .`, the checkout's jax_ar/
# (no compiled modules) shadows the installed one; extending __path__ lets
# the compiled modules be found in the installed copy.
__path__ = _pkgutil.extend_path(__path__, __name__)

from ._checked import checked  # noqa: E402
from ._collectives import all_gather, all_reduce, reduce_scatter  # noqa: E402
from ._linear import matmul_all_reduce  # noqa: E402
from ._norms import all_reduce_rms_norm, rms_norm  # noqa: E402
from ._setup import setup  # noqa: E402
from ._version import __version__  # noqa: E402,F401
from .comm.communicator import Communicator  # noqa: E402
from .errors import JaxArError, JaxArTimeoutError  # noqa: E402

__all__ = [
    "Communicator",
    "JaxArError",
    "JaxArTimeoutError",
    "all_gather",
    "all_reduce",
    "all_reduce_rms_norm",
    "checked",
    "matmul_all_reduce",
    "reduce_scatter",
    "rms_norm",
    "setup",
]


def __getattr__(name):
    # jax_ar.flax needs flax; importing it on first use keeps `import jax_ar`
    # free of that dependency.
    if name == "flax":
        import importlib

        return importlib.import_module(".flax", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
