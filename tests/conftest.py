import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# The shipped cost table, not whatever `python -m jax_ar tune` left in this
# user's cache: results must not depend on the machine's history.
os.environ.setdefault("JAX_AR_TABLE", "default")

# On CPU most of the suite's time goes to XLA compiling the workers'
# programs, which then run once on small data: LLVM's optimizations buy
# nothing there, and without them a worker's run is about 30% shorter
# (ops_all_reduce_rms_norm.py at 2 ranks: 111 s -> 79 s). Results do not
# depend on it (IEEE semantics either way); rank processes inherit it.
if os.environ.get("JAX_AR_TEST_PLATFORM", "cpu") == "cpu" and \
        "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_backend_optimization_level=0").strip()
