"""Time dilation: the emulated system run k times slower than the wall clock, and its
measurements brought back to emulated time.

With ``emulation.time_dilation`` k (>= 1), the emulation runs the plan :func:`dilate` returns: every
time constant of the emulated system is multiplied by k and every rate divided by k, so that the
emulator's own costs (datapath, link emulators, Python processes) shrink by k in the emulated
system's time (Gupta et al., "To Infinity and Beyond: Time-Warped Network Emulation", NSDI 2006;
DieCast, NSDI 2008). :func:`dilate` is the one place the constants are scaled; the boundary files
(:mod:`testbed.plan.boundaries`), the network (links, HTB, netem), the controller and the event
runner are all built from its result, so each constant is scaled exactly once.

What :func:`dilate` scales (x k: times; / k: rates; the rest unchanged):

======================================  =======  =================================================
field                                   scale    why
======================================  =======  =================================================
``duration_s``, ``report_interval_s``   x k      load length, stats polling of the sources
applications' ``deadline_ms``           x k      the source's timeout, the dispatcher's test
``aset.window_s``                       x k      the agent's decision window
``emulation.stats_interval_s``          x k      controller port stats, servers' stats files
servers' ``max_queue_delay_ms``         x k      batching wait
``capture.start_delay_s``               x k      when the capture starts
links' and paths' delays (ms)           x k      propagation delays (link emulator, netem)
links' and hosts' ``bandwidth_mbps``    / k      the shapers' rates (link emulator, HTB)
service figures (every ``*_ms``)        x k      model calls run at 1/k core speed (cgroups)
events' ``t_s``; values in ms           x k      when, and delays set by ``link_delay``
events' values in Mbit/s                / k      ``link_bandwidth``, ``link_congestion``
======================================  =======  =================================================

The clusters' CPU: at one core or more, nested cgroups (:func:`nested_cpu`); below, the server pads
each call and each request's handling by (k - 1) x its CPU time (:func:`cpu_pad`). With
``emulation.speed: profile`` both also make up for the host's speed: k / s instead of k, s being
the host's bare call over the profile's (:mod:`testbed.plan.speeds`).

Not scaled, on purpose: the workload's arrival processes (the sources draw them in emulated time,
from the same seeds as the simulator, and stretch the times by k: :class:`Stretched`); the ASET
window (the agent checks it against its checkpoint's; the source waits k x it); the RTT
self-check's tolerances (it judges emulated values: :func:`testbed.emu.selfcheck.check_rtts`
divides what it measures by k); loss, sizes, counts, CPU shares (the cluster's CPU is slowed by
cgroups or padding, :func:`nested_cpu`); the simulator's settings; a source's wait for the load's
start (``go_timeout_s``: the run's own wall-clock bound, set from its k by :mod:`testbed.emu.load`).
TCP's minimum retransmission timeout is :func:`rto_min_ms`.

Every conversion between the clocks is a method of one object, :class:`testbed.core.clock.EmulatedClock`
(:func:`wall_clock` gives a wall-clock plan's): :func:`dilate` scales with it, and measured times go
back to emulated time with it in one place per kind of measurement: a source's records
(:mod:`testbed.emu.source`, before it builds each record), the RTT self-check, and the events'
read-back.
"""

from __future__ import annotations

import numpy as np

from testbed.core.clock import UNIT_SCALE, EmulatedClock
from testbed.model.arrivals import ArrivalProcess
from testbed.model.network import TCP_RTO_MIN_MS
from testbed.model.service import ServiceFigures
from testbed.model.timeline import Change, kind_of
from testbed.plan.resolved import Plan, PlanError
from testbed.spec.experiment import AUTO_DILATION, MAX_TIME_DILATION


def scale_of(unit: str, k: float) -> float:
    """The factor a value in ``unit`` is multiplied by under dilation k (k, 1/k or 1):
    :meth:`testbed.core.clock.EmulatedClock.scale`.

    Raises:
        KeyError: a unit with no rule (a new event kind must say how its value dilates).
    """
    return EmulatedClock(k).scale(unit)


def check_dilation(k: float) -> float:
    """``k`` as a float when it is a valid time dilation (1 .. MAX_TIME_DILATION).

    Raises:
        PlanError: naming the value and the bound.
    """
    k = float(k)
    if not 1.0 <= k <= MAX_TIME_DILATION:
        raise PlanError(f"time dilation {k:g} is outside 1 .. {MAX_TIME_DILATION:g} (k is how many times slower "
                        f"than real time the run goes: at most {MAX_TIME_DILATION:g}, where a 40 s run already "
                        f"takes over an hour; at least 1)")
    return k


def with_time_dilation(plan: Plan, k: float | str) -> Plan:
    """``plan`` with ``emulation.time_dilation`` = k (``testbed run --time-dilation``), or ``auto``
    (chosen when the emulation runs: :mod:`testbed.emu.autodilate`).

    Raises:
        PlanError: k out of range, or ``plan`` is already a wall-clock plan.
    """
    if plan.clock != "emulated":
        raise PlanError("the time dilation is set on the emulated plan, before it is dilated")
    k = AUTO_DILATION if k == AUTO_DILATION else check_dilation(k)
    exp = plan.experiment
    emulation = exp.emulation.model_copy(update={"time_dilation": k})
    return plan.model_copy(update={"experiment": exp.model_copy(update={"emulation": emulation})})


def _service(f: ServiceFigures, c: EmulatedClock) -> ServiceFigures:
    w = c.wall
    return f.model_copy(update={
        "samples_ms": [w(x) for x in f.samples_ms], "batch_mean_ms": {b: w(x) for b, x in f.batch_mean_ms.items()},
        "wall_mean_ms": w(f.wall_mean_ms), "wall_p95_ms": w(f.wall_p95_ms), "expected_ms": w(f.expected_ms),
        "busy_mean_ms": w(f.busy_mean_ms), "handling_ms": w(f.handling_ms), "answer_ms": w(f.answer_ms)})


def _change(ch: Change, c: EmulatedClock) -> Change:
    return ch.model_copy(update={"t_s": c.wall(ch.t_s), "value": c.wall_value(ch.value, kind_of(ch.kind).unit or "")})


def _experiment(plan: Plan, c: EmulatedClock):
    exp, w = plan.experiment, c.wall
    apps = [a.model_copy(update={"deadline_ms": w(a.deadline_ms)}) for a in exp.applications]
    clusters = [cl.model_copy(update={"server": cl.server.model_copy(
        update={"max_queue_delay_ms": w(cl.server.max_queue_delay_ms)})}) for cl in exp.clusters]
    update = {"duration_s": w(exp.duration_s), "report_interval_s": w(exp.report_interval_s),
              "applications": apps, "clusters": clusters,
              "emulation": exp.emulation.model_copy(update={"stats_interval_s": w(exp.emulation.stats_interval_s)})}
    if exp.capture is not None:
        update["capture"] = exp.capture.model_copy(update={"start_delay_s": w(exp.capture.start_delay_s)})
    return exp.model_copy(update=update)


def nested_cpu(cores: float) -> bool:
    """Whether a cluster of ``cores`` is slowed by nested cgroups (each thread capped at 1 / k core
    under the cluster's quota, :func:`testbed.core.cgroups.cap_threads`): at one core or more. Below
    one core cgroup v1 refuses a child whose quota/period exceeds its parent's (c / k < 1 / k:
    ``tg_cfs_schedulable_down`` in kernel/sched/core.c returns EINVAL), so there the server pads
    each model call and each request's handling with a sleep of (k - 1) x its CPU time instead
    (``ServerConfig.cpu_pad``): on the wall clock the work takes k x its CPU time, inside the same
    cluster quota."""
    return cores >= 1.0


def cpu_pad(plan: Plan, cores: float) -> float:
    """``ServerConfig.cpu_pad`` of a cluster of ``cores`` in a wall-clock plan: k - 1 when it is
    dilated by padding (:func:`nested_cpu`), else 0."""
    c = EmulatedClock(plan.time_dilation) if plan.clock == "wall" else EmulatedClock()
    return 0.0 if not c.dilated or nested_cpu(cores) else c.wall(1.0) - 1.0


def _check_padded_runtimes(plan: Plan, k: float) -> None:
    """A padded cluster times each call by its worker thread's CPU clock, which a TensorFlow call
    (run on TensorFlow's own pool threads) does not reach: the server reads the process's CPU
    clock for those, which is the call's alone only with one worker. Padded: under time dilation,
    and with ``emulation.speed: profile`` (:mod:`testbed.plan.speeds`) at any k.

    Raises:
        PlanError: naming the cluster and the model.
    """
    speed = plan.experiment.emulation.speed == "profile"
    if k == 1.0 and not speed:
        return
    why = f"time dilation {k:g}" if k != 1.0 else "emulation.speed: profile"
    alt = "" if k != 1.0 else ", or set emulation.speed: host"
    for c in plan.experiment.clusters:
        if nested_cpu(c.cpu_cores) or c.workers == 1:
            continue
        for m in c.models:
            if c.server.runtime_of(m) != "litert":
                raise PlanError(f"clusters.{c.name}: {why} of a cluster under one core pads each "
                                f"model call by its CPU time; a {c.server.runtime_of(m)} call of {m!r} runs on "
                                f"TensorFlow's own threads, whose CPU is the call's alone only with one worker "
                                f"(this cluster has {c.workers}): serve it with runtime litert, use workers: 1, or "
                                f"give the cluster cpu_cores >= 1{alt}")


def dilate(plan: Plan) -> Plan:
    """The plan the emulation runs on the wall clock at k = ``plan.time_dilation`` (module table):
    ``clock`` ``wall``, its :attr:`~testbed.plan.resolved.Plan.emulated` the plan given. At k = 1
    the figures are the plan's own.

    Raises:
        PlanError: ``plan`` is already a wall-clock plan (a constant would be scaled twice).
    """
    if plan.clock != "emulated":
        raise PlanError("the plan is already dilated (clock: wall); dilating it again would scale every constant twice")
    if plan.dilation_auto:
        raise PlanError("time dilation auto is chosen before the emulation is built (testbed.emu.autodilate.choose; "
                        "testbed.results.runs.run_emulation does it)")
    k = check_dilation(plan.time_dilation)
    _check_padded_runtimes(plan, k)
    c = EmulatedClock(k)
    wall = plan.model_copy(update={
        "experiment": _experiment(plan, c),
        "links": [lk.model_copy(update={"delay_ms": c.wall(lk.delay_ms),
                                        "bandwidth_mbps": c.wall_rate(lk.bandwidth_mbps)}) for lk in plan.links],
        "hosts": [h.model_copy(update={"bandwidth_mbps": c.wall_rate(h.bandwidth_mbps)}) for h in plan.hosts],
        "paths": [p.model_copy(update={"one_way_ms": c.wall(p.one_way_ms)}) for p in plan.paths],
        "services": {cl: {m: _service(f, c) for m, f in by.items()} for cl, by in plan.services.items()},
        "changes": [_change(ch, c) for ch in plan.changes],
        "clock": "wall"})
    wall._emulated = plan
    return wall


def wall_clock(plan: Plan) -> EmulatedClock:
    """The :class:`~testbed.core.clock.EmulatedClock` of a wall-clock plan (what its boundary files
    are built from; k = 1 for an undilated one).

    Raises:
        PlanError: an emulated plan with k != 1: its constants are not dilated yet (build the
            boundary files from :func:`dilate`'s result).
    """
    if plan.clock == "wall":
        return EmulatedClock(plan.time_dilation)
    if plan.time_dilation != 1.0:
        raise PlanError(f"the plan has time dilation {plan.time_dilation:g} but is in emulated time: the "
                        f"emulation's processes get testbed.plan.dilation.dilate(plan)")
    return EmulatedClock()


def wall_factor(plan: Plan) -> float:
    """k of :func:`wall_clock` (the same checks)."""
    return wall_clock(plan).k


def rto_min_ms(clock: EmulatedClock) -> float:
    """TCP's minimum retransmission timeout on the wall clock of ``clock`` (ms): Linux's 200 ms
    (:data:`testbed.model.network.TCP_RTO_MIN_MS`) dilated, so that loss recovery keeps its
    emulated timing (set per route, ``ip route ... rto_min``)."""
    return clock.wall(TCP_RTO_MIN_MS)


class Stretched(ArrivalProcess):
    """An arrival process in emulated time played on the wall clock of ``clock``:
    ``times(a, b) = wall(inner.times(emulated(a), emulated(b)))`` (s). The inner process draws
    exactly what it draws undilated (same seeds, same windows: the simulator's arrivals), only later."""

    def __init__(self, inner: ArrivalProcess, clock: EmulatedClock):
        super().__init__(inner.rng)
        self.inner, self.clock = inner, clock
        self.mean_rate_qps = clock.wall_rate(inner.mean_rate_qps)

    def times(self, start_s: float, end_s: float) -> np.ndarray:
        c = self.clock
        return c.wall(self.inner.times(c.emulated(start_s), c.emulated(end_s)))

    def reseed(self, rng: np.random.Generator, now_s: float) -> None:
        self.inner.reseed(rng, self.clock.emulated(now_s))


__all__ = ["UNIT_SCALE", "EmulatedClock", "Stretched", "check_dilation", "cpu_pad", "dilate", "nested_cpu",
           "rto_min_ms", "scale_of", "wall_clock", "wall_factor", "with_time_dilation"]
