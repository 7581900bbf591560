"""Which algorithm serves an all-reduce: a cost model evaluated at trace time.

For each candidate, predicted time = latency + bytes * inverse bandwidth,
both taken from a per-(platform, world size) table; the cheapest wins. The
inputs are static shapes and the table only, so every rank decides the same.
"""
from __future__ import annotations

import dataclasses

from . import config

__all__ = ["Cost", "choose_algorithm", "predict_us"]

CANDIDATES = ("oneshot", "twoshot", "psum")


@dataclasses.dataclass(frozen=True)
class Cost:
    latency_us: float  # fixed cost of one call
    us_per_mb: float  # incremental cost per MiB of message

    def predict(self, nbytes: int) -> float:
        return self.latency_us + self.us_per_mb * nbytes / (1 << 20)


# Defaults until `python -m jax_ar tune` measures the machine. CPU figures are
# shared-memory copies; psum on CPU goes through gloo over TCP and is far
# slower, so it only serves where jax_ar cannot.
_DEFAULTS = {
    "cpu": {
        "oneshot": lambda n: Cost(20.0 + 5.0 * n, 150.0 * n),
        "twoshot": lambda n: Cost(40.0 + 10.0 * n, 300.0 + 40.0 * n),
        "psum": lambda n: Cost(500.0 + 100.0 * n, 2000.0),
    },
    # NVLink H100/H200: one-shot reads every peer's whole message (n-1 copies
    # over NVLink), two-shot moves 2(n-1)/n of it; NCCL's ring matches
    # two-shot's traffic with a higher fixed cost.
    "gpu": {
        "oneshot": lambda n: Cost(5.0, 2.5 * (n - 1)),
        "twoshot": lambda n: Cost(9.0, 2.5 * 2 * (n - 1) / n + 1.0),
        "psum": lambda n: Cost(18.0, 2.5 * 2 * (n - 1) / n),
    },
}


def predict_us(platform: str, world: int, algorithm: str, nbytes: int) -> float:
    table = _DEFAULTS.get(platform, _DEFAULTS["gpu"])
    return table[algorithm](world).predict(nbytes)


def choose_algorithm(platform: str, world: int, nbytes: int) -> str:
    """The candidate with the lowest predicted time (ties go to the earlier)."""
    predictions = {a: predict_us(platform, world, a, nbytes) for a in CANDIDATES}
    best = min(CANDIDATES, key=lambda a: predictions[a])
    size_class = max(0, nbytes - 1).bit_length()
    config.log_once(
        ("choice", platform, world, size_class, best),
        f"jax_ar: {nbytes} bytes over {world} {platform} ranks -> {best} (predicted "
        + ", ".join(f"{a} {t:.1f} us" for a, t in predictions.items()) + ")")
    return best
