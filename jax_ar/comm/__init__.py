"""Communicators: device groups, workspaces, peer handles exchanged through
the jax.distributed key-value store, and the backends of CPU and GPU devices."""
