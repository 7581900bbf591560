import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# The shipped cost table, not whatever `python -m jax_ar tune` left in this
# user's cache: results must not depend on the machine's history.
os.environ.setdefault("JAX_AR_TABLE", "default")
