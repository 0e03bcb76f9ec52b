"""Service-time profiles: what the dispatcher expects and what the simulator draws.

Profiles are measured by ``testbed profile`` (:mod:`testbed.serve.profiler`) and stored in
``models/profiles/<variant>.json``; this module is the one reader (the plan's catalog, the profiler's
plots, the host-speed check and the benchmarks share it). Format (schema 3)::

    {"schema": 3, "variant", "family", "weights", "random_weights", "machine": {..., "loadavg_at_merge"},
     "method", "measured_at",
     "runtime", "cpu_cores", "batch_size", "mean_ms", "p50_ms", "p95_ms", "p99_ms",   # reference point
     "measurements": [{"runtime": "tensorflow" | "litert", "cpu_cores": 0.5, "batch": 8,
                       "load": "back_to_back" | "isolated", "role": "cpu_time" | "validation",
                       "threads", "cgroup": true, "samples", "warmup_calls", "gap_ms", "loadavg_1min",
                       "mean_ms", "p50_ms", "p95_ms", "p99_ms", "samples_ms": [...]}, ...]}

A measurement's times are per call (one batch of ``batch`` inputs), wall clock, in ms, measured in
a process held to ``cpu_cores`` by a CFS quota, back to back (high load) or each call 100 ms after
the previous (``isolated``: quota refilled, low load; only at shares below ``threads``).
``role: "cpu_time"`` rows (share >= threads: never throttled) are the input of the CPU-share
model (:func:`cpu_time`); ``validation`` rows (fractional shares, throttled) are what the
emulation sees, kept to check that model. Schema-2 rows have no ``load`` (they are back to back);
schema-1 profiles (one 1-core, batch-1 TensorFlow figure without ``measurements``) are still read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.model.service import mean_at_batch
from testbed.plan import zoo


@dataclass(frozen=True)
class ServiceTime:
    """Service-time distribution of one model variant at one CPU share, batch size and runtime.

    ``mean_ms``/``p50_ms``/``p95_ms``: milliseconds per call (one batch of ``batch`` queries).
    ``samples_ms``: measured per-call times (ms), already scaled to ``cpu_cores`` / ``batch`` when
    those were not measured exactly. ``measured_cpu_cores`` / ``measured_batch``: the measurement
    the figures come from (``scale`` = the factor applied to it, 1.0 for an exact match).
    """

    variant: str
    cpu_cores: float
    batch: int
    runtime: str
    mean_ms: float
    p50_ms: float
    p95_ms: float
    samples_ms: np.ndarray
    measured_cpu_cores: float = 0.0
    measured_batch: int = 0
    scale: float = 1.0

    def sample(self, rng: np.random.Generator, n: int | None = None) -> float | np.ndarray:
        """Draw service times (ms) from the measured samples (bootstrap: uniform with replacement)."""
        return rng.choice(self.samples_ms, size=n)


def measurements(prof: dict[str, Any]) -> list[dict[str, Any]]:
    """The measurements of a loaded profile; a schema-1 profile gives its one TensorFlow measurement."""
    if prof.get("measurements"):
        return list(prof["measurements"])
    return [{"runtime": "tensorflow", "cpu_cores": float(prof["cpu_cores"]), "batch": int(prof["batch_size"]),
             "mean_ms": prof["mean_ms"], "p50_ms": prof["p50_ms"], "p95_ms": prof["p95_ms"],
             "p99_ms": prof["p99_ms"],
             "samples_ms": prof.get("samples_ms") or [prof["p50_ms"], prof["p95_ms"], prof["p99_ms"]]}]


def _mean_at_batch(rows: list[dict[str, Any]], batch: int) -> float:
    """Mean per-call time at ``batch`` from the rows of one share (:func:`testbed.model.service.mean_at_batch`)."""
    return mean_at_batch({int(r["batch"]): float(r["mean_ms"]) for r in rows}, batch)


def _load(row: dict[str, Any]) -> str:
    return row.get("load", "back_to_back")


def service_time(profiles_dir: str | os.PathLike[str], variant: str, cpu_cores: float, batch: int = 1,
                 runtime: str = "tensorflow", load: str = "isolated") -> ServiceTime:
    """The service-time distribution of ``variant`` at ``cpu_cores`` cores, ``batch`` inputs per call.

    ``load``: which measurements at a share to use: ``isolated`` (default: each call with a
    refilled CFS quota, what a lightly loaded cluster sees; back-to-back samples at a fractional
    share are mostly the quota's period, ~100 ms, not the model) or ``back_to_back``; where the
    chosen share has no row of that load (shares >= threads are only measured back to back; older
    profiles have no isolated rows), the other load's rows.

    Picks the measured CPU share nearest to ``cpu_cores`` (in ratio, log scale); if it differs,
    stretches the samples by min(1, measured) / min(1, cpu_cores) (a CFS quota below one core runs a
    single-threaded call only that fraction of each period; above one core a call is assumed no
    faster). Within that share, an unmeasured ``batch`` scales the samples of the nearest measured
    batch by the ratio of mean per-call times interpolated linearly in the batch size.

    Raises:
        testbed.plan.zoo.ZooFileMissing: no profile for ``variant``.
        testbed.plan.zoo.ZooError: the profile is malformed or has no ``runtime`` measurement.
        ValueError: ``cpu_cores`` <= 0 or ``batch`` < 1.
    """
    if cpu_cores <= 0 or batch < 1:
        raise ValueError(f"cpu_cores must be > 0 and batch >= 1 (got {cpu_cores}, {batch})")
    prof = zoo.load_profile(profiles_dir, variant)
    rows = [r for r in measurements(prof) if r.get("runtime", "tensorflow") == runtime]
    if not rows:
        have = sorted({r.get("runtime", "tensorflow") for r in measurements(prof)})
        raise zoo.ZooError(f"profile of variant {variant!r} has no {runtime!r} measurement (has: {', '.join(have)}); "
                           f"measure it: testbed profile --variants {variant} --runtimes {runtime}")
    share = min({float(r["cpu_cores"]) for r in rows}, key=lambda s: (abs(math.log(s / cpu_cores)), -s))
    at_share = [r for r in rows if float(r["cpu_cores"]) == share]
    at_share = [r for r in at_share if _load(r) == load] or at_share
    row = min(at_share, key=lambda r: (abs(int(r["batch"]) - batch), -int(r["batch"])))
    scale = min(1.0, share) / min(1.0, cpu_cores)
    if int(row["batch"]) != batch:
        scale *= _mean_at_batch(at_share, batch) / float(row["mean_ms"])
    samples = np.asarray(row.get("samples_ms") or [row["p50_ms"], row["p95_ms"], row["p99_ms"]], dtype=float)
    return ServiceTime(variant, cpu_cores, batch, runtime, float(row["mean_ms"]) * scale, float(row["p50_ms"]) * scale,
                       float(row["p95_ms"]) * scale, samples * scale, measured_cpu_cores=share,
                       measured_batch=int(row["batch"]), scale=scale)


@dataclass(frozen=True)
class CpuTime:
    """Per-call CPU demand of one variant: its wall time with no CPU quota in the way.

    ``samples_ms``: per-call wall times (ms) of ``batch`` inputs, measured with a CFS quota of at
    least ``threads`` cores (so no call is throttled): what a call costs when it runs. The share a
    cluster gets is applied by the CPU model (:mod:`testbed.model.cpu`), not here.
    ``measured_cpu_cores`` / ``measured_batch``: the measurement used; ``scale``: factor applied
    to it for an unmeasured batch size (linear in the batch, as :func:`service_time`).
    """

    variant: str
    runtime: str
    batch: int
    threads: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    samples_ms: np.ndarray
    measured_cpu_cores: float
    measured_batch: int
    scale: float = 1.0


def cpu_time(profiles_dir: str | os.PathLike[str], variant: str, runtime: str = "tensorflow", batch: int = 1,
             threads: int = 1) -> CpuTime:
    """The unthrottled per-call time of ``variant`` (the input of :mod:`testbed.model.cpu`).

    Uses the measurement of ``runtime`` at the smallest CPU share >= ``threads`` cores (one
    thread per core, so the quota never throttles a call); an unmeasured ``batch`` scales the
    nearest measured batch by the ratio of mean per-call times, linear in the batch size.

    Raises:
        testbed.plan.zoo.ZooFileMissing: no profile for ``variant``.
        testbed.plan.zoo.ZooError: no measurement of ``runtime`` at >= ``threads`` cores.
        ValueError: ``batch`` < 1 or ``threads`` < 1.
    """
    if batch < 1 or threads < 1:
        raise ValueError(f"batch and threads must be >= 1 (got {batch}, {threads})")
    prof = zoo.load_profile(profiles_dir, variant)
    rows = [r for r in measurements(prof) if r.get("runtime", "tensorflow") == runtime
            and float(r["cpu_cores"]) >= threads]
    if not rows:
        raise zoo.ZooError(f"profile of variant {variant!r} has no {runtime!r} measurement at >= {threads} core(s) "
                           f"(unthrottled); measure it: testbed profile --variants {variant} --runtimes {runtime} "
                           f"--shares {threads}")
    share = min(float(r["cpu_cores"]) for r in rows)
    at_share = [r for r in rows if float(r["cpu_cores"]) == share]
    at_share = [r for r in at_share if _load(r) == "back_to_back"] or at_share
    row = min(at_share, key=lambda r: (abs(int(r["batch"]) - batch), -int(r["batch"])))
    scale = 1.0 if int(row["batch"]) == batch else _mean_at_batch(at_share, batch) / float(row["mean_ms"])
    samples = np.asarray(row.get("samples_ms") or [row["p50_ms"], row["p95_ms"], row["p99_ms"]], dtype=float)
    return CpuTime(variant, runtime, batch, threads, float(row["mean_ms"]) * scale, float(row["p50_ms"]) * scale,
                   float(row["p95_ms"]) * scale, samples * scale, share, int(row["batch"]), scale)


__all__ = ["CpuTime", "ServiceTime", "cpu_time", "measurements", "service_time"]
