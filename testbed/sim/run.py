"""``testbed simulate``: one experiment through the simulator, results in the emulation's layout."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console

from testbed.core.util import repo_path, write_json_atomic
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


def simulate_experiment(plan: Plan, base_dir: Path | None = None, runs_dir: Path | None = None,
                        duration_s: float | None = None, seed: int | None = None, policy: str | None = None,
                        run_dir: Path | None = None, console: Console | None = None,
                        quiet: bool = False) -> tuple[Path, dict]:
    """Simulate ``plan`` for ``duration_s`` (default: the experiment's) and write its run directory.

    Queries are created during ``duration_s``; the simulation then continues until every query is
    resolved (deadline + grace), as the emulation's sources wait for their last answers.
    ``policy`` overrides the policy of every source. Returns (run directory, summary dict).

    The run directory is written whole or not at all (:func:`_write_whole`): a full or unwritable
    disk leaves nothing that looks like a finished run.

    Raises:
        testbed.sim.SimError, testbed.model.arrivals.ArrivalError: bad input, naming the item (a source
            on policy ``aset`` without a ``policy`` override: :func:`check_static_policies`).
        testbed.core.errors.RunFailure: the run directory cannot be written (exit code 3; names it and
            the reason; nothing is left there).
    """
    from testbed.results.summary import print_summary

    exp = plan.experiment
    duration_s = duration_s or exp.duration_s
    pols = {s.name: policy for s in plan.sources} if policy else None
    check_static_policies(plan, policy)
    t_wall = time.perf_counter()
    sim = Simulator(plan, seed=seed, policies=pols, record=True, base_dir=base_dir)
    sim.arrivals_end = duration_s
    sim.run_until(duration_s + drain_s([a.deadline_ms for a in exp.applications]))
    wall = time.perf_counter() - t_wall
    if run_dir is None:
        base = Path(runs_dir) if runs_dir else repo_path(exp.runs_dir)
        tag = f"-{policy}" if policy else ""
        run_dir = base / f"{datetime.now():%Y%m%d-%H%M%S}-{exp.name}{tag}-sim-s{sim.seed}"
    n = len(sim.queries_recorded)
    s = _write_whole(sim, Path(run_dir), duration_s, wall)
    if not quiet:
        console = console or Console()
        print_summary(s, console)
        console.print(f"simulated {duration_s:g} s, {n} queries in {wall:.2f} s wall; run directory: {run_dir}")
    return run_dir, s


def _write_whole(sim: Simulator, run_dir: Path, duration_s: float, wall_s: float) -> dict:
    """Write the simulated run (records, ``run.json``, ``summary.json``, ``summary.md``) into a
    hidden sibling of ``run_dir`` and rename it to ``run_dir`` once everything is written; an
    earlier simulated run of the same name is replaced. Returns the summary.

    Raises:
        testbed.core.errors.RunFailure: a write failed (a full disk, no permission), or ``run_dir``
            exists and is not a simulated run directory (exit code 3; the partial copy is removed).
    """
    import shutil

    from testbed.core.errors import EXIT_BRINGUP, RunFailure
    from testbed.results.summary import print_summary, summarize

    _check_replaceable(run_dir)
    tmp = run_dir.with_name(f".{run_dir.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        sim.write_run(tmp, {"simulated_s": duration_s, "wall_s": round(wall_s, 3), "queries": len(sim.queries_recorded),
                            "status": "ok"})
        s = summarize(tmp, duration_s)
        s["mode"] = "simulation"
        s["cold_rule"] = "simulated: the simulator models no TCP connection, so no query opens one (cold = 0 for all)"
        s["timings_s"] = {"wall_s": round(wall_s, 3)}
        write_json_atomic(tmp / "summary.json", s, indent=2)
        print_summary(s, Console(quiet=True), tmp)  # summary.md
        if run_dir.exists():
            shutil.rmtree(run_dir)
        os.rename(tmp, run_dir)
    except (OSError, RunFailure) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = exc if isinstance(exc, OSError) else exc.__cause__  # the merge's RunFailure wraps its OSError
        why = getattr(cause, "strerror", None) or str(cause or exc)
        raise RunFailure(f"cannot write the simulated run {run_dir}: {why}; nothing was left there (free space or "
                         f"choose another --runs-dir)", EXIT_BRINGUP) from None
    return s


def _check_replaceable(run_dir: Path) -> None:
    """A new simulated run may take ``run_dir``'s place: it does not exist, is an empty folder, or
    is an earlier simulated run of the same name (its ``run.json`` says so; replaced as the
    simulator always did).

    Raises:
        testbed.core.errors.RunFailure: ``run_dir`` exists and is not a simulated run directory (exit 3).
    """
    import json

    from testbed.core.errors import EXIT_BRINGUP, RunFailure

    if not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())):
        return
    try:
        simulated = json.loads((run_dir / "run.json").read_text()).get("mode") == "simulation"
    except (OSError, ValueError, AttributeError):
        simulated = False
    if not simulated:
        raise RunFailure(f"{run_dir} exists and is not a simulated run directory; it is left as it is: choose "
                         f"another --runs-dir", EXIT_BRINGUP)
