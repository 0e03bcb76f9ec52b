"""Arrival processes of queries, shared by the simulator and the emulation's sources.

Each process generates arrival times window by window: ``times(start_s, end_s)`` returns the sorted
arrival times (s, since the load starts) in ``[start_s, end_s)``; call it with consecutive windows
(the MMPP and the trace keep their position). Each process owns its seeded
``numpy.random.Generator``, so a stream's arrivals do not depend on any other stream.

Formulas (standard; e.g. Ross, *Introduction to Probability Models*, ch. 5):

- ``poisson`` (rate r): the count in a window of length T is Poisson(r T), the times are i.i.d.
  uniform in the window (order statistics property).
- ``step`` (piecewise constant rate): the same per constant piece.
- ``diurnal``: r(t) = r (1 + a sin(2 pi (t + phase) / period)): a non-homogeneous Poisson process
  drawn by thinning (Lewis & Shedler 1979) at r (1 + a).
- ``mmpp``: a continuous-time Markov chain over states with rates r_i, exponential dwell of mean
  d_i, leaving a state for one of the others uniformly (2 states: on/off bursts); Poisson(r_i)
  within a state.
- ``trace``: the timestamps of a CSV column ``t_s``, replayed as they are.

Spatial weights scale the rates per source (:func:`testbed.plan.traces.source_weights` reads them;
the plan carries them). The trace and demand-matrix files are read by :mod:`testbed.plan.traces`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from testbed.core.errors import InputError
from testbed.spec.experiment import WorkloadSpec


class ArrivalError(InputError):
    """An arrival process cannot be built (bad trace file, demand matrix); the message names it."""


class ArrivalProcess:
    """Base class: ``times(start_s, end_s) -> np.ndarray`` (sorted s); ``mean_rate_qps`` (q/s)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def times(self, start_s: float, end_s: float) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def reseed(self, rng: np.random.Generator, now_s: float) -> None:
        """Draw everything after ``now_s`` (s) from ``rng`` from now on: a future that the process's
        past does not fix (the causal planner of :mod:`testbed.aset.headroom`). A process that drew
        ahead (MMPP's next state change) redraws that too."""
        self.rng = rng

    def _uniform(self, rate: float, a: float, b: float) -> np.ndarray:
        if rate <= 0 or b <= a:
            return np.empty(0)
        n = self.rng.poisson(rate * (b - a))
        return np.sort(self.rng.uniform(a, b, n))


class Poisson(ArrivalProcess):
    """Homogeneous Poisson arrivals at ``rate_qps`` queries/s."""

    def __init__(self, rng: np.random.Generator, rate_qps: float):
        super().__init__(rng)
        self.rate = rate_qps
        self.mean_rate_qps = rate_qps

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        return self._uniform(self.rate, start_s, end_s)


class Step(ArrivalProcess):
    """Piecewise-constant rate: ``steps`` = [(at_s, rate_qps), ...] in increasing ``at_s``; 0 before."""

    def __init__(self, rng: np.random.Generator, steps: Sequence[tuple[float, float]]):
        super().__init__(rng)
        self.at = [a for a, _ in steps] + [math.inf]
        self.rates = [r for _, r in steps]
        self.mean_rate_qps = max(self.rates, default=0.0)

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        parts = []
        for i, r in enumerate(self.rates):
            a, b = max(start_s, self.at[i]), min(end_s, self.at[i + 1])
            if b > a:
                parts.append(self._uniform(r, a, b))
        return np.concatenate(parts) if parts else np.empty(0)


class Diurnal(ArrivalProcess):
    """r(t) = rate (1 + amplitude sin(2 pi (t + phase_s) / period_s)), by thinning."""

    def __init__(self, rng: np.random.Generator, rate_qps: float, amplitude: float, period_s: float,
                 phase_s: float = 0.0):
        super().__init__(rng)
        self.rate, self.amp, self.period, self.phase = rate_qps, amplitude, period_s, phase_s
        self.mean_rate_qps = rate_qps

    def rate_at(self, t: np.ndarray | float) -> np.ndarray | float:
        """The instantaneous rate (q/s) at time ``t`` (s)."""
        return self.rate * (1 + self.amp * np.sin(2 * np.pi * (np.asarray(t) + self.phase) / self.period))

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        lam_max = self.rate * (1 + self.amp)
        cand = self._uniform(lam_max, start_s, end_s)
        if cand.size == 0:
            return cand
        keep = self.rng.uniform(0, lam_max, cand.size) < self.rate_at(cand)
        return cand[keep]


class MMPP(ArrivalProcess):
    """Markov-modulated Poisson process: state i has rate ``rates_qps[i]`` and exponential dwell of
    mean ``dwell_s[i]``; it jumps to one of the other states uniformly. Starts in state 0."""

    def __init__(self, rng: np.random.Generator, rates_qps: Sequence[float], dwell_s: Sequence[float]):
        super().__init__(rng)
        self.rates, self.dwell = list(rates_qps), list(dwell_s)
        self.state = 0
        self.until = float(rng.exponential(self.dwell[0]))
        w = np.asarray(self.dwell)
        # uniform jumps: the embedded chain is uniform, so the time share of state i is d_i / sum d
        self.mean_rate_qps = float((np.asarray(self.rates) * w).sum() / w.sum())

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        parts = []
        t = start_s
        while t < end_s:
            b = min(end_s, self.until)
            parts.append(self._uniform(self.rates[self.state], t, b))
            t = b
            if self.until <= end_s:
                others = [i for i in range(len(self.rates)) if i != self.state]
                self.state = others[int(self.rng.integers(len(others)))]
                self.until += float(self.rng.exponential(self.dwell[self.state]))
        return np.concatenate(parts) if parts else np.empty(0)

    def reseed(self, rng: np.random.Generator, now_s: float) -> None:
        """As :meth:`ArrivalProcess.reseed`; the time left in the current state is redrawn, which
        keeps its law: the dwell is exponential, hence memoryless."""
        super().reseed(rng, now_s)
        if self.until > now_s:
            self.until = now_s + float(rng.exponential(self.dwell[self.state]))


class Trace(ArrivalProcess):
    """Replays timestamps (s since the load starts), e.g. from :func:`testbed.plan.traces.read_trace`."""

    def __init__(self, rng: np.random.Generator, t_s: np.ndarray):
        super().__init__(rng)
        self.t = np.sort(np.asarray(t_s, dtype=float))
        span = float(self.t[-1] - self.t[0]) if self.t.size > 1 else 0.0
        self.mean_rate_qps = self.t.size / span if span > 0 else 0.0

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        i, j = np.searchsorted(self.t, [start_s, end_s], side="left")
        return self.t[i:j]


def make_process(spec: WorkloadSpec, rng: np.random.Generator, weight: float = 1.0,
                 trace_s: np.ndarray | None = None) -> ArrivalProcess:
    """The arrival process of ``spec`` at one source, rates scaled by ``weight`` (a trace is replayed
    as it is). ``trace_s``: the trace's timestamps (s), for ``process: trace``; the model reads no
    file: :func:`testbed.plan.traces.arrival_process` reads it and calls this.

    Raises:
        ArrivalError: a trace process without its timestamps.
    """
    if spec.process == "poisson":
        return Poisson(rng, spec.rate_qps * weight)
    if spec.process == "diurnal":
        return Diurnal(rng, spec.rate_qps * weight, spec.amplitude, spec.period_s, spec.phase_s)
    if spec.process == "step":
        return Step(rng, [(s.at_s, s.rate_qps * weight) for s in spec.steps])
    if spec.process == "mmpp":
        return MMPP(rng, [r * weight for r in spec.rates_qps], spec.dwell_s)
    if spec.process == "trace":
        if trace_s is None:
            raise ArrivalError(f"workload {spec.application!r}: a trace process needs its timestamps "
                               f"(testbed.plan.traces.arrival_process reads {spec.trace!r})")
        return Trace(rng, trace_s)
    raise ArrivalError(f"unknown arrival process {spec.process!r}")  # pragma: no cover - schema forbids


__all__ = ["MMPP", "ArrivalError", "ArrivalProcess", "Diurnal", "Poisson", "Step", "Trace", "make_process"]
