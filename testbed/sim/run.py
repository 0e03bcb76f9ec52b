"""``testbed simulate``: one experiment through the simulator, results in the emulation's layout."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from rich.console import Console

from testbed.model.records import GRACE_MS
from testbed.plan import Plan
from testbed.sim.core import Simulator
from testbed.util import repo_path, write_json_atomic


def simulate_experiment(plan: Plan, base_dir: Path | None = None, runs_dir: Path | None = None,
                        duration_s: float | None = None, seed: int | None = None, policy: str | None = None,
                        run_dir: Path | None = None, console: Console | None = None,
                        quiet: bool = False) -> tuple[Path, dict]:
    """Simulate ``plan`` for ``duration_s`` (default: the experiment's) and write its run directory.

    Queries are created during ``duration_s``; the simulation then continues until every query is
    resolved (deadline + grace), as the emulation's sources wait for their last answers.
    ``policy`` overrides the policy of every source. Returns (run directory, summary dict).

    Raises:
        testbed.sim.SimError, testbed.arrivals.ArrivalError: bad input, naming the item.
    """
    from testbed.summary import print_summary, summarize

    exp = plan.experiment
    duration_s = duration_s or exp.duration_s
    pols = {s.name: policy for s in plan.sources} if policy else None
    t_wall = time.perf_counter()
    sim = Simulator(plan, seed=seed, policies=pols, record=True, base_dir=base_dir)
    sim.arrivals_end = duration_s
    sim.run_until(duration_s + max(a.deadline_ms for a in exp.applications) / 1e3 + GRACE_MS / 1e3)
    wall = time.perf_counter() - t_wall
    if run_dir is None:
        base = Path(runs_dir) if runs_dir else repo_path(exp.runs_dir)
        tag = f"-{policy}" if policy else ""
        run_dir = base / f"{datetime.now():%Y%m%d-%H%M%S}-{exp.name}{tag}-sim-s{sim.seed}"
    n = len(sim.queries_recorded)
    sim.write_run(run_dir, {"simulated_s": duration_s, "wall_s": round(wall, 3), "queries": n})
    s = summarize(run_dir, duration_s)
    s["mode"] = "simulation"
    s["cold_rule"] = "simulated: the simulator models no TCP connection, so no query opens one (cold = 0 for all)"
    s["timings_s"] = {"wall_s": round(wall, 3)}
    write_json_atomic(run_dir / "summary.json", s, indent=2)
    if not quiet:
        console = console or Console()
        print_summary(s, console, run_dir)
        console.print(f"simulated {duration_s:g} s, {n} queries in {wall:.2f} s wall; run directory: {run_dir}")
    return run_dir, s
