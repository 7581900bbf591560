"""Launcher probe: behaves as told by argv[1] on the rank given in argv[2]."""
import sys
import time

import jax

mode, target = sys.argv[1], int(sys.argv[2])
me = jax.process_index()
print(f"rank {me} of {jax.process_count()} with {jax.local_device_count()} devices", flush=True)
if me == target:
    if mode == "fail":
        print("failing on purpose", flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
