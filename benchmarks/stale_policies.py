"""Where ``p2c`` and ``age_aware`` beat, and where they lose to, the seven other policies, as the
load reports grow stale: success ratio per (scenario, report interval, policy) in the simulator.

Run (about 12 CPU-minutes with the defaults; two workers)::

    nice -n 19 .venv/bin/python benchmarks/stale_policies.py --jobs 2 --out runs/stale-policies

Each experiment (default: ``experiments/default.yaml`` and the five scenarios with events or bursts,
``scenario-{bursty,hotspot,degradation,failure,linkfail}.yaml``) is planned again with its
``report_interval`` set to each of ``--intervals`` (default 0.1, 0.5, 2 s; the shipped files use
0.5 s) and renamed ``<name>.R<interval>s``; every (experiment, interval) x policy (default: the
whole catalogue) x seed 1..``--seeds`` (default 10) is one simulated run, the cell of
``testbed sweep`` (:func:`testbed.results.sweep_runner.run_one`, through
:func:`testbed.core.distributed.imap_unordered`'s process pool). The sweep itself takes experiment
files; the report interval is not one of its overrides, hence this script.

Written to ``--out``: ``runs.csv`` (one row per run), ``table.csv`` and ``table.md``:

- success ratio mean +- half-width of the 95 % Student-t interval over the seeds
  (:func:`testbed.core.util.ci95`, ``scipy.stats.t``), one column per policy;
- per new policy and scenario, the policies it beats and those it loses to: the paired difference
  of success ratio (same seed, so the same arrivals and service draws: common random numbers),
  its 95 % t-interval (``scipy.stats.t``) entirely above 0 (beats) or below 0 (loses).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DYNAMIC = ("bursty", "hotspot", "degradation", "failure", "linkfail")
NEW = ("p2c", "age_aware")


def _plans(experiments: list[str], intervals: list[float]) -> list:
    """Each experiment planned once per report interval, renamed ``<name>.R<interval>s``.

    Raises:
        testbed.spec.experiment.ConfigError: an experiment or an interval is invalid (validated anew).
    """
    from testbed.plan.build import build_plan
    from testbed.spec.experiment import Experiment, load_experiment

    plans = []
    for e in experiments:
        exp = load_experiment(e)
        for r in intervals:
            data = exp.model_dump()
            data.update(report_interval_s=r, name=f"{exp.name}.R{r:g}s")
            plans.append(build_plan(Experiment.model_validate(data), base_dir=Path(e).resolve().parent))
    return plans


def _run(plans: list, policies: list[str], seeds: list[int], jobs: int, duration_s: float | None) -> pd.DataFrame:
    """One row per (plan, policy, seed): the sweep's cell, in a pool of ``jobs`` processes."""
    from testbed.core.distributed import imap_unordered
    from testbed.results.sweep_runner import run_one

    tasks = [(plan, p, s, duration_s, None) for plan in plans for p in policies for s in seeds]
    rows, t = [], time.perf_counter()
    for k, (_, row) in enumerate(imap_unordered(run_one, tasks, backend="process", jobs=jobs), 1):
        rows.append(row)
        if k % 50 == 0 or k == len(tasks):
            print(f"{k}/{len(tasks)} runs, {time.perf_counter() - t:.0f} s", flush=True)
    return pd.DataFrame(rows)


def _cell(m: float, h: float) -> str:
    return f"{m:.3f} ± {h:.3f}"


def success_table(runs: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """Rows (scenario), one column per policy: success ratio mean ± 95 % t half-width over seeds."""
    from testbed.core.util import ci95

    out = []
    for sc, g in runs.groupby("scenario", sort=False):
        row = {"scenario": sc, "seeds": int(g["seed"].nunique())}
        for p in policies:
            row[p] = _cell(*ci95(g.loc[g["policy"] == p, "success_ratio"].tolist()))
        out.append(row)
    return pd.DataFrame(out)


def paired(runs: pd.DataFrame, new: str, other: str, scenario: str) -> tuple[float, float]:
    """Mean and 95 % t half-width of ``new - other``'s success ratio, paired by seed, in ``scenario``."""
    from testbed.core.util import ci95

    g = runs[runs["scenario"] == scenario].pivot(index="seed", columns="policy", values="success_ratio")
    return ci95((g[new] - g[other]).tolist())


def verdicts(runs: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """Per scenario and new policy: the policies it beats and loses to (paired CI excludes 0), with
    the difference to the best of the others."""
    rows = []
    for sc in runs["scenario"].unique():
        for new in (p for p in NEW if p in policies):
            beats, loses = [], []
            for other in (p for p in policies if p != new):
                m, h = paired(runs, new, other, sc)
                if m - h > 0:
                    beats.append(other)
                elif m + h < 0:
                    loses.append(f"{other} ({m:+.3f})")
            rows.append({"scenario": sc, "policy": new, "beats": ", ".join(beats) or "-",
                         "loses to (mean difference)": ", ".join(loses) or "-"})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiments", nargs="+", default=[str(REPO / "experiments" / "default.yaml")] + [
        str(REPO / "experiments" / f"scenario-{s}.yaml") for s in DYNAMIC])
    ap.add_argument("--intervals", default="0.1,0.5,2", help="report intervals, s (comma-separated)")
    ap.add_argument("--policies", default="all", help="comma-separated, or 'all' (the catalogue)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--duration", default=None, help="override each experiment's duration (e.g. 20s)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/stale-policies")
    a = ap.parse_args()
    from testbed.core.util import markdown_table
    from testbed.model.policies import CATALOGUE
    from testbed.spec.units import parse_duration_s

    pols = list(CATALOGUE) if a.policies == "all" else a.policies.split(",")
    unknown = [p for p in pols if p not in CATALOGUE]
    if unknown or a.seeds < 2:
        ap.error(f"--policies {', '.join(unknown)}: unknown" if unknown else "--seeds: 2 or more (a CI needs them)")
    dur = parse_duration_s(a.duration, item="--duration") if a.duration else None
    plans = _plans(a.experiments, [float(x) for x in a.intervals.split(",")])
    t = time.process_time()
    runs = _run(plans, pols, list(range(1, a.seeds + 1)), a.jobs, dur)
    order = {p.experiment.name: i for i, p in enumerate(plans)}
    runs = runs.sort_values(["scenario", "policy", "seed"], key=lambda c: c.map(order) if c.name == "scenario"
                            else c.map(pols.index) if c.name == "policy" else c).reset_index(drop=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    table, wins = success_table(runs, pols), verdicts(runs, pols)
    table.to_csv(out / "table.csv", index=False)
    text = (f"Success ratio, mean ± 95 % t half-width over {a.seeds} seeds\n\n{markdown_table(table)}\n\n"
            f"Paired by seed (95 % t-interval of the difference excludes 0)\n\n{markdown_table(wins)}\n")
    (out / "table.md").write_text(text)
    print(text)
    print(f"{len(runs)} runs; this process's CPU {time.process_time() - t:.0f} s (workers not counted); in {out}")


if __name__ == "__main__":
    main()
