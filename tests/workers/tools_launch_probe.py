"""Launcher probe: behaves as told by argv[1] on the rank given in argv[2]
(-1: none); every rank first prints "rank R of N with D devices" and its pid.

ok       every rank ends at once
fail     the target exits 3; the others end at once
hang     the target sleeps; the others end at once
loop     every rank prints "looping" and sleeps (until stopped)
deaf     every rank ignores SIGTERM, SIGHUP and SIGINT, prints "looping" and
         sleeps (until killed)
chatty   every rank prints 20000 lines (1.2 MB, more than a pipe holds), then
         "done chatting"
loop_calls  every rank sets up jax_ar, prints "looping" and runs all_reduces
         (until stopped)
fail_others_loop  the target exits 3; the others sleep (until stopped)
die_in_call  every rank sets up jax_ar; the target SIGKILLs itself while the
         others wait for it in an all_reduce (which then fails)
noise    every rank prints lines the launcher drops (gloo's connections, whole
         and as two threads splice them, what gRPC and absl print at a peer's
         exit) around lines of its own
"""
import os
import signal
import sys
import time

import jax

mode, target = sys.argv[1], int(sys.argv[2])
me = jax.process_index()
print(f"rank {me} of {jax.process_count()} with {jax.local_device_count()} devices, "
      f"pid {os.getpid()}", flush=True)
if mode == "deaf":
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
if mode == "chatty":
    for i in range(20000):
        print(f"line {i} " + "x" * 50)
    print("done chatting", flush=True)
if mode in ("loop", "deaf") or (mode == "fail_others_loop" and me != target):
    print("looping", flush=True)
    while True:
        time.sleep(0.1)
if mode == "noise":
    print(f"[Gloo] Rank {me} is connected to 1 peer ranks. Expected number of connected peer "
          "ranks is : 1", flush=True)
    print("my own line", flush=True)
    # Two threads' reports spliced (as seen with 2 CPU devices per process):
    # at a piece, and just before the number, which then comes alone.
    print("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer "
          "ranks is : [Gloo] Rank 1 is connected to 11\n"
          " peer ranks. Expected number of connected peer ranks is : 1\n"
          "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer "
          "ranks is : [Gloo] Rank 1 is connected to 1 peer ranks. Expected number of "
          "connected peer ranks is : 1\n"
          "1", flush=True)
    print(7, flush=True)  # a number of its own, where no report is unfinished
    print("E1201 10:00:00.000000 1 coordination_service_agent.cc:1] WatchTasksAsync failed: "
          "UNAVAILABLE: Connection refused", flush=True)
    print("*** Check failure stack trace: ***", flush=True)
    print("    @     0x7f0000000000  (unknown)", flush=True)
    # What gRPC writes at exit on the GPU (jax 0.11.2), one message in five lines.
    print("W1201 18:49:57.462320     690 pjrt_client.cc:1605] WatchTasksAsync failed for task "
          "1: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
          "ipv4:127.0.0.1:23451: Failed to connect to remote host: Connection refused\n"
          "Additional GRPC error information from remote target coordination_service while "
          "calling /xla.coordination.CoordinationService/WatchTasks:\n"
          ":UNAVAILABLE:failed to connect to all addresses; last error: UNKNOWN: "
          "ipv4:127.0.0.1:23451: Failed to connect to remote host: Connection refused\n"
          "=== Source Location Trace: === \n"
          "external/xla+/xla/tsl/distributed_runtime/rpc/grpc_util.h:89\n", flush=True)
    print("my last line", flush=True)
if me == target:
    if mode in ("fail", "fail_others_loop"):
        print("failing on purpose", flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
if mode in ("die_in_call", "loop_calls"):
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_ar

    mesh = jax.make_mesh((jax.device_count(),), ("tp",))
    jax_ar.setup(mesh, "tp")
    reduce = jax.jit(jax.shard_map(lambda x: jax_ar.all_reduce(x, "tp"), mesh=mesh,
                                   in_specs=P("tp"), out_specs=P()))
    x = jax.device_put(np.ones(4 * jax.device_count(), np.float32),
                       jax.sharding.NamedSharding(mesh, P("tp")))
    reduce.lower(x).compile()
    if mode == "loop_calls":
        jax.block_until_ready(reduce(x))
        print("looping", flush=True)
        while True:
            jax.block_until_ready(reduce(x))
    if me == target:
        time.sleep(1.0)  # the others are waiting in the call by now
        os.kill(os.getpid(), signal.SIGKILL)
    jax.block_until_ready(reduce(x))
