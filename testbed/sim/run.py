"""``testbed simulate``'s engine: one experiment through the simulator (:func:`simulate`); its run folder
and summary, in the emulation's layout, are the results layer's (:func:`testbed.results.runs.run_simulation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from testbed.agent.live import SourceSelector, aset_sources, check_agents, source_configs
from testbed.agent.selector import initial_policy
from testbed.plan.build import Plan
from testbed.plan.dilation import with_time_dilation
from testbed.sim.engine import Simulator
from testbed.sim.window import SimWindowStates
from testbed.spec.experiment import AsetSpec, drain_s


@dataclass
class SimOutcome:
    """What a simulation measured: the :class:`~testbed.sim.engine.Simulator` after its run (its
    records, ``seed``, :meth:`~testbed.sim.columns.RunColumns.write_run`), ``duration_s`` (the load,
    simulated s) and ``wall_s`` (the wall-clock time it took, s)."""

    sim: Simulator
    duration_s: float
    wall_s: float
    selector: dict[str, Any] | None = None
    schedule: dict[str, list[str]] | None = None


def simulate(plan: Plan, duration_s: float | None = None, seed: int | None = None,
             policy: str | None = None) -> SimOutcome:
    """Simulate ``plan`` for ``duration_s`` (default: the experiment's), recording every query.

    Queries are created during ``duration_s``; the simulation then continues until every query is
    resolved (deadline + grace), as the emulation's sources wait for their last answers.
    ``policy`` overrides the policy of every source. The sources on ``aset`` are driven by their
    agents (:func:`drive`). Writes nothing (the run folder and its summary:
    :func:`testbed.results.runs.run_simulation`).

    Raises:
        testbed.sim.SimError, testbed.model.arrivals.ArrivalError: bad input, naming the item.
        testbed.core.errors.InputError: an agent that cannot drive a source (:func:`testbed.agent.live.check_agents`).
        testbed.agent.selector.SelectorFailed: a selector raised or returned no policy (exit code 4).
    """
    exp = plan.experiment
    duration_s = duration_s or exp.duration_s
    pols = {s.name: policy for s in plan.sources} if policy else None
    agents = [] if policy else aset_sources(plan)
    record = check_agents(plan, agents) if agents else None
    t_wall = time.perf_counter()
    if record is not None:
        pols = {s: record["initial"].get(s, initial_policy(exp.aset)) for s in record["sources"]}
    sim = Simulator(plan, seed=seed, policies=pols, record=True)
    sim.arrivals_end = duration_s
    schedule = None
    if record is not None:
        schedule = drive(sim, plan, record["sources"], exp.aset, duration_s)
        record["choices"] = {s: _counts(ps) for s, ps in schedule.items()}
    sim.run_until(duration_s + drain_s([a.deadline_ms for a in exp.applications]))
    return SimOutcome(sim, duration_s, time.perf_counter() - t_wall, record, schedule)


def _counts(names: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return out


def drive(sim, plan: Plan, sources: list[str], aset: AsetSpec, duration_s: float,
          on_resolved=None) -> dict[str, list[str]]:
    """THE loop of every agent-driven simulation (``testbed simulate``, ``testbed evaluate``):
    ``sources`` (sorted) each driven by its :class:`~testbed.agent.live.SourceSelector`, built from
    the config the emulation gives that source (in the simulator's time: k = 1), with ``aset`` as
    its agent. At the end of every decision window each source's raw window state
    (:class:`~testbed.sim.window.SimWindowStates`, with ``now_s``, the simulated time) goes to its
    selector, whose answer applies from then on, as in the emulation's source loop (the first
    window runs on :attr:`~testbed.agent.live.SourceSelector.initial`, applied here at the start).
    ``sim`` is run to ``duration_s`` (not drained).

    Args:
        on_resolved: called with each window's resolved queries (``Simulator.drain_resolved``),
            e.g. :meth:`testbed.aset.episode.Episode.count`.

    Returns:
        Per source, its policy for each window after the first (the schedule).

    Raises:
        testbed.core.errors.InputError: an agent that cannot be resolved (:func:`testbed.agent.live.resolve_agent`).
        testbed.agent.selector.SelectorFailed: a selector raised or returned no policy (exit code 4).
    """
    cfgs = source_configs(with_time_dilation(plan, 1.0), sources, aset)
    selectors = [SourceSelector(c) for c in cfgs]
    names = [c.source for c in cfgs]
    window = selectors[0].window_s
    states = SimWindowStates(sim, names, [sorted({o.option.cluster for o in c.options}) for c in cfgs])
    current = [sel.initial for sel in selectors]
    for s, p in zip(names, current, strict=True):
        sim.set_policy(s, p)
    schedule: dict[str, list[str]] = {s: [] for s in names}
    w = 1
    while w * window <= duration_s + 1e-9:
        sim.run_until(w * window)
        resolved = sim.drain_resolved()
        if on_resolved is not None:
            on_resolved(resolved)
        states.absorb(resolved)
        for i, (s, sel) in enumerate(zip(names, selectors, strict=True)):
            current[i] = sel.choose({**states.state(i, current[i]), "now_s": w * window})
            sim.set_policy(s, current[i])
            schedule[s].append(current[i])
        w += 1
    return schedule
