"""The rendezvous of a setup: every process of a communicator meets the
others through the jax.distributed key-value store (all_gather of small
JSON records, barriers), with deadlines.

Keys live under a prefix unique to one setup of one communicator, so a
later setup never reads what an earlier one left behind.

A wait does not only run to its deadline: it polls, and stops early when a
peer has published that its setup failed (`<prefix>/failed/<process>`), or
when the process it waits for has exited (each process publishes its
identity under `jax_ar/process/<index>` once it joins; see
publish_process_identity).
"""
from __future__ import annotations

import json
import socket
import threading
import time

from .. import _compat, _native
from ..errors import JaxArError, JaxArTimeoutError

__all__ = ["Rendezvous", "machine_identity", "publish_process_identity"]

# Long enough to keep the coordination service idle, short next to any deadline.
_POLL_S = 0.25

_identity_lock = threading.Lock()
_identity_published = False


def _identity_key(process: int) -> str:
    return f"jax_ar/process/{process}"


def machine_identity() -> str:
    """Hostname and boot id of this machine (not JAX_AR_HOST_ID): pids only
    mean something there."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def publish_process_identity(client, process: int) -> None:
    """Lets peers tell this process's death from its slowness (once per process)."""
    global _identity_published
    with _identity_lock:
        if _identity_published or client is None:
            return
        pid, namespace, start = _native.cpu.process_identity()
        identity = {"host": machine_identity(), "pid": pid, "ns": namespace, "start": start}
        try:
            client.key_value_set(_identity_key(process), json.dumps(identity))
        except Exception:  # already published by an earlier session: nothing to add
            pass
        _identity_published = True


class Rendezvous:
    def __init__(self, prefix: str, process: int, processes: list[int], timeout_s: float,
                 describe_process):
        self._client = _compat.distributed_client()
        if self._client is None and len(processes) > 1:
            raise JaxArError(
                "jax_ar.setup: the mesh spans several processes but jax.distributed is not "
                "initialized; call jax.distributed.initialize() first (python -m jax_ar launch "
                "does this for you)")
        self._prefix = prefix
        self._process = process
        self._processes = processes
        self._timeout_s = timeout_s
        self._describe = describe_process
        self._keys: list[str] = []
        self._identities: dict[int, dict] = {}
        publish_process_identity(self._client, process)

    def all_gather(self, name: str, value) -> dict[int, object]:
        """Publishes `value` (JSON-able) and returns every process's value."""
        if self._client is None:
            return {self._process: value}
        key = f"{self._prefix}/{name}/{self._process}"
        self._client.key_value_set(key, json.dumps(value))
        deadline = time.monotonic() + self._timeout_s
        values = {self._process: value}
        for other in self._processes:
            if other != self._process:
                values[other] = json.loads(self._wait_for(f"{self._prefix}/{name}/{other}",
                                                          other, name, deadline))
        # Every process has published this step, so all have read the steps
        # before it: their keys can go. This step's key stays until the next.
        self._delete_written()
        self._keys.append(key)
        return values

    def barrier(self, name: str) -> None:
        self.all_gather(name, True)

    def publish_failure(self, message: str) -> None:
        """Tells the peers still waiting in this setup that this process
        failed, so they stop at once (best effort)."""
        if self._client is None:
            return
        try:
            self._client.key_value_set(f"{self._prefix}/failed/{self._process}", message[:2000])
        except Exception:
            pass

    def _wait_for(self, key: str, other: int, step: str, deadline: float) -> str:
        while True:
            remaining = deadline - time.monotonic()
            slice_ms = max(1, int(min(remaining, _POLL_S) * 1000))
            try:
                return self._client.blocking_key_value_get(key, slice_ms)
            except Exception as e:  # jax raises its runtime error on DEADLINE_EXCEEDED
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise JaxArError(f"jax_ar.setup: the key-value store failed at step "
                                     f"'{step}': {e}") from e
            self._stop_if_peer_gone(other, step)
            if time.monotonic() >= deadline:
                raise JaxArTimeoutError(
                    f"jax_ar.setup: {self._describe(self._process)} waited "
                    f"{self._timeout_s:.1f} s for {self._describe(other)} at step '{step}'; it "
                    "never got there (it may not have called jax_ar.setup with the same mesh "
                    "and axis, be stuck, or be slower than the deadline: JAX_AR_TIMEOUT_S or "
                    "timeout_s)") from None

    def _stop_if_peer_gone(self, other: int, step: str) -> None:
        try:
            failed = self._client.key_value_dir_get(f"{self._prefix}/failed/")
        except Exception:
            failed = []
        for failed_key, message in failed:
            process = failed_key.rsplit("/", 1)[-1]
            raise JaxArError(f"jax_ar.setup: {self._describe(self._process)} stopped at step "
                             f"'{step}' because process {process} failed: {message}")
        identity = self._identity(other)
        if identity is not None and identity.get("host") == machine_identity() and \
                _native.cpu.has_exited(identity["pid"], identity["ns"],
                                                            identity["start"]):
            raise JaxArError(
                f"jax_ar.setup: {self._describe(self._process)} stopped waiting at step "
                f"'{step}': the process of {self._describe(other)} (pid {identity['pid']}) "
                "has exited")

    def _identity(self, process: int) -> dict | None:
        if process not in self._identities:
            try:
                text = self._client.key_value_try_get(_identity_key(process))
            except Exception:  # not published (yet): nothing to judge by
                return None
            self._identities[process] = json.loads(text)
        return self._identities[process]

    def _delete_written(self) -> None:
        for key in self._keys:
            try:
                self._client.key_value_delete(key)
            except Exception:
                pass
        self._keys.clear()
