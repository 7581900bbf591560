"""Exchanges through the jax.distributed key-value store, all with deadlines.

Keys live under a prefix unique to one setup of one communicator, so a
later setup never reads what an earlier one left behind.
"""
from __future__ import annotations

import json
import time

from . import _compat
from .errors import JaxArError, JaxArTimeoutError

__all__ = ["KeyValueExchange"]


class KeyValueExchange:
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

    def all_gather(self, name: str, value) -> dict[int, object]:
        """Publishes `value` (JSON-able) and returns every process's value."""
        if self._client is None:
            return {self._process: value}
        key = f"{self._prefix}/{name}/{self._process}"
        self._client.key_value_set(key, json.dumps(value))
        deadline = time.monotonic() + self._timeout_s
        values = {self._process: value}
        for other in self._processes:
            if other == self._process:
                continue
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                text = self._client.blocking_key_value_get(f"{self._prefix}/{name}/{other}",
                                                           remaining_ms)
            except Exception as e:  # jax raises its runtime error on DEADLINE_EXCEEDED
                if "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e).lower():
                    raise JaxArTimeoutError(
                        f"jax_ar.setup: {self._describe(self._process)} waited "
                        f"{self._timeout_s:.1f} s for {self._describe(other)} at step "
                        f"'{name}'; it never got there (it may have crashed, not called "
                        "jax_ar.setup with the same mesh and axis, or be stuck)") from None
                raise JaxArError(f"jax_ar.setup: key-value exchange failed at step "
                                 f"'{name}': {e}") from e
            values[other] = json.loads(text)
        # Every process has published this step, so all have read the steps
        # before it: their keys can go. This step's key stays until the next.
        self._delete_written()
        self._keys.append(key)
        return values

    def barrier(self, name: str) -> None:
        self.all_gather(name, True)

    def _delete_written(self) -> None:
        for key in self._keys:
            try:
                self._client.key_value_delete(key)
            except Exception:
                pass
        self._keys.clear()
