"""``testbed simulate``'s engine: one experiment through the simulator (:func:`simulate`); its run folder
and summary, in the emulation's layout, are the results layer's (:func:`testbed.results.runs.run_simulation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.agent.live import LivePolicySelector
from testbed.agent.selector import (
    SelectorDriver,
    check_plan_selector,
    initial_policy,
    resolve_selector,
    selected_sources,
)
from testbed.plan.boundaries import SelectorContext, SourceConfig
from testbed.plan.build import Plan
from testbed.plan.dilation import with_time_dilation
from testbed.sim.engine import SimError, Simulator
from testbed.sim.window import SimWindowStates
from testbed.spec.experiment import drain_s


def checkpoint_sources(plan: Plan, policy: str | None = None) -> list[str]:
    """The sources of ``plan`` on policy ``aset`` that its checkpoint drives (``aset.checkpoint``,
    by default the general agent, :data:`testbed.spec.experiment.DEFAULT_ASET_CHECKPOINT`), sorted:
    none with a ``policy`` override or a selector of one's own (``aset.selector``)."""
    if policy is not None:
        return []
    exp = plan.experiment
    selected = set(selected_sources(plan))
    return sorted(s.name for s in exp.sources if (s.policy or exp.policy) == "aset" and s.name not in selected)


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
        testbed.sim.SimError, testbed.model.arrivals.ArrivalError: bad input, naming the item (a
            checkpoint that does not fit a source on ``aset``: :func:`checkpoint_sources`).
        testbed.agent.selector.SelectorFailed: a selector raised or returned no policy (exit code 4).
    """
    exp = plan.experiment
    duration_s = duration_s or exp.duration_s
    pols = {s.name: policy for s in plan.sources} if policy else None
    record = check_plan_selector(plan) if policy is None else None
    agents = checkpoint_sources(plan, policy)
    if agents:  # the checkpoint's selector, as in the emulation's sources (it checks the checkpoint fits)
        record = _checkpoint_record(plan, agents, duration_s)
    t_wall = time.perf_counter()
    if record is not None:
        pols = dict.fromkeys(record["sources"], initial_policy(exp.aset))
    sim = Simulator(plan, seed=seed, policies=pols, record=True, base_dir=base_dir)
    sim.arrivals_end = duration_s
    if record is not None:
        drivers, clusters = record.pop("drivers", None), record.pop("clusters", None)
        if drivers is None:
            drivers, clusters = _selector_drivers(plan, record)
        record["choices"] = _run_driven(sim, record["sources"], drivers, clusters, record["window_s"], exp.aset,
                                        duration_s)
    sim.run_until(duration_s + drain_s([a.deadline_ms for a in exp.applications]))
    return SimOutcome(sim, duration_s, time.perf_counter() - t_wall, record)


def _checkpoint_record(plan: Plan, sources: list[str], duration_s: float) -> dict[str, Any]:
    """The selectors of checkpoint-driven ``sources``: :class:`testbed.agent.live.LivePolicySelector`,
    built from each source's config as an emulated source builds it, in emulated time (the
    simulator's clock: k = 1, :func:`testbed.plan.dilation.with_time_dilation`; the window: ``aset.window_s``,
    default the checkpoint's); ``run.json``'s record, its ``drivers`` taken out by :func:`simulate`.

    Raises:
        SimError: the checkpoint is missing, corrupt or does not fit a source (the selector's
            message, naming it).
    """
    exp = plan.experiment
    drivers, clusters = [], []
    for s in sources:
        cfg = SourceConfig.from_plan(with_time_dilation(plan, 1.0), s, 0, duration_s, Path("."))
        try:
            drivers.append(LivePolicySelector(cfg.model_copy(update={"records": ""})))
        except (KeyError, OSError, ValueError) as exc:
            raise SimError(f"source {s} on aset: {exc}") from exc
        clusters.append(sorted({o.option.cluster for o in cfg.options}))
    window = (exp.aset.window_s if exp.aset is not None and exp.aset.window_s else None) or drivers[0].window_s
    ckpt = exp.aset.checkpoint if exp.aset is not None else None
    return {"kind": "checkpoint", "checkpoint": ckpt, "policies": list(drivers[0].policies), "window_s": window,
            "sources": sources, "drivers": drivers, "clusters": clusters}


def _selector_drivers(plan: Plan, record: dict[str, Any]) -> tuple[list[SelectorDriver], list[list[str]]]:
    """One :class:`~testbed.agent.selector.SelectorDriver` of ``aset.selector`` per source of
    ``record`` (:func:`~testbed.agent.selector.check_plan_selector`'s), and each one's clusters."""
    resolved = resolve_selector(plan.experiment.aset.selector)
    ctxs = [SelectorContext.from_plan(plan, s) for s in record["sources"]]
    return [SelectorDriver(resolved, c, record["window_s"]) for c in ctxs], [list(c.clusters) for c in ctxs]


def _run_driven(sim: Simulator, sources: list[str], drivers: list, clusters: list[list[str]], window: float, aset,
                duration_s: float) -> dict[str, dict[str, int]]:
    """Run ``sim`` to ``duration_s`` with ``sources`` driven by ``drivers`` (one per source, each with
    ``choose(state) -> policy name`` and ``choices``): at the end of every ``window`` (s) each
    source's window state (:class:`~testbed.sim.window.SimWindowStates`, with ``now_s``, the
    simulated time) goes to its driver, whose answer applies from then on, as in the emulation's
    source loop (the first window runs on the initial policy). Returns, per source, how many
    windows each policy was chosen.

    Raises:
        testbed.agent.selector.SelectorFailed: a selector raised or returned no policy (exit code 4).
    """
    states = SimWindowStates(sim, sources, clusters)
    current = [initial_policy(aset)] * len(sources)
    w = 1
    while w * window <= duration_s + 1e-9:
        sim.run_until(w * window)
        states.absorb(sim.drain_resolved())
        for i, (s, d) in enumerate(zip(sources, drivers, strict=True)):
            current[i] = d.choose({**states.state(i, current[i]), "now_s": w * window})
            sim.set_policy(s, current[i])
        w += 1
    return {s: dict(d.choices) for s, d in zip(sources, drivers, strict=True)}
