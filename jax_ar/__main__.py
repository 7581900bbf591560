"""python -m jax_ar {bench,tune,launch} ...: see jax_ar/tools/cli.py."""
import sys

from jax_ar.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
