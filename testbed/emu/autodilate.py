"""``--time-dilation auto``: the smallest time dilation k this machine can carry the experiment at.

The rule (our choice, stated): on the wall clock, the CPU an emulation needs is the per-query CPU
of every process on a query's path (the testbed's own: Open vSwitch, link emulators, sources,
controller, run process; and the inference servers' request handling and model calls) times the
emulated query rate, divided by k. k is the smallest value (a multiple of :data:`K_STEP`, 1 ..
:data:`~testbed.spec.experiment.MAX_TIME_DILATION`) that keeps

- that CPU at most :data:`MAX_BUSY_FRACTION` of the cores idle now (other jobs' load, measured
  over :data:`IDLE_SAMPLE_S` from ``/proc/stat``, is taken as staying), and
- Open vSwitch's share at most :data:`MAX_BUSY_FRACTION` of one core (its user-space datapath
  forwards every packet in one thread).

Below half busy, a process that wakes finds a free CPU at least half the time, and the mean wait
for one stays below its own service time (M/M/1: wait / service = rho / (1 - rho) <= 1 at
rho = 0.5).

Where the figures come from:

- per-query CPU per role: the newest emulated run on this machine (``summary.json``'s
  ``machine_cpu``, :mod:`testbed.emu.machine`) under the experiment's ``runs_dir``, preferring one
  of the same experiment, with at least :data:`MIN_REFERENCE_QUERIES` queries; without one,
  :data:`DEFAULT_QUERY_CPU_MS` (measured here: see its comment);
- the inference servers' part is scaled by the bare model call's speed now against that run's
  (``host_speed.json``; :func:`testbed.serve.handling.host_speed`);
- the emulated query rate: the plan's arrival processes' mean rates with the spatial weights.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testbed.core.clock import EmulatedClock
from testbed.core.errors import InputError
from testbed.core.util import repo_path
from testbed.emu.machine import machine_ticks
from testbed.plan.build import Plan
from testbed.plan.traces import arrival_process
from testbed.serve.handling import host_speed
from testbed.spec.experiment import MAX_TIME_DILATION

#: The busy fraction k keeps the machine's idle cores (and Open vSwitch's one thread) under.
MAX_BUSY_FRACTION = 0.5
#: Fewer idle cores than this (other jobs' load) and ``auto`` refuses to choose.
MIN_IDLE_CORES = 0.1
#: k is chosen in steps of this.
K_STEP = 0.5
#: How long (s) the machine's idle cores are sampled.
IDLE_SAMPLE_S = 1.0
#: A reference run needs at least this many queries.
MIN_REFERENCE_QUERIES = 100
#: Per-query CPU (ms) by role when no reference run exists: ``testbed run experiments/default.yaml``
#: on this 2-core machine, 803 queries in 40 s (runs 20261204-184719 and -185346): Open vSwitch
#: 0.227-0.249 cores, link emulators 0.064-0.071, sources 0.050-0.072, controller and run process
#: 0.025-0.028, inference servers 0.211-0.219, i.e. x 40 s / 803 queries (the higher of the two).
DEFAULT_QUERY_CPU_MS = {"ovs-vswitchd": 12.4, "link emulators": 3.5, "sources": 3.6, "controller": 0.4,
                        "run process": 1.0, "inference servers": 10.9}
#: Roles that are the inference servers (scaled by the model call's speed).
SERVER_ROLES = ("inference servers",)


@dataclass
class AutoDilation:
    """What ``auto`` measured and chose: ``k``; ``rate_qps`` (emulated q/s); ``query_cpu_ms`` per
    role; ``reference`` (the run they come from, or ``default``); ``call_speed`` (bare model call
    now / in the reference run); ``cpus`` and ``idle_cores`` (measured now); ``needed_cores`` at k = 1;
    ``why`` (one line per reason)."""

    k: float
    rate_qps: float
    query_cpu_ms: dict[str, float]
    reference: str
    call_speed: float
    cpus: int
    idle_cores: float
    needed_cores: float
    why: list[str] = field(default_factory=list)


def idle_cores(sample_s: float = IDLE_SAMPLE_S) -> tuple[int, float]:
    """(online CPUs, mean idle cores over ``sample_s`` s now), from ``/proc/stat`` (busy and steal)."""
    cpus = os.cpu_count() or 1
    b0, s0 = machine_ticks()
    t0 = time.monotonic()
    time.sleep(sample_s)
    b1, s1 = machine_ticks()
    used = ((b1 - b0) + (s1 - s0)) / (time.monotonic() - t0)
    return cpus, max(0.0, cpus - used)


def emulated_rate_qps(plan: Plan) -> float:
    """The plan's mean query rate (q/s, emulated): each workload entry's arrival process at each
    source it selects, with the source's spatial weight (a step process counts its highest rate)."""
    rng = np.random.default_rng(0)
    return sum(arrival_process(w, rng, weight, Path(plan.base_dir)).mean_rate_qps
               for wi, w in enumerate(plan.experiment.workload) for weight in plan.weights[wi].values())


def _reference(runs_dir: Path, name: str) -> tuple[str, dict[str, float], float | None] | None:
    """The newest emulated run under ``runs_dir`` with ``machine_cpu`` and enough queries (one of
    experiment ``name`` first): (its folder name, per-query CPU ms per role, its bare call ms)."""
    found = []
    for d in sorted(runs_dir.glob("*"), reverse=True) if runs_dir.is_dir() else []:
        try:
            s = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        m, n = s.get("machine_cpu") or {}, int(s.get("queries") or 0)
        if s.get("mode") == "simulation" or not m.get("by_role") or n < MIN_REFERENCE_QUERIES:
            continue
        # mean cores over the load's wall-clock window (under dilation too): CPU s = cores x window
        per = {role: cores * float(m["window_s"]) / n * 1e3 for role, cores in m["by_role"].items() if role != "other"}
        try:
            call = float(json.loads((d / "host_speed.json").read_text())["now_ms"])
        except (OSError, ValueError, KeyError, TypeError):
            call = None
        found.append((d.name.endswith(f"-{name}"), d.name, per, call))
    if not found:
        return None
    same = [f for f in found if f[0]]
    _, ref, per, call = (same or found)[0]
    return ref, per, call


def needed_cores(plan: Plan, per: dict[str, float], rate: float) -> tuple[float, float]:
    """(cores the emulation needs at k = 1, cores of Open vSwitch's one thread) for ``rate``
    emulated q/s at ``per`` CPU ms per query and role (the clusters' part capped at their shares)."""
    cluster_cores = sum(c.cpu_cores for c in plan.experiment.clusters)
    servers = min(cluster_cores, rate * sum(ms for r, ms in per.items() if r in SERVER_ROLES) / 1e3)
    needed = rate * sum(ms for r, ms in per.items() if r not in SERVER_ROLES) / 1e3 + servers
    return needed, rate * per.get("ovs-vswitchd", 0.0) / 1e3


def smallest_k(needed: float, ovs: float, idle: float) -> float:
    """The smallest k (>= 1, not rounded) keeping ``needed`` cores within MAX_BUSY_FRACTION of
    ``idle`` cores and Open vSwitch's thread (``ovs`` cores) within MAX_BUSY_FRACTION of one."""
    return max(1.0, needed / (MAX_BUSY_FRACTION * max(idle, 1e-9)), ovs / MAX_BUSY_FRACTION)


def k_for(plan: Plan, idle: float) -> tuple[float | None, str]:
    """The k (a multiple of K_STEP) at which ``idle`` cores carry ``plan``'s load by the rule of
    :func:`choose`, without measuring anything (per-query CPU from the newest reference run, else
    :data:`DEFAULT_QUERY_CPU_MS`; model calls at the reference's speed): (k, or None above the
    largest; a line saying why)."""
    rate = emulated_rate_qps(plan)
    ref = _reference(repo_path(plan.experiment.runs_dir), plan.experiment.name)
    reference, per = ("default", dict(DEFAULT_QUERY_CPU_MS)) if ref is None else ref[:2]
    needed, ovs = needed_cores(plan, per, rate)
    k = math.ceil(smallest_k(needed, ovs, idle) / K_STEP - 1e-9) * K_STEP
    why = (f"{rate:.1f} q/s emulated x CPU per query of {reference}: {needed:.2f} cores at k = 1, Open vSwitch "
           f"{ovs:.2f} of its thread, on {max(idle, 0):.2f} idle cores")
    return (k if k <= MAX_TIME_DILATION else None), why


def choose(plan: Plan, console=None, idle: float | None = None) -> AutoDilation:
    """Measure the machine and choose k for ``plan`` (module docstring); prints the choice and why
    on ``console`` when given. ``idle``: the idle cores to assume instead of measuring them (e.g.
    the machine's cores: the k for this machine idle).

    Raises:
        InputError: other jobs leave less than :data:`MIN_IDLE_CORES` idle, or no k up to the
            largest keeps the machine within the bound (names the figures).
    """
    rate = emulated_rate_qps(plan)
    ref = _reference(repo_path(plan.experiment.runs_dir), plan.experiment.name)
    reference, per, ref_call = ("default", dict(DEFAULT_QUERY_CPU_MS), None) if ref is None else ref
    models = {m: c.server.runtime_of(m) for c in plan.experiment.clusters for m in c.models}
    speed = host_speed(plan.zoo_dir, plan.profiles_dir, models) if ref_call else {}
    call_speed = speed["now_ms"] / ref_call if speed and ref_call else 1.0
    per = {r: ms * (call_speed if r in SERVER_ROLES else 1.0) for r, ms in per.items()}
    cpus, measured = idle_cores()
    idle = measured if idle is None else float(idle)
    if idle < MIN_IDLE_CORES:
        raise InputError(f"time dilation auto: other jobs keep this machine's {cpus} cores busy ({idle:.2f} idle "
                         f"over {IDLE_SAMPLE_S:g} s, at least {MIN_IDLE_CORES:g} needed): no k can keep the "
                         f"emulation within {MAX_BUSY_FRACTION:.0%} of nothing; give --time-dilation K")
    cluster_cores = sum(c.cpu_cores for c in plan.experiment.clusters)
    needed, ovs = needed_cores(plan, per, rate)
    k_raw = smallest_k(needed, ovs, idle)
    k = math.ceil(k_raw / K_STEP - 1e-9) * K_STEP
    why = [f"emulated load {rate:.1f} q/s; CPU per query from {reference}: "
           + ", ".join(f"{r} {ms:.1f} ms" for r, ms in sorted(per.items()) if ms >= 0.05)
           + (f" (model calls x {call_speed:.2f}: the bare call now against then)" if ref_call else ""),
           f"needed at k = 1: {needed:.2f} cores (clusters' part capped at their {cluster_cores:g} cores), Open "
           f"vSwitch {ovs:.2f} of its one thread; idle now {idle:.2f} of {cpus} cores",
           f"k = {k:g}: the smallest multiple of {K_STEP:g} keeping the emulation's CPU at most "
           f"{MAX_BUSY_FRACTION:.0%} of the idle cores ({EmulatedClock(k).wall_rate(needed):.2f} of {idle:.2f}) and "
           f"Open vSwitch's thread at most {MAX_BUSY_FRACTION:.0%} busy ({EmulatedClock(k).wall_rate(ovs):.2f})"]
    if k > MAX_TIME_DILATION:
        raise InputError(f"time dilation auto: k would be {k_raw:.1f}, above the largest, {MAX_TIME_DILATION:g}: "
                         + "; ".join(why[:2]) + "; lower the load, or run on a larger or idler machine")
    out = AutoDilation(k, rate, per, reference, call_speed, cpus, idle, needed, why)
    if console is not None:
        console.print(f"time dilation auto: k = {k:g}", markup=False, highlight=False)
        for line in why:
            console.print(f"  {line}", markup=False, highlight=False)
    return out


__all__ = ["DEFAULT_QUERY_CPU_MS", "MAX_BUSY_FRACTION", "AutoDilation", "choose", "emulated_rate_qps", "idle_cores",
           "k_for", "needed_cores", "smallest_k"]
