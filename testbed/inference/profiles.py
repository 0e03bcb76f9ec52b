"""Service-time profiles: what the dispatcher expects and what the simulator draws.

Profiles are measured by the profiler and stored in ``models/profiles/<variant>.json``. This
module is the one reader the policies, the emulation's dispatcher and the simulator share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from testbed.inference import zoo


@dataclass(frozen=True)
class ServiceTime:
    """Service-time distribution of one model variant at one CPU share and batch size.

    ``mean_ms``/``p50_ms``/``p95_ms``: milliseconds per call (one batch of ``batch`` queries).
    ``samples_ms``: measured per-call times (ms), already scaled to ``cpu_cores``.
    """

    variant: str
    cpu_cores: float
    batch: int
    runtime: str
    mean_ms: float
    p50_ms: float
    p95_ms: float
    samples_ms: np.ndarray

    def sample(self, rng: np.random.Generator, n: int | None = None) -> float | np.ndarray:
        """Draw service times (ms) from the measured samples (bootstrap)."""
        return rng.choice(self.samples_ms, size=n)


def service_time(profiles_dir: str | os.PathLike[str], variant: str, cpu_cores: float, batch: int = 1,
                 runtime: str = "tensorflow") -> ServiceTime:
    """The service-time distribution of ``variant`` at ``cpu_cores`` cores.

    A CFS quota below one core stretches a single-threaded call by 1/cpu_cores (it runs only that
    fraction of each period); above one core a single call is not faster.

    Raises:
        testbed.inference.zoo.ZooFileMissing: no profile for ``variant``.
        testbed.inference.zoo.ZooError: the profile is malformed.
        ValueError: ``cpu_cores`` <= 0 or ``batch`` < 1.
    """
    if cpu_cores <= 0 or batch < 1:
        raise ValueError(f"cpu_cores must be > 0 and batch >= 1 (got {cpu_cores}, {batch})")
    prof = zoo.load_profile(profiles_dir, variant)
    stretch = 1.0 / min(1.0, cpu_cores)
    samples = np.asarray(prof.get("samples_ms") or [prof["p50_ms"], prof["p95_ms"], prof["p99_ms"]], dtype=float)
    return ServiceTime(variant, cpu_cores, batch, runtime, prof["mean_ms"] * stretch, prof["p50_ms"] * stretch,
                       prof["p95_ms"] * stretch, samples * stretch)
