"""jax_ar's version, written here only (pyproject.toml reads it from this file)."""
__version__ = "0.1.0"
