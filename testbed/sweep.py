"""Sweeps: policies x scenarios x seeds through the simulator, in parallel processes.

Each run is :func:`testbed.sim.simulate_experiment` (one process per run, ``concurrent.futures``);
the results table has one row per run (``runs.csv``/``runs.parquet``) and one per (scenario, policy)
(``table.csv``, ``table.md``): success ratio mean and 95% confidence interval over the seeds
(Student's t: mean +- t_{0.975, n-1} s / sqrt(n)), e2e latency percentiles (mean over seeds of
each run's p50/p95/p99, answered queries), failures per cause (mean count per run). Plots:
``success_ratio.png`` (bars with the CI per scenario and policy) and ``e2e_p95.png``.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

CAUSES = ("deadline_miss", "dropped", "accuracy", "error")


def run_one(experiment: str, policy: str, seed: int, duration_s: float | None, runs_dir: str | None) -> dict:
    """One simulated run (in a worker process); returns its row of the results table."""
    from testbed.plan import plan_experiment
    from testbed.sim import simulate_experiment

    plan = plan_experiment(experiment)
    name = plan.experiment.name
    tmp = None
    if runs_dir is None:
        tmp = tempfile.mkdtemp(prefix="sweep-")
        run_dir = Path(tmp) / "run"
    else:
        run_dir = Path(runs_dir) / f"{name}-{policy}-s{seed}"
    try:
        _, s = simulate_experiment(plan, Path(experiment).parent, duration_s=duration_s, seed=seed, policy=policy,
                                   run_dir=run_dir, quiet=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    e2e = s.get("e2e_ms") or {}
    row = {"scenario": name, "policy": policy, "seed": seed, "queries": s["queries"],
           "success_ratio": s["success_ratio"], "e2e_p50_ms": e2e.get("p50"), "e2e_p95_ms": e2e.get("p95"),
           "e2e_p99_ms": e2e.get("p99"), "wall_s": s.get("timings_s", {}).get("wall_s")}
    for c in CAUSES:
        row[f"fail_{c}"] = (s.get("failures") or {}).get(c, 0)
    return row


def t_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% confidence interval (Student's t, n - 1 degrees of freedom);
    half-width NaN for fewer than 2 values."""
    from scipy import stats

    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return math.nan, math.nan
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    return m, float(stats.t.ppf(0.975, len(v) - 1)) * sd / math.sqrt(len(v))


def aggregate(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, policy): n, success ratio mean and CI, latency percentiles, failures."""
    rows = []
    for (sc, pol), g in runs.groupby(["scenario", "policy"], sort=False):
        m, h = t_ci95(g["success_ratio"].tolist())
        row = {"scenario": sc, "policy": pol, "seeds": len(g), "queries_mean": round(g["queries"].mean(), 1),
               "success_mean": round(m, 4), "success_ci95": None if math.isnan(h) else round(h, 4)}
        for q in ("p50", "p95", "p99"):
            row[f"e2e_{q}_ms"] = round(float(g[f"e2e_{q}_ms"].mean()), 3)
        for c in CAUSES:
            row[f"fail_{c}"] = round(float(g[f"fail_{c}"].mean()), 1)
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, out: Path) -> list[Path]:
    """Grouped bars per scenario and policy: success ratio (with the 95% CI) and e2e p95."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    scen = list(dict.fromkeys(table["scenario"]))
    pols = list(dict.fromkeys(table["policy"]))
    for col, err, label, fname in (("success_mean", "success_ci95", "success ratio (mean, 95% CI)",
                                    "success_ratio.png"),
                                   ("e2e_p95_ms", None, "e2e p95 (ms, mean over seeds)", "e2e_p95.png")):
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(scen)), 4))
        w = 0.8 / max(1, len(pols))
        x = np.arange(len(scen))
        for i, p in enumerate(pols):
            sub = table[table["policy"] == p].set_index("scenario").reindex(scen)
            yerr = sub[err].astype(float).fillna(0).values if err else None
            ax.bar(x + i * w - 0.4 + w / 2, sub[col].astype(float).values, w, yerr=yerr, capsize=2, label=p)
        ax.set_xticks(x, scen, rotation=20, ha="right")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=min(4, len(pols)))
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)
        paths.append(out / fname)
    return paths


def sweep(experiments: Sequence[str], policies: Sequence[str], seeds: Sequence[int], out: Path,
          jobs: int | None = None, duration_s: float | None = None, keep_runs: bool = False,
          console=None) -> pd.DataFrame:
    """Run every (experiment, policy, seed) in ``jobs`` processes with a progress bar; write the
    tables and plots to ``out``; return the per-(scenario, policy) table.

    Raises:
        testbed.config.ConfigError, testbed.plan.PlanError: an experiment is invalid (checked
            before any run starts).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from testbed.plan import plan_experiment

    console = console or Console()
    for e in experiments:
        plan_experiment(e)  # bad input fails here, before anything runs
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = str(out / "runs") if keep_runs else None
    tasks = [(str(e), p, s) for e in experiments for p in policies for s in seeds]
    rows = []
    jobs = jobs or max(1, (os.cpu_count() or 1))
    with Progress(TextColumn("[bold]sweep[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as prog, \
            ProcessPoolExecutor(max_workers=jobs) as pool:
        task = prog.add_task("sweep", total=len(tasks), info="")
        futs = {pool.submit(run_one, e, p, s, duration_s, runs_dir): (e, p, s) for e, p, s in tasks}
        for f in as_completed(futs):
            r = f.result()
            rows.append(r)
            prog.update(task, advance=1, info=f"{r['scenario']} {r['policy']} seed {r['seed']}: "
                                              f"{r['success_ratio']}")
    pol_rank = {p: i for i, p in enumerate(policies)}
    runs = pd.DataFrame(rows)
    runs = runs.sort_values(["scenario", "policy", "seed"], key=lambda c: c.map(pol_rank) if c.name == "policy"
                            else c).reset_index(drop=True)
    runs.to_csv(out / "runs.csv", index=False)
    runs.to_parquet(out / "runs.parquet", index=False)
    table = aggregate(runs)
    table.to_csv(out / "table.csv", index=False)
    (out / "table.md").write_text(to_markdown(table))
    plot(table, out)
    return table


def to_markdown(table: pd.DataFrame) -> str:
    """The per-(scenario, policy) table as Markdown."""
    cols = ["scenario", "policy", "seeds", "success_mean", "success_ci95", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms"] \
        + [f"fail_{c}" for c in CAUSES]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join("" if r[c] is None or (isinstance(r[c], float) and math.isnan(r[c]))
                                       else str(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"
