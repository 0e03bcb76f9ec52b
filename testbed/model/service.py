"""A cluster's service times, computed once at plan time from one profiles folder.

For each (cluster, model) the plan keeps a :class:`ServiceFigures`: the unthrottled per-call
samples of the model's profile (:func:`testbed.plan.profiles.cpu_time`, at the cluster's
runtime and threads), and what the CPU-share model (:mod:`testbed.model.cpu`) makes of them at
the cluster's share and worker count:

* ``expected_ms`` = t_m, the time a dispatcher expects the server to take (the feasibility test
  RTT + t_m <= D_a): the p95 of an isolated query (low load: the quota refilled), that is its
  request handling (``handling_ms - answer_ms``), a cold model call (``cold_factor``), then the
  answer's writing (``answer_ms``);
* ``busy_mean_ms``: mean time per call when every worker is busy (high load; queue-wait
  estimates and the server's admission use it): the quota pays each query's model call and its
  request handling.

``handling_ms`` (CPU ms per query of the server's event loop: reading the request (HTTP, base64
and JPEG decoding) and writing the answer (encoding it, handing it to the socket), measured per
model by :mod:`testbed.serve.handling`; ``answer_ms`` of it is the answer's side) and ``cold_factor``
(a model call after
idleness over a warm one in the server, :func:`testbed.plan.handling_profiles.call_factors`) are the two
CPU costs beside the warm model call that the emulation's quota pays
(benchmarks/cpu_model_bench.py compares the three with the emulation's measured times).

The simulator draws service times from ``samples_ms`` (bootstrap) and runs them through the CFS
model; the emulation measures them for real. Batches: the per-call time of ``b`` inputs scales
the batch-1 samples by ``mean(b) / mean(1)``, linear in ``b`` between (and beyond) the measured
batch sizes (:func:`batch_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from testbed.model.cpu import CfsQuota


class ServiceFigures(BaseModel):
    """Service times of one model at one cluster (ms unless named otherwise).

    ``samples_ms``: unthrottled per-call times of one input (batch 1). ``batch_mean_ms``: measured
    batch size -> mean unthrottled per-call time. ``cores``/``workers``/``threads``: the cluster's
    share, W and threads per call. ``handling_ms``: CPU time of the server's event loop per query
    (one thread, charged to the same quota): reading the request, and writing the answer, of which
    ``answer_ms`` is the answer's side (<= ``handling_ms``; :attr:`request_ms` the rest).
    ``cold_factor``: a cold call's unthrottled time over
    a warm one's (>= 1). ``source``: the profile file the samples come from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    runtime: str
    cores: float = Field(gt=0)
    workers: int = Field(ge=1)
    threads: int = Field(ge=1)
    samples_ms: list[float] = Field(min_length=1)
    batch_mean_ms: dict[int, float]
    wall_mean_ms: float
    wall_p95_ms: float
    expected_ms: float
    busy_mean_ms: float
    handling_ms: float = Field(default=0.0, ge=0)
    answer_ms: float = Field(default=0.0, ge=0)
    cold_factor: float = Field(default=1.0, ge=1.0)
    source: str = ""

    @property
    def request_ms(self) -> float:
        """CPU ms per query of reading the request (its handling before the queue): ``handling_ms - answer_ms``."""
        return max(0.0, self.handling_ms - self.answer_ms)

    def quota(self) -> CfsQuota:
        """A fresh CFS quota of this cluster (one per cluster and run) with this model's cold rule."""
        return CfsQuota(self.cores, self.threads, self.workers, cold_factor=self.cold_factor,
                        handling=self.handling_ms > 0)


def _percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


def mean_at_batch(batch_mean_ms: Mapping[int, float], batch: int) -> float:
    """Mean per-call time (ms) at ``batch`` inputs: linear in the batch size between (and beyond)
    the measured sizes; with one measured size, proportional to the batch."""
    pts = sorted((int(b), float(t)) for b, t in batch_mean_ms.items())
    if len(pts) == 1:
        b, t = pts[0]
        return t * batch / b
    if batch <= pts[0][0]:
        (b0, t0), (b1, t1) = pts[0], pts[1]
    elif batch >= pts[-1][0]:
        (b0, t0), (b1, t1) = pts[-2], pts[-1]
    else:
        i = next(k for k in range(1, len(pts)) if pts[k][0] >= batch)
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
    return max(1e-6, t0 + (t1 - t0) * (batch - b0) / (b1 - b0))


def batch_scale(fig: ServiceFigures, batch: int) -> float:
    """Factor from a batch-1 call to a call of ``batch`` inputs (1.0 for batch 1)."""
    if batch == 1:
        return 1.0
    return mean_at_batch(fig.batch_mean_ms, batch) / mean_at_batch(fig.batch_mean_ms, 1)


def isolated_query_s(cores: float, threads: int, workers: int, wall_s: float, handling_s: float = 0.0,
                     cold_factor: float = 1.0, answer_s: float = 0.0) -> float:
    """Time (s) from a request's arrival to its answer written at an idle server whose quota is
    full (low load; the arrival at a period boundary): reading the request (``handling_s -
    answer_s`` of CPU), a cold model call of ``wall_s`` unthrottled, then writing the answer
    (``answer_s``), through :class:`CfsQuota`."""
    q = CfsQuota(cores, threads, workers, cold_factor=cold_factor, handling=handling_s > 0)
    return q.handle(q.run(q.handle(0.0, max(0.0, handling_s - answer_s)), wall_s), answer_s)


def service_figures(model: str, runtime: str, cores: float, workers: int, threads: int, samples_ms: Sequence[float],
                    batch_mean_ms: Mapping[int, float], source: str = "", handling_ms: float = 0.0,
                    cold_factor: float = 1.0, answer_ms: float = 0.0) -> ServiceFigures:
    """The :class:`ServiceFigures` of ``model`` at a cluster of ``cores`` cores and ``workers``
    workers, from unthrottled batch-1 ``samples_ms`` (ms), ``handling_ms`` of the event loop's CPU
    per query (``answer_ms`` of it writing the answer) and the model's ``cold_factor``.

    Raises:
        ValueError: no samples, a non-positive or non-finite sample, bad cores/workers/threads, a
            negative or infinite ``handling_ms``, an ``answer_ms`` outside [0, ``handling_ms``] or a
            ``cold_factor`` below 1 or infinite.
    """
    samples = [float(s) for s in samples_ms]
    if not samples or min(samples) <= 0 or not all(math.isfinite(x) for x in samples):
        raise ValueError(f"model {model!r}: service-time samples must be finite and > 0 ms "
                         f"(got {len(samples)} samples)")
    if not 0 <= handling_ms < math.inf or not 1.0 <= cold_factor < math.inf:
        raise ValueError(f"model {model!r}: handling_ms must be >= 0 and cold_factor >= 1 "
                         f"(got {handling_ms}, {cold_factor})")
    if not 0 <= answer_ms <= handling_ms:
        raise ValueError(f"model {model!r}: answer_ms {answer_ms} must be within [0, handling_ms = {handling_ms}]")
    quota = CfsQuota(cores, threads, workers, handling=handling_ms > 0)
    mean = sum(samples) / len(samples)
    isolated = [isolated_query_s(cores, threads, workers, s / 1e3, handling_ms / 1e3, cold_factor,
                                 answer_ms / 1e3) * 1e3 for s in samples]
    bm = {int(b): float(t) for b, t in batch_mean_ms.items()} or {1: mean}
    return ServiceFigures(model=model, runtime=runtime, cores=cores, workers=workers, threads=threads,
                          samples_ms=samples, batch_mean_ms=bm, wall_mean_ms=mean,
                          wall_p95_ms=_percentile(samples, 95), expected_ms=_percentile(isolated, 95),
                          busy_mean_ms=quota.saturated_s(mean / 1e3, workers, handling_ms / 1e3) * 1e3,
                          handling_ms=float(handling_ms), answer_ms=float(answer_ms), cold_factor=float(cold_factor),
                          source=source)


__all__ = ["ServiceFigures", "batch_scale", "isolated_query_s", "mean_at_batch", "service_figures"]
