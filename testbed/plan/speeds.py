"""Clusters at their profile's speed, whatever the host: the speed factors, and the rule that
scales a cluster's CPU by them.

The profiles (``models/profiles``, :mod:`testbed.serve.profiler`) were measured on one machine on
one day; the host of a run is faster or slower (on the project's build machines the same bare call
ran at 0.83-1.29x its profile from one day to another: docs/models-and-servers.md, "Clusters at
their profile's speed"). At start-up each inference server times the bare call of each model it
serves (the profiler's call: one input, back to back, after the warm-up, at the cluster's threads
per call;
the median CPU time per call, :func:`testbed.serve.handling.time_bare_calls`) and compares it
with the profile's unthrottled per-call time of the same runtime and threads
(:func:`testbed.plan.profiles.cpu_time`, its median):

    factor_m = bare_ms_m / profile_ms_m        (below 1: the host runs the model faster than profiled)

A cluster has one CPU quota, hence one scale s for all the models it serves (our rule,
:func:`cluster_speed`): the mean of their factors weighted by w_m = lambda_m x t_m, the CPU per
second each model is expected to take at the profile's speed (t_m: the plan's mean unthrottled
call, the profile's with the in-server factor), so that s is the cluster's expected CPU per second
on this host over that at the profile's speed. lambda_m is the plan's expected query rate to
(cluster, model) (:func:`expected_weights`): each application's mean rate split evenly over the
(cluster, model) options that serve its family at its minimum accuracy (all of its family's when
none does, as the dispatcher's fallback). A cluster that no application can use weighs its models
equally.

``emulation.speed: profile`` (the default) applies s at time dilation k (k = 1: undilated):

* the cluster's CFS quota is ``cores x s`` x 100 ms per k x 100 ms: a faster host (s < 1) gets
  less quota, a slower one more, so a saturated cluster serves as many calls per second as the
  profile says;
* each call runs k / s times its measured CPU time on the wall clock (s <= k; below), so an idle
  cluster's calls take as long as the profile says too: at one core or more each thread of the
  server is capped at s / k core (1 ms per k / s ms, nested cgroups:
  :func:`testbed.core.cgroups.cap_threads`); below one core each model call and each request's
  handling is followed by a sleep of (k / s - 1) x its CPU time (:attr:`ClusterSpeed.cpu_pad`;
  :func:`testbed.plan.dilation.nested_cpu` says why), a paced call of one input until it
  takes the profile's call x k / s (:func:`testbed.serve.scheduler.pad_work`).

During the load the quota of a padded cluster follows its work (:func:`followed_quota_factor`):
the model charges a cluster's quota for each call (its drawn time) and for each request's handling
(the profile's ``handling_ms`` of the event loop per query, :mod:`testbed.serve.handling`), and
nothing else; the server process spends CPU beside both (a call between idle gaps, or between
another model's calls, costs a host more than the back-to-back bare call of the speed check: a
cold call of mobilenet_v2_100 cost this project's VM 1.40x its warm one against the profile's
1.00x; the event loop's work that no pad measures; the runtime's other threads). A quota scaled
by the bare calls alone ran out in a third of the periods where the simulator's seldom does, and
one scaled by the calls' own CPU left the handling unpaid: a saturated cluster then served 1.2x
the simulator's queries. Every :data:`FOLLOW_POLL_S` the run sets the quota to ``cores x s x r / u``,
r the server process's CPU time over what the model charges for its work at this host's speed
(:func:`work_totals`: the paced calls' bare calls x their draws, x the profile's cold factor
when cold; s x the profile's handling per query; unpaced calls at their own CPU) over the last
:data:`FOLLOW_WINDOW_S` of the server's counters, divided by the quota's overrun u over the same
window (what the group took past its quota: :func:`followed_quota`), so that a saturated cluster
serves as many queries per second as the simulator's; the quota is written only when it changes
by more than :data:`FOLLOW_STEP`, as a CFS period starts.

What is left is each model's residual factor, factor_m / s: 1 for a cluster of one model, the
spread of its models' factors around s for a cluster of several (the simulator can take it:
:func:`apply_speeds`).

A slower host (s > 1) gets more quota, which it can give while the cluster's threads can use it:
cores x s / k at most min(workers x threads per call, the machine's CPUs) (x (1 + :data:`TOLERANCE`));
beyond that the run stops before the load, naming the time dilation that would fit
(:func:`check_fits`). A thread cannot run faster than one core either, so a call cannot be sped
up beyond the host's speed: with s > k the calls run at the host's speed (the per-call scale is k,
no cap and no pad), each call is s / k times slower than its profile while the quota keeps the
profile's throughput, and the summary says so with the k that would hold the per-call time too
(:attr:`ClusterSpeed.calls_slow`; ``call_scale``, and each model's residual factor_m / call_scale).

``emulation.speed: host`` scales nothing (s = 1: the clusters run at the host's speed, every
residual is the factor itself) and keeps the factors: the run's quick re-profile of the day's
speeds, which ``testbed simulate EXP --speeds RUN_DIR`` applies to the profile's samples.

With ``host`` each server also times its request handling (the event loop reading a request and
writing its answer) as the handling profile was measured: real queries of its cheapest model,
back to back on one kept-alive connection, the event loop's CPU per query
(:func:`testbed.serve.server.time_handling`) over the profile's ``handling_ms``:
``ClusterSpeed.handling_factor``. The twin scales the simulator's handling by it, not by the
model calls' factor: code of another kind, which another machine can slow by another ratio
(:attr:`ClusterSpeed.handling_residual`).

Where the figures go: ``run.json`` ``speeds`` (:class:`Speeds`, read back by :func:`read_speeds`)
and one line of the run's summary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from testbed.core.errors import InputError, RunFailure
from testbed.model.cpu import threads_per_call
from testbed.model.service import ServiceFigures
from testbed.plan import zoo
from testbed.plan.dilation import nested_cpu
from testbed.plan.profiles import cpu_time
from testbed.plan.resolved import Plan, PlanError
from testbed.plan.traces import application_rates

SpeedMode = Literal["profile", "host"]

#: Slack of the slow-host bounds: a quota up to this share beyond what the cluster's threads can use
#: is given all the same, and calls up to this share slower than the profile are not called slow.
#: Our choice: the bare call's own repeatability minutes apart on a quiet host (a few %).
TOLERANCE = 0.05
#: The largest speed factor (a bare call, or the request handling, over its profile) a run's speeds
#: may hold: no host this testbed can emulate on is that much slower (the slowest seen, QEMU's
#: software emulation, ran this project's calls at up to 168x; docs/kernel-path.md), and the
#: simulator's times grow with it. Our choice.
MAX_SPEED_FACTOR = 1000.0
#: The key of the speeds in ``run.json``.
RUN_KEY = "speeds"
#: A model whose profiled call takes less (ms) is mostly per-call overhead, which the bare call's
#: speed does not measure (this VM's 5 us LiteRT digits_small call cost 17x as much after an idle
#: gap): its calls are padded at the cluster's rate and judged by their waits alone, and the
#: host-speed check leaves it out (:func:`testbed.serve.handling.host_speed`). Our choice.
LEAST_PACED_MS = 1.0
#: How often (s of wall time) the run sets a padded cluster's quota to follow its paced calls'
#: CPU (:func:`followed_quota_factor`): the servers write their counters every
#: ``emulation.stats_interval_s`` (1 s by default). Our choice.
FOLLOW_POLL_S = 1.0
#: The window (s of wall time) of the server's counters whose calls set the followed quota: a few
#: stats intervals, so that a burst of cold calls does not swing it, short against a run's phases.
#: Our choice.
FOLLOW_WINDOW_S = 5.0
#: Less expected CPU (s) than this in the window (about 5 calls of a few ms) keeps the quota as it
#: stands: too few calls to read a ratio from. Our choice.
FOLLOW_MIN_EXPECTED_S = 0.02
#: The bounds of the followed factor r: a ratio beyond them is not a call's cost (a stalled
#: process clock, a call that ran mostly on other threads). Our choice.
FOLLOW_BOUNDS = (0.5, 3.0)
#: The largest overrun of a CFS quota the followed quota corrects (:func:`followed_quota`). Our
#: choice: writes timed to the period's start leave a few percent (tests/test_dilation_cgroups.py).
OVERRUN_BOUND = 2.0
#: A followed quota within this fraction of the one applied is not written (our choice): every
#: write forgives the group what it ran past its last period's quota (about a scheduler tick of
#: CPU, :class:`testbed.core.cgroups.PeriodAligned`), so a write that changes nothing that matters
#: would give that CPU away.
FOLLOW_STEP = 0.02


def followed_quota_factor(taken_cpu_s: float, expected_cpu_s: float) -> float | None:
    """The factor r of a padded cluster's quota (``cores x s x r``, module docstring) over the
    window: the CPU time its server process took (``taken_cpu_s``, s) over what the model charges
    for its work at this host's speed (``expected_cpu_s``, s; :func:`work_totals`), within
    :data:`FOLLOW_BOUNDS`; None when the window expected less than :data:`FOLLOW_MIN_EXPECTED_S`
    (the quota stays as it stands)."""
    if not expected_cpu_s >= FOLLOW_MIN_EXPECTED_S or not math.isfinite(taken_cpu_s):
        return None
    lo, hi = FOLLOW_BOUNDS
    return min(hi, max(lo, taken_cpu_s / expected_cpu_s))


def followed_quota(quota_cores: float, time_dilation: float, taken_cpu_s: float, expected_cpu_s: float,
                   span_s: float, applied_cores: float) -> tuple[float, float, float] | None:
    """The quota (cores per k x 100 ms) of a padded cluster for the next poll, from a window of
    its server's counters: ``(r, u, quota_cores x r / u)``, r the work's factor
    (:func:`followed_quota_factor`: the CPU ``taken_cpu_s`` over ``expected_cpu_s``, s) and u the
    quota's overrun over the window: the CPU rate the process took (``taken_cpu_s`` over the
    window's ``span_s``, s of wall clock) over the quota applied meanwhile (``applied_cores``,
    cores per k x 100 ms, mean over the window; / ``time_dilation`` k on the wall clock), at least 1
    and at most :data:`OVERRUN_BOUND`. A group runs past its quota when the quota is written in
    mid-period (the write refills its runtime: :class:`testbed.core.cgroups.PeriodAligned`, which
    the run's writes wait for) and by what each write forgives (a few percent); dividing by u holds
    the CPU it takes to the model's. None when the window has too little work (:func:`followed_quota_factor`)."""
    r = followed_quota_factor(taken_cpu_s, expected_cpu_s)
    if r is None:
        return None
    u = 1.0
    if span_s > 0 and applied_cores > 0 and time_dilation > 0:
        u = min(OVERRUN_BOUND, max(1.0, taken_cpu_s / span_s / (applied_cores / time_dilation)))
    return r, u, quota_cores * r / u


def work_totals(stats: dict) -> tuple[float, float, float] | None:
    """From one server's counters (its ``GET /v1/stats`` dict, :mod:`testbed.serve.server`): when
    they were taken (``time_ns``, as unix s), the CPU time (s) its process has taken since it
    started (``process_cpu_s``), and what the model
    charges for the work it did at this host's speed (s): per model the paced calls' expected CPU
    (``expected_cpu_s``: each bare call x its draw, x the profile's cold factor when cold), the
    unpaced calls' own CPU (``cpu_s - paced_cpu_s``: batches and calls too short to pace, charged
    as they ran), and the handling's (``expected_handling_s``: s x the profile's handling of each
    query). Cumulative totals; None when a field is missing or malformed, or no call was paced (a
    cluster whose quota does not follow)."""
    try:
        per_model = stats["per_model"].values()
        paced = sum(float(v.get("expected_cpu_s", 0.0)) for v in per_model)
        unpaced = sum(max(0.0, float(v.get("cpu_s", 0.0)) - float(v.get("paced_cpu_s", 0.0))) for v in per_model)
        taken = float(stats["process_cpu_s"])
        handling = float(stats.get("expected_handling_s", 0.0))
        at = int(stats["time_ns"]) / 1e9
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not paced > 0 or not math.isfinite(taken):
        return None
    return at, taken, paced + unpaced + handling


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SpeedTarget(_Frozen):
    """What a server needs to scale itself (``ServerConfig.speed``): the run's ``mode``, the time
    dilation k, whether the cluster's threads are capped (``nested``, at one core or more) or its
    calls padded, its ``workers`` and ``threads`` per call, per model the profile's bare call
    (``profile_ms``, ms) and the rule's weight (``weights``, :func:`expected_weights`), and for a
    restarted server the bare calls its first life measured (``measured_ms``, and after idleness
    ``measured_cold_ms``; None: measure them), so that every life runs at one scale; per model the
    profile's ``cold_factor`` (a call after idleness over a warm one,
    :class:`testbed.model.service.ServiceFigures`; absent: 1) and its ``draws``: the simulator's
    samples of one call (the plan's ``samples_ms``, the in-server factor applied) over
    ``profile_ms``, from which a paced call draws its target as the simulator draws its time
    (:class:`testbed.serve.scheduler.CallPace`; absent: every call the median's); per model the
    profile's CPU of the event loop per query (``handling_ms``, ms, ``answer_ms`` of it the
    answer's side: :class:`testbed.model.service.ServiceFigures`; absent: 0), which the model
    charges the cluster's quota and its followed quota counts (:func:`work_totals`), and with
    ``mode`` host the server's handling check holds its handling against
    (:meth:`handling_probe`; a restarted server is given its first life's factor,
    ``measured_handling_factor``)."""

    mode: SpeedMode
    time_dilation: float = Field(ge=1.0)
    nested: bool
    workers: int = Field(1, ge=1)
    threads: int = Field(ge=1)
    profile_ms: dict[str, float]
    weights: dict[str, float]
    cold_factor: dict[str, float] = Field(default_factory=dict)
    measured_ms: dict[str, float] | None = None
    measured_cold_ms: dict[str, float] | None = None
    measured_handling_factor: float | None = Field(None, gt=0, le=MAX_SPEED_FACTOR)
    draws: dict[str, list[float]] = Field(default_factory=dict)
    handling_ms: dict[str, float] = Field(default_factory=dict)
    answer_ms: dict[str, float] = Field(default_factory=dict)

    def paced(self, model: str) -> bool:
        """Whether ``model``'s calls of one input are paced and judged by a target
        (:class:`testbed.serve.scheduler.CallPace`): on one thread per call (on more, a call's CPU
        time is its threads' sum, which no wall-time target reads) and profiled at
        :data:`LEAST_PACED_MS` or more."""
        return self.threads == 1 and self.profile_ms[model] >= LEAST_PACED_MS

    def handling_probe(self) -> str | None:
        """The model whose queries the server's handling check sends
        (:func:`testbed.serve.server.time_handling`): with ``mode`` host and no first life's figure
        (``measured_handling_factor``), the one whose query costs least at the profile's speed
        (its ``handling_ms`` + its bare call), among those with a profiled handling; None: no check."""
        if self.mode != "host" or self.measured_handling_factor is not None:
            return None
        costs = [(self.handling_ms[m] + self.profile_ms[m], m) for m in self.profile_ms
                 if self.handling_ms.get(m, 0) > 0]
        return min(costs)[1] if costs else None

    def times_cold(self, model: str) -> bool:
        """Whether the speed check times ``model``'s cold calls: a paced model of a padded cluster
        (below one core), whose cold call is padded to the profile's cold call x k / s
        (:func:`testbed.serve.scheduler.pad_work`): a host whose cold call costs it more, against
        its warm one, than the profile's cold factor, makes them late, and the Speeds line says
        by how much."""
        return self.paced(model) and not self.nested


class ModelSpeed(_Frozen):
    """One model at one cluster: its bare call now (``bare_ms``, median CPU ms per call, over
    ``calls`` calls) and in its profile (``profile_ms``), ``factor`` = bare / profile, its
    ``weight`` in the cluster's scale (expected CPU ms per s at the profile's speed), the cluster's
    quota ``scale`` and the ``residual`` factor = factor / the cluster's per-call scale: its calls'
    time over the profile's as the run held them. A call after idleness (the cold rule,
    :func:`testbed.model.cpu.call_is_cold`): ``bare_cold_ms`` (median CPU ms of bare calls each
    after an idle gap; None: not measured) and the profile's ``cold_factor``."""

    bare_ms: float = Field(gt=0)
    profile_ms: float = Field(gt=0)
    factor: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    weight: float = Field(ge=0)
    calls: int = Field(ge=0)
    scale: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    residual: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    bare_cold_ms: float | None = Field(None, gt=0)
    cold_factor: float = Field(1.0, ge=1.0)

    @property
    def host_cold_ratio(self) -> float | None:
        """This host's cold call over its warm one (``bare_cold_ms / bare_ms``); None when not measured."""
        return None if self.bare_cold_ms is None else self.bare_cold_ms / self.bare_ms


class ClusterSpeed(_Frozen):
    """One cluster's speed (module docstring): ``factor`` (the weighted mean of its models'
    factors, the scale it asks for), ``scale`` (s, the quota's: 1 with ``mode`` host, else the
    factor), ``call_scale`` (the calls': min(s, k)), ``residual`` (factor / call_scale),
    ``cores`` (its share), ``usable_cores`` (what its threads can use: workers x threads per call)
    and ``quota_cores`` (cores x scale: the CFS quota per k x 100 ms), how its calls' speed is held
    (``applied_by``: ``caps`` per thread, ``pad`` after each call, or ``none`` when k / call_scale
    = 1), per model a :class:`ModelSpeed`, and with ``mode`` host the ``handling_factor``: the
    event loop's CPU per query over the profile's ``handling_ms``, from the server's handling check
    (:func:`testbed.serve.server.time_handling`; None: not measured)."""

    mode: SpeedMode
    time_dilation: float = Field(ge=1.0)
    cores: float = Field(gt=0)
    usable_cores: float = Field(gt=0)
    factor: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    scale: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    call_scale: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    residual: float = Field(gt=0, le=MAX_SPEED_FACTOR)
    quota_cores: float = Field(gt=0)
    applied_by: Literal["caps", "pad", "none"]
    models: dict[str, ModelSpeed]
    handling_factor: float | None = Field(None, gt=0, le=MAX_SPEED_FACTOR)

    @property
    def handling_residual(self) -> float:
        """The request handling's time over the profile's as the run held it (what
        :func:`apply_speeds` scales the simulator's handling by): the measured
        :attr:`handling_factor` when there is one (``mode`` host: nothing scales the handling, and
        it need not run at the model calls' factor: under QEMU's software emulation this project's
        LiteRT calls ran 34-168x slower than profiled and the request handling 45-55x,
        docs/models-and-servers.md), else the cluster's ``residual`` (``mode`` profile: the quota
        follows the work the handling took, :func:`followed_quota_factor`)."""
        return self.handling_factor if self.handling_factor is not None else self.residual

    @property
    def slowdown(self) -> float:
        """k / call_scale: a call's wall time over its CPU time on this host (1: nothing to slow)."""
        return self.time_dilation / self.call_scale

    @property
    def cpu_pad(self) -> float:
        """The server's pad (``Scheduler.cpu_pad``): k / call_scale - 1 when the cluster is padded, else 0."""
        return self.slowdown - 1.0 if self.applied_by == "pad" else 0.0

    @property
    def calls_slow(self) -> bool:
        """Whether its calls run slower than the profile because the host is (s > k x (1 + TOLERANCE))."""
        return self.mode == "profile" and self.factor > self.time_dilation * (1.0 + TOLERANCE)

    def least_dilation(self, cpus: int) -> float:
        """The smallest time dilation (rounded up to 0.1) at which :meth:`fits` holds on ``cpus``
        CPUs: the quota asked for (cores x s) over what the cluster's threads can use."""
        if self.mode == "host":
            return 1.0
        return needed_dilation(self.quota_cores / min(self.usable_cores, float(cpus)))

    def fits(self, cpus: int) -> bool:
        """Whether the quota asked for can be used: cores x s / k at most min(``usable_cores``,
        ``cpus``) x (1 + TOLERANCE) (always with ``mode`` host: nothing is asked)."""
        room = min(self.usable_cores, float(cpus))
        return self.mode == "host" or self.quota_cores / self.time_dilation <= room * (1.0 + TOLERANCE)


class Speeds(_Frozen):
    """The speeds of a run (``run.json`` ``speeds``): its ``mode``, its time dilation k and, per
    cluster, a :class:`ClusterSpeed`."""

    mode: SpeedMode
    time_dilation: float = Field(ge=1.0)
    clusters: dict[str, ClusterSpeed]

    def warnings(self) -> list[str]:
        """One line per cluster whose calls ran slower than their profile (:attr:`ClusterSpeed.calls_slow`)."""
        return [f"WARNING: cluster {c}'s calls ran {cs.residual:.2f}x slower than their profiles: this host runs its "
                f"models {cs.factor:.2f}x slower and a thread cannot run faster than one core at time dilation "
                f"{cs.time_dilation:g} (its quota was raised to {cs.quota_cores:.2f} cores to keep the profile's "
                f"throughput); for the profile's per-call time too, run with --time-dilation "
                f"{needed_dilation(cs.factor):g} or more" for c, cs in self.clusters.items() if cs.calls_slow]

    def line(self) -> str:
        """The summary's line: per cluster its scale and each model's factor (and residual when it
        is not 1 to within 1 %), and its cold call over its warm one on this host beside the
        profile's cold factor."""
        parts = []
        for c, cs in self.clusters.items():
            models = ", ".join(f"{m} {ms.factor:.2f}x" + (f" (residual {ms.residual:.2f})"
                                                          if abs(ms.residual - 1) >= 0.01 else "")
                               + ("" if ms.host_cold_ratio is None else
                                  f" cold {ms.host_cold_ratio:.2f}x warm (profile {ms.cold_factor:.2f}x)")
                               for m, ms in cs.models.items())
            slow = f", calls {cs.residual:.2f}x the profile's (host too slow for k = {cs.time_dilation:g})" \
                if cs.calls_slow else ""
            handling = "" if cs.handling_factor is None else f", request handling {cs.handling_factor:.2f}x"
            parts.append(f"{c} quota x{cs.scale:.2f}{slow}: {models}{handling}")
        head = ("clusters at their profile's speed (host's bare call over the profile's; quota scale)"
                if self.mode == "profile" else "clusters at the host's speed (speed: host; bare call over the profile)")
        return f"{head}: " + "; ".join(parts)


def cluster_speed(target: SpeedTarget, cores: float, bare_ms: dict[str, float],
                  calls: dict[str, int] | None = None, bare_cold_ms: dict[str, float] | None = None) -> ClusterSpeed:
    """The rule (module docstring): the speed of a cluster of ``cores`` whose server measured
    ``bare_ms`` (model -> CPU ms per bare call, over ``calls`` calls; ``bare_cold_ms``: per call
    after an idle gap) for ``target``.

    Raises:
        ValueError: a model of ``target`` has no measurement, or a figure is not > 0.
    """
    missing = [m for m in target.profile_ms if m not in bare_ms]
    if missing:
        raise ValueError(f"no bare-call measurement of {', '.join(missing)}")
    cold = dict(bare_cold_ms or {})
    bad = {f"{what} {m}": v for what, d in (("bare", bare_ms), ("profile", target.profile_ms), ("cold", cold))
           for m, v in d.items() if not (v > 0 and math.isfinite(v))}
    if bad:
        raise ValueError(f"bare-call figures must be finite and > 0 ms (got {bad})")
    models = list(target.profile_ms)
    factors = {m: bare_ms[m] / target.profile_ms[m] for m in models}
    beyond = {m: round(f, 1) for m, f in factors.items() if f > MAX_SPEED_FACTOR}
    if beyond:
        raise ValueError(f"bare calls {beyond} times slower than their profiles, beyond the largest speed factor "
                         f"{MAX_SPEED_FACTOR:g}: this host cannot stand in for the profiled one")
    w = {m: max(0.0, target.weights.get(m, 0.0)) for m in models}
    if sum(w.values()) <= 0:
        w = {m: 1.0 for m in models}
    wanted = sum(w[m] * factors[m] for m in models) / sum(w.values())
    k = target.time_dilation
    scale = 1.0 if target.mode == "host" else wanted
    call_scale = min(scale, k)
    slowdown = k / call_scale
    applied = "none" if abs(slowdown - 1.0) < 1e-9 else "caps" if target.nested else "pad"
    calls = calls or {}
    return ClusterSpeed(
        mode=target.mode, time_dilation=k, cores=cores, usable_cores=float(target.workers * target.threads),
        factor=wanted, scale=scale, call_scale=call_scale, residual=wanted / call_scale, quota_cores=cores * scale,
        applied_by=applied,
        models={m: ModelSpeed(bare_ms=bare_ms[m], profile_ms=target.profile_ms[m], factor=factors[m],
                              weight=w[m], calls=int(calls.get(m, 0)), scale=scale, residual=factors[m] / call_scale,
                              bare_cold_ms=cold.get(m), cold_factor=max(1.0, target.cold_factor.get(m, 1.0)))
                for m in models})


def needed_dilation(ratio: float) -> float:
    """The smallest time dilation, rounded up to 0.1, at which ``ratio`` (what is asked over what
    one k gives) is at most k."""
    return max(1.0, math.ceil(ratio * 10 - 1e-9) / 10)


def check_fits(cluster: str, cs: ClusterSpeed, cpus: int) -> None:
    """Raise when ``cs``'s quota cannot be used at its dilation on a machine of ``cpus`` CPUs
    (:meth:`ClusterSpeed.fits`).

    Raises:
        RunFailure: naming the cluster, its slowest model, and the time dilation that would fit
            (exit code 3: a precondition of the run).
    """
    if cs.fits(cpus):
        return
    slow = max(cs.models.items(), key=lambda kv: kv[1].factor)
    room = min(cs.usable_cores, float(cpus))
    k = cs.least_dilation(cpus)
    raise RunFailure(
        f"cluster {cluster}: this host runs its models {cs.factor:.2f}x slower than their profiles (e.g. {slow[0]}: "
        f"bare call {slow[1].bare_ms:.3f} ms against {slow[1].profile_ms:.3f} ms profiled): its {cs.cores:g} cores "
        f"at the profile's speed need {cs.quota_cores:.2f} cores of this host, more than its threads can use "
        f"({room:g}: workers x threads per call, at most the machine's {cpus} CPUs) at time dilation "
        f"{cs.time_dilation:g}. Run with --time-dilation {k:g} (or more), or set emulation.speed: host to run at "
        f"the host's speed (testbed simulate --speeds RUN_DIR then simulates at it)")


def expected_weights(plan: Plan) -> dict[str, dict[str, float]]:
    """Per cluster and model, the rule's weight: lambda_m x t_m (module docstring), in expected CPU
    ms per s at the profile's speed (the plan's mean rates and mean unthrottled calls). From the
    emulated plan when ``plan`` is a wall one.

    Raises:
        testbed.model.arrivals.ArrivalError: a workload entry's process cannot be built (the plan
            has checked it before).
    """
    plan = plan.emulated
    rates = application_rates(plan.experiment.workload, plan.weights, Path(plan.base_dir))
    rate = {a.name: rates.get(a.name, 0.0) for a in plan.experiment.applications}
    lam: dict[tuple[str, str], float] = {}
    for a in plan.experiment.applications:
        good = plan.served_by(a)
        for key in good:
            lam[key] = lam.get(key, 0.0) + rate[a.name] / len(good)
    return {c: {m: lam.get((c, m), 0.0) * f.wall_mean_ms for m, f in by.items()} for c, by in plan.services.items()}


def speed_target(plan: Plan, cluster: str, first: ClusterSpeed | None = None,
                 weights: dict[str, dict[str, float]] | None = None) -> SpeedTarget:
    """The :class:`SpeedTarget` of ``cluster``'s server: the profile's bare call of each of its
    models at its runtime and threads per call (:func:`testbed.plan.profiles.cpu_time`, median)
    and its cold factor (the plan's), the rule's weights (``weights``: :func:`expected_weights`,
    computed when not given), and for a later life the bare calls of the ``first``.

    Raises:
        PlanError: a model's profile cannot be read (names the cluster and the model).
    """
    spec = plan.cluster_spec(cluster)
    threads = threads_per_call(spec.cpu_cores, spec.workers)
    profile_ms = {}
    for m in spec.models:
        try:
            profile_ms[m] = float(cpu_time(plan.profiles_dir, m, spec.server.runtime_of(m), 1, threads).p50_ms)
        except (zoo.ZooError, OSError) as exc:
            raise PlanError(f"cluster {cluster}: the speed check needs {m!r}'s profile: {exc}") from None
    weights = weights if weights is not None else expected_weights(plan)
    em = plan.experiment.emulation
    figures = plan.services.get(cluster, {})
    samples = plan.emulated.services.get(cluster, {})  # the simulator's figures, in emulated ms (not x k)
    measured_cold = None if first is None else {m: ms.bare_cold_ms for m, ms in first.models.items()
                                                if ms.bare_cold_ms is not None}
    return SpeedTarget(mode=em.speed, time_dilation=plan.time_dilation, nested=nested_cpu(spec.cpu_cores),
                       workers=spec.workers, threads=threads, profile_ms=profile_ms,
                       weights=dict(weights.get(cluster, {})),
                       cold_factor={m: figures[m].cold_factor for m in spec.models if m in figures},
                       measured_ms=None if first is None else {m: ms.bare_ms for m, ms in first.models.items()},
                       measured_cold_ms=measured_cold,
                       measured_handling_factor=None if first is None else first.handling_factor,
                       draws={m: [x / profile_ms[m] for x in samples[m].samples_ms]
                              for m in spec.models if m in samples},
                       handling_ms={m: samples[m].handling_ms for m in spec.models if m in samples},
                       answer_ms={m: samples[m].answer_ms for m in spec.models if m in samples})


def read_speeds(run_dir: Path) -> Speeds | None:
    """The speeds of the run in ``run_dir`` (``run.json`` ``speeds``); None when it has none (a
    simulation, a run stopped before its servers were ready, or a run from before speeds).

    Raises:
        InputError: ``run.json`` is not JSON, or its ``speeds`` are malformed (names the file and the
            field).
    """
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    raw = doc.get(RUN_KEY) if isinstance(doc, dict) else None
    if raw is None:
        return None
    try:
        return Speeds.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"{path}: '{RUN_KEY}' is malformed: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") \
            from None


def _scaled(f: ServiceFigures, r: float, r_handling: float, r_cores: float, note: str) -> ServiceFigures:
    """``f`` with what the simulator draws scaled by ``r`` (the model call) and ``r_handling``
    (the request's handling), and the cluster's share by ``r_cores``; the estimates the dispatcher
    and the admission take from the plan (``expected_ms``, ``busy_mean_ms``) are kept: the run's
    sources and servers used the plan's."""
    return f.model_copy(update={
        "samples_ms": [x * r for x in f.samples_ms], "batch_mean_ms": {b: x * r for b, x in f.batch_mean_ms.items()},
        "wall_mean_ms": f.wall_mean_ms * r, "wall_p95_ms": f.wall_p95_ms * r, "handling_ms": f.handling_ms * r_handling,
        "cores": f.cores * r_cores, "source": f"{f.source} x {note}"})


def _check_profiles(plan: Plan, cluster: str, cs: ClusterSpeed) -> None:
    """Raise unless each model's profiled bare call in ``cs`` is the one ``plan``'s ``cluster``
    serves it with (:func:`speed_target`: its runtime and threads per call, today's profiles).

    Raises:
        PlanError: names the cluster, the model and both figures.
    """
    want = speed_target(plan, cluster, weights={}).profile_ms
    for m, ms in cs.models.items():
        if m in want and not math.isclose(want[m], ms.profile_ms, rel_tol=1e-6):
            raise PlanError(f"the speeds of cluster {cluster!r} hold {m!r} against a profiled call of "
                            f"{ms.profile_ms:.4g} ms, where this plan's server calls it in {want[m]:.4g} ms (another "
                            f"runtime or threads per call, or profiles measured since): they come from a run of "
                            f"another experiment")


def apply_speeds(plan: Plan, speeds: Speeds | None) -> Plan:
    """The plan whose service figures the simulator should use to reproduce a run of ``speeds``
    (None, a run that recorded none: ``plan`` as it is):
    each model's samples (and its batch means) x its residual factor, each request's handling x its
    cluster's :attr:`ClusterSpeed.handling_residual` (with ``mode`` host the residual is the
    measured factor, the handling's own when the run measured it; with ``profile`` what the
    scaling left), and the cluster's share x scale / call_scale (1 unless the host was too slow for
    the calls: then its quota was raised beyond what the calls' speed made up). The dispatcher's
    and the admission's estimates stay the plan's, as the run had them. ``plan`` in emulated time.

    Raises:
        PlanError: ``plan`` is a wall-clock plan, a cluster or model it serves has no speed (names
            it and what the speeds have), or a model's speed was measured against another profiled
            call than this plan's server makes (another runtime or threads per call).
    """
    if plan.clock != "emulated":
        raise PlanError("apply_speeds takes the emulated plan (the simulator's), not a dilated one")
    if speeds is None:
        return plan
    services: dict[str, dict[str, ServiceFigures]] = {}
    for c, by in plan.services.items():
        cs = speeds.clusters.get(c)
        if cs is None:
            raise PlanError(f"the speeds have no cluster {c!r} (they have: {', '.join(speeds.clusters) or 'none'}): "
                            f"they come from a run of another experiment")
        lacking = [m for m in by if m not in cs.models]
        if lacking:
            raise PlanError(f"the speeds of cluster {c!r} have no model {', '.join(map(repr, lacking))} (they have: "
                            f"{', '.join(cs.models)}): they come from a run of another experiment")
        _check_profiles(plan, c, cs)
        services[c] = {m: _scaled(f, cs.models[m].residual, cs.handling_residual, cs.scale / cs.call_scale,
                                  f"speed {cs.models[m].residual:.3f}") for m, f in by.items()}
    note = (f"service samples x each model's residual speed factor of a run (speed: {speeds.mode}), each "
            f"request's handling x its cluster's: "
            + "; ".join(f"{c}: " + ", ".join(f"{m} {ms.residual:.3f}" for m, ms in cs.models.items())
                        + f", handling {cs.handling_residual:.3f}"
                        + (" (not measured: the calls' factor)" if cs.mode == "host" and cs.handling_factor is None
                           else "")
                        for c, cs in speeds.clusters.items() if c in services))
    return plan.model_copy(update={"services": services, "notes": [*plan.notes, note]})


__all__ = ["LEAST_PACED_MS", "MAX_SPEED_FACTOR", "RUN_KEY", "TOLERANCE", "ClusterSpeed", "ModelSpeed", "SpeedMode",
           "SpeedTarget", "Speeds", "apply_speeds", "check_fits", "cluster_speed", "expected_weights",
           "needed_dilation", "read_speeds", "speed_target"]
