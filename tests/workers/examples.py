"""One rank of the examples' tests. Usage: examples.py [SUITE...]

Suites: gemma_block (examples/gemma_block.py: the Gemma-style block with
jax_ar inside shard_map and in plain jit, each against its twin without
jax_ar, and the two jax_ar ways against each other).
"""
import pathlib
import sys

import jax

import jax_ar
from common import log, main_guard, run_suites, suites_in

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def suite_gemma_block():
    sys.path.insert(0, str(EXAMPLES))
    import gemma_block

    mesh = gemma_block.make_mesh()
    comm = jax_ar.setup(mesh, gemma_block.AXIS)
    # Ranks sharing a GPU cannot run XLA's collectives (NCCL): the twins
    # are then computed unsharded. Full float32 matmuls: XLA:GPU's default
    # precision is TF32, whose rounding differs between the sharded
    # products and the unsharded twin's (2e-4 relative seen on an H200).
    with jax.default_matmul_precision("highest"):
        results = gemma_block.compare(mesh, sharded_twins=comm.psum_unavailable is None)
    collectives = gemma_block.jit_collectives(mesh)
    comm.close()
    # In plain jit the row-parallel layers are reduced by jax_ar, not XLA.
    assert collectives == (2, 0), collectives
    for name, (difference, magnitude) in results.items():
        log(f"gemma_block {name}: max |difference| {difference:.3g} (values up to "
            f"{magnitude:.3g})")
        # float32 throughout: the row-parallel sums are the same (two ranks
        # add in either order alike); jax_ar's norms take the inverse RMS in
        # double, jnp's rsqrt in float32, a few ulps apart, carried through
        # the block (~1e-6 relative).
        assert difference <= 1e-5 * magnitude, (name, difference, magnitude)


SUITES = suites_in(globals())


def main(argv):
    log(f"{jax.device_count()} devices, {jax.process_count()} processes")
    run_suites(SUITES, argv or list(SUITES))


if __name__ == "__main__":
    main_guard(main)
