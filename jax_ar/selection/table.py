"""The algorithm table: cost curves per kernel, its JSON file, and where it lives.

A table serves one (platform, device kind, world size). Each all-reduce
kernel of the platform (kernel_curves: oneshot, twoshot, psum, and on CUDA
twoshot_ll) has a cost curve for one protocol round; each path of
all_reduce_rms_norm (NORM_PATHS: the fused kernel with either protocol, and
"composed", jax_ar.all_reduce then jax_ar.rms_norm) a curve for a whole call
of that many bytes of x. A curve is piecewise-linear segments, each valid up
to some message size, predicting latency_us + us_per_mb * bytes / 1e6.
`python -m jax_ar tune` measures and writes one; cost_model.py reads it.

Schema 3 has every curve; older files still load, the curves they lack
taking the shipped defaults (cost_model.table_for): schema 2 has no
twoshot_ll (the CUDA handler chose it by size then), schema 1 no norm paths
either.

Lookup order for a communicator: the file named by JAX_AR_TABLE (or the
shipped defaults when JAX_AR_TABLE=default), else the tuned file in the cache
directory ($XDG_CACHE_HOME/jax_ar or ~/.cache/jax_ar) named after the key,
else the shipped defaults. A file that is malformed or describes another
key (device kind, world size, jax_ar version, schema) raises TableError
naming the file; it is never used.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

__all__ = [
    "ALGORITHMS",
    "CURVES",
    "CostCurve",
    "NORM_PATHS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Segment",
    "Table",
    "TableError",
    "cache_dir",
    "kernel_curves",
    "load_table",
    "table_path",
    "table_to_json",
]

SCHEMA = "jax_ar.algorithm_table"
SCHEMA_VERSION = 3
ALGORITHMS = ("oneshot", "twoshot", "psum")
NORM_PATHS = ("fused_oneshot", "fused_twoshot", "composed")
CURVES = ALGORITHMS + NORM_PATHS
TABLE_ENV = "JAX_AR_TABLE"


def kernel_curves(platform: str) -> tuple:
    """The all-reduce kernels of `platform` with a curve, in the order the
    cost model breaks ties: CUDA has the two-shot over LL packets too."""
    return ("oneshot", "twoshot_ll", "twoshot", "psum") if platform == "gpu" else ALGORITHMS


def _schema_curves(version: int, platform: str) -> tuple:
    """The curves a file of schema `version` holds (older versions still load)."""
    return {1: ALGORITHMS, 2: CURVES}.get(version, kernel_curves(platform) + NORM_PATHS)


class TableError(ValueError):
    """An algorithm table file that cannot be used (says which and why)."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """Cost of one round of up to `up_to_bytes` bytes (None: no upper end):
    latency_us + us_per_mb * bytes / 1e6. latency_us is the segment's
    intercept; within its range the prediction is what counts."""
    up_to_bytes: int | None
    latency_us: float
    us_per_mb: float

    def predict(self, nbytes: int) -> float:
        return self.latency_us + self.us_per_mb * nbytes / 1e6


@dataclasses.dataclass(frozen=True)
class CostCurve:
    """Predicted time of one protocol round as a function of its size."""
    segments: tuple[Segment, ...]

    def predict(self, nbytes: int) -> float:
        for segment in self.segments:
            if segment.up_to_bytes is None or nbytes <= segment.up_to_bytes:
                return segment.predict(nbytes)
        return self.segments[-1].predict(nbytes)

    @classmethod
    def linear(cls, latency_us: float, us_per_mb: float) -> "CostCurve":
        return cls((Segment(None, float(latency_us), float(us_per_mb)),))

    @classmethod
    def through(cls, points, extra_us: float = 0.0) -> "CostCurve":
        """The curve through measured (bytes, us) points (sizes increasing,
        times non-decreasing), plus `extra_us` everywhere: flat below the
        first point, straight between points, the last line extended."""
        (b0, t0), segments = points[0], []
        segments.append(Segment(int(b0), float(t0) + extra_us, 0.0))
        for j, ((b1, t1), (b2, t2)) in enumerate(zip(points, points[1:])):
            slope = (t2 - t1) / (b2 - b1)  # us per byte
            last = j == len(points) - 2
            segments.append(Segment(None if last else int(b2), t1 - slope * b1 + extra_us,
                                    slope * 1e6))
        return cls(tuple(segments))


@dataclasses.dataclass(frozen=True)
class Table:
    platform: str
    device_kind: str
    world_size: int
    curves: dict  # algorithm or norm path -> CostCurve
    source: str  # "defaults (...)" or the file it came from

    def round_us(self, algorithm: str, nbytes: int) -> float:
        return self.curves[algorithm].predict(nbytes)

    def call_us(self, path: str, nbytes: int) -> float:
        """Predicted time of an all_reduce_rms_norm call of `nbytes` of x
        taking `path` (one of NORM_PATHS)."""
        return self.curves[path].predict(nbytes)

    def completed_by(self, defaults: "Table") -> "Table":
        """This table with the curves it lacks (an older schema's file)
        taken from `defaults`, and its source saying so."""
        missing = [name for name in _schema_curves(SCHEMA_VERSION, self.platform)
                   if name not in self.curves]
        if not missing:
            return self
        curves = dict(self.curves, **{name: defaults.curves[name] for name in missing})
        return dataclasses.replace(self, curves=curves,
                                   source=f"{self.source} ({', '.join(missing)}: {defaults.source})")


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jax_ar")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def table_path(platform: str, device_kind: str, world_size: int) -> str:
    """Where `tune` writes, and lookups find, the table of this key."""
    return os.path.join(cache_dir(),
                        f"table-{_slug(platform)}-{_slug(device_kind)}-n{int(world_size)}.json")


def table_to_json(table: Table, version: str, extra: dict | None = None) -> dict:
    """The file form of `table`; `extra` (machine, date, measurements) is
    kept for people and ignored when loading."""
    doc = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "jax_ar_version": version,
        "platform": table.platform,
        "device_kind": table.device_kind,
        "world_size": table.world_size,
        # The figures as they are: rounded, a fitted line through a knot at
        # 0 us could predict a negative time there and fail load_table.
        "algorithms": {
            name: [{"up_to_bytes": s.up_to_bytes, "latency_us": s.latency_us,
                    "us_per_mb": s.us_per_mb} for s in curve.segments]
            for name, curve in table.curves.items()
        },
    }
    doc.update(extra or {})
    return doc


def load_table(path: str, platform: str, device_kind: str, world_size: int,
               version: str) -> Table:
    """Reads and checks the table at `path` for the given key."""
    def reject(why):
        raise TableError(f"jax_ar: algorithm table {path} {why}; run `python -m jax_ar tune` "
                         f"to measure this machine, or unset {TABLE_ENV} / delete the file to "
                         "use the defaults")

    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        reject("does not exist")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        reject(f"cannot be read as JSON ({e})")
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        reject("cannot be read as JSON (it holds an integer of too many digits)")
    except RecursionError:
        reject("cannot be read as JSON (its arrays or objects nest too deeply)")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        reject(f"is not a jax_ar algorithm table (schema {_shown(_get(doc, 'schema'))}, "
               f"expected {SCHEMA!r})")
    schema_version = doc.get("schema_version")
    if isinstance(schema_version, bool) or not isinstance(schema_version, int) or \
            not 1 <= schema_version <= SCHEMA_VERSION:
        reject(f"has schema_version={_shown(schema_version)}; this jax_ar reads "
               f"{list(range(1, SCHEMA_VERSION + 1))}")
    expected = {"jax_ar_version": version, "platform": platform, "device_kind": device_kind,
                "world_size": world_size}
    for field, want in expected.items():
        if doc.get(field) != want:
            reject(f"was made for {field}={_shown(doc.get(field))}, but this run has "
                   f"{field}={want!r}")
    names = _schema_curves(schema_version, platform)
    algorithms = doc.get("algorithms")
    if not isinstance(algorithms, dict) or set(algorithms) != set(names):
        reject(f"must give cost curves for exactly {list(names)} (schema "
               f"{schema_version}), has "
               f"{sorted(algorithms) if isinstance(algorithms, dict) else _shown(algorithms)}")
    curves = {}
    for name in names:
        try:
            curves[name] = _parse_curve(algorithms[name])
        except (TypeError, ValueError, ArithmeticError) as e:
            reject(f"has a malformed cost curve for {name!r}: {e}")
    return Table(platform, device_kind, world_size, curves, path)


def _get(doc, key):
    return doc.get(key) if isinstance(doc, dict) else type(doc).__name__


def _shown(value, limit: int = 60) -> str:
    """repr(value) for an error message, cut short where a file holds a long
    one (a 4000-digit integer, a whole list)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False


# Sizes are int64 in XLA; a larger bound could not be compared with one.
_MAX_BYTES = (1 << 63) - 1


def _parse_curve(entries) -> CostCurve:
    if not isinstance(entries, list) or not entries:
        raise ValueError("expected a non-empty list of segments")
    segments, previous = [], 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"up_to_bytes", "latency_us", "us_per_mb"}:
            raise ValueError(f"segment {i} must have exactly up_to_bytes, latency_us, us_per_mb")
        up_to = entry["up_to_bytes"]
        last = i == len(entries) - 1
        if last and up_to is not None:
            raise ValueError("the last segment must have up_to_bytes null (no upper end)")
        if not last and (isinstance(up_to, bool) or not isinstance(up_to, int)
                         or not previous < up_to <= _MAX_BYTES):
            raise ValueError(f"segment {i}: up_to_bytes must be an integer above {previous} "
                             f"and at most 2**63 - 1, got {_shown(up_to)}")
        values = []
        for field in ("latency_us", "us_per_mb"):
            v = entry[field]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
                raise ValueError(f"segment {i}: {field} must be a finite number, got "
                                 f"{_shown(v)}")
            values.append(float(v))
        if values[1] < 0:
            raise ValueError(f"segment {i}: us_per_mb must not be negative, got {values[1]}")
        segment = Segment(up_to, *values)
        # A round never costs less than nothing, at either end of its range
        # (latency_us, the intercept, may be negative in a later segment).
        ends = [segment.predict(previous)] + ([segment.predict(up_to)] if up_to is not None else [])
        if any(t < 0 for t in ends):
            raise ValueError(f"segment {i} predicts a negative time")
        if not all(math.isfinite(t) for t in ends):
            raise ValueError(f"segment {i} predicts a time beyond any float")
        segments.append(segment)
        previous = up_to if up_to is not None else previous
    return CostCurve(tuple(segments))
