"""jax_ar: fast all-reduce and fused all-reduce + RMSNorm for tensor-parallel
JAX on one NVLink node. See README.md and ../docs for the API and limits."""
from .all_reduce import all_reduce
from .communicator import Communicator, setup
from .errors import JaxArError, JaxArTimeoutError

__version__ = "0.1.0"

__all__ = [
    "Communicator",
    "JaxArError",
    "JaxArTimeoutError",
    "all_reduce",
    "setup",
]
