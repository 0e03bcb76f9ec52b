"""``testbed simulate``'s engine: one experiment through the simulator (:func:`simulate`); its run folder
and summary, in the emulation's layout, are the results layer's (:func:`testbed.results.runs.run_simulation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.agent.selector import (
    SelectorDriver,
    check_plan_selector,
    initial_policy,
    resolve_selector,
    selected_sources,
    selector_window,
)
from testbed.plan.boundaries import SelectorContext
from testbed.plan.build import Plan
from testbed.sim.engine import SimError, Simulator
from testbed.sim.window import SimWindowStates
from testbed.spec.experiment import drain_s


def check_static_policies(plan: Plan, policy: str | None = None) -> None:
    """Every source of ``plan`` runs a static policy (``policy``, the override, or its own).

    ``policy: aset`` is the live selector of an emulation (:mod:`testbed.agent.live`); a plain
    simulation has no agent to pick a policy per window, and used to run such sources on
    ``closest`` while the run said nothing of it. A selector of one's own (``aset.selector``) does
    run here (:func:`simulate`).

    Raises:
        SimError: sources on ``aset``, named, with the commands that do simulate ASET.
    """
    if policy is not None:
        return
    exp = plan.experiment
    selected = set(selected_sources(plan))
    aset = [s.name for s in exp.sources if (s.policy or exp.policy) == "aset" and s.name not in selected]
    if aset:
        raise SimError(f"policy aset ({', '.join(aset)}): a simulation runs static policies only, the ASET selector "
                       f"runs in an emulation (testbed run); to simulate ASET's checkpoint on this scenario, use "
                       f"testbed evaluate with an ASET config that lists it, or give --policy to simulate a static "
                       f"policy")


@dataclass
class SimOutcome:
    """What a simulation measured: the :class:`~testbed.sim.engine.Simulator` after its run (its
    records, ``seed``, :meth:`~testbed.sim.columns.RunColumns.write_run`), ``duration_s`` (the load,
    simulated s) and ``wall_s`` (the wall-clock time it took, s)."""

    sim: Simulator
    duration_s: float
    wall_s: float
    selector: dict[str, Any] | None = None


def simulate(plan: Plan, base_dir: Path | None = None, duration_s: float | None = None, seed: int | None = None,
             policy: str | None = None) -> SimOutcome:
    """Simulate ``plan`` for ``duration_s`` (default: the experiment's), recording every query.

    Queries are created during ``duration_s``; the simulation then continues until every query is
    resolved (deadline + grace), as the emulation's sources wait for their last answers.
    ``policy`` overrides the policy of every source. Writes nothing (the run folder and its
    summary: :func:`testbed.results.runs.run_simulation`).

    Raises:
        testbed.sim.SimError, testbed.model.arrivals.ArrivalError: bad input, naming the item (a source
            on policy ``aset`` without a ``policy`` override: :func:`check_static_policies`).
    """
    exp = plan.experiment
    duration_s = duration_s or exp.duration_s
    pols = {s.name: policy for s in plan.sources} if policy else None
    check_static_policies(plan, policy)
    record = check_plan_selector(plan) if policy is None else None
    t_wall = time.perf_counter()
    if record is not None:
        pols = dict.fromkeys(record["sources"], initial_policy(exp.aset))
    sim = Simulator(plan, seed=seed, policies=pols, record=True, base_dir=base_dir)
    sim.arrivals_end = duration_s
    if record is not None:
        record["choices"] = _run_selected(sim, plan, record["sources"], duration_s)
    sim.run_until(duration_s + drain_s([a.deadline_ms for a in exp.applications]))
    return SimOutcome(sim, duration_s, time.perf_counter() - t_wall, record)


def _run_selected(sim: Simulator, plan: Plan, sources: list[str], duration_s: float) -> dict[str, dict[str, int]]:
    """Run ``sim`` to ``duration_s`` with ``sources`` driven by the experiment's selector: at the
    end of every window (the selector's, a whole number of report intervals) each source's window
    state (:class:`~testbed.sim.window.SimWindowStates`) goes to its own
    :class:`~testbed.agent.selector.SelectorDriver`, whose answer applies from then on, as in the
    emulation's source loop (the first window runs on the initial policy). Returns, per source,
    how many windows each policy was chosen.

    Raises:
        testbed.agent.selector.SelectorFailed: a selector raised or returned no policy (exit code 4).
    """
    aset = plan.experiment.aset
    window = selector_window(aset, plan.experiment.report_interval_s)
    resolved = resolve_selector(aset.selector)
    ctxs = [SelectorContext.from_plan(plan, s) for s in sources]
    drivers = [SelectorDriver(resolved, c, window) for c in ctxs]
    states = SimWindowStates(sim, sources, [c.clusters for c in ctxs])
    current = [initial_policy(aset)] * len(sources)
    w = 1
    while w * window <= duration_s + 1e-9:
        sim.run_until(w * window)
        states.absorb(sim.drain_resolved())
        for i, (s, d) in enumerate(zip(sources, drivers, strict=True)):
            current[i] = d.choose(states.state(i, current[i]))
            sim.set_policy(s, current[i])
        w += 1
    return {s: dict(d.choices) for s, d in zip(sources, drivers, strict=True)}
