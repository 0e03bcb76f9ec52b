"""``testbed simulate``'s engine: one experiment through the simulator (:func:`simulate`); its run folder
and summary, in the emulation's layout, are the results layer's (:func:`testbed.results.runs.run_simulation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from testbed.plan.build import Plan
from testbed.sim.engine import SimError, Simulator
from testbed.spec.experiment import drain_s


def check_static_policies(plan: Plan, policy: str | None = None) -> None:
    """Every source of ``plan`` runs a static policy (``policy``, the override, or its own).

    ``policy: aset`` is the live selector of an emulation (:mod:`testbed.agent.live`); a plain
    simulation has no agent to pick a policy per window, and used to run such sources on
    ``closest`` while the run said nothing of it.

    Raises:
        SimError: sources on ``aset``, named, with the commands that do simulate ASET.
    """
    if policy is not None:
        return
    exp = plan.experiment
    aset = [s.name for s in exp.sources if (s.policy or exp.policy) == "aset"]
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
    t_wall = time.perf_counter()
    sim = Simulator(plan, seed=seed, policies=pols, record=True, base_dir=base_dir)
    sim.arrivals_end = duration_s
    sim.run_until(duration_s + drain_s([a.deadline_ms for a in exp.applications]))
    return SimOutcome(sim, duration_s, time.perf_counter() - t_wall)
