"""``testbed evaluate CONFIG``: ASET against every static policy on the scenarios, several seeds.

For each scenario file of ``evaluation.scenarios`` and each seed 1..``evaluation.seeds``, the
simulator runs the scenario once per static policy of the catalogue (every source applies it all
the time) and once with ASET (the exported greedy policy ``evaluation.checkpoint`` choosing every
source's policy every window), all through :class:`~testbed.aset.envs.AsetSimEnv`, so every run
is measured the same way: success ratio = successful / all queries created during the run
(system-model.md). The same seed gives every policy the same arrivals (common random numbers).

Statistics: mean and 95 % confidence interval with the t-distribution (``scipy.stats.t``, n - 1
degrees of freedom) over the seeds; and the paired difference ASET - best static policy per seed
(best = highest mean), with its 95 % CI: "ASET beats it beyond the CI" means the paired
difference's lower CI bound is above 0.

Outputs in ``evaluation.out_dir/<name>/``: ``runs.csv`` (one row per scenario x policy x seed),
``results.csv`` and ``results.md`` (the table), ``results.png`` (bars with 95 % CI).
"""

from __future__ import annotations

import csv
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.aset.config import AsetConfig
from testbed.aset.train import resolve

ASET = "aset"


def ci95(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % CI (t-distribution, n - 1 d.o.f.); half-width NaN for n < 2."""
    from scipy.stats import t

    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return float(x.mean()) if x.size else math.nan, math.nan
    return float(x.mean()), float(t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def run_scenario_seed(scenario: str, seed: int, checkpoint: str, duration_s: float | None,
                      policies: list[str] | None = None) -> list[dict]:
    """Every static policy and ASET on one scenario file and seed; one row per policy:
    ``{scenario, policy, seed, success_ratio, queries, share}`` (share: ASET's policy usage)."""
    from testbed.aset.envs import AsetSimEnv
    from testbed.aset.npolicy import NumpyPolicy
    from testbed.plan import plan_experiment

    pol = NumpyPolicy(checkpoint)
    plan = plan_experiment(scenario)
    dur = duration_s or plan.experiment.duration_s
    env = AsetSimEnv(plan, pol.obs_spec, dur, policies=tuple(pol.meta["policies"]),
                     sim_kwargs={"base_dir": str(Path(scenario).parent)})
    if [c.clusters for c in env.contexts][0] != tuple(pol.meta["clusters"]):
        raise ValueError(f"{scenario}: clusters {env.contexts[0].clusters} differ from the checkpoint's "
                         f"{pol.meta['clusters']}")
    rows = []
    name = plan.experiment.name
    for p in [*(policies or env.policies), ASET]:
        obs, _ = env.reset(seed=seed, options={"sim_seed": seed})
        done, info = False, {}
        while not done:
            a = pol.act(obs) if p == ASET else np.full(len(env.contexts), env.policies.index(p))
            obs, _, _, done, info = env.step(a)
        share = env.policy_windows.sum(0) / max(1, env.policy_windows.sum())
        rows.append({"scenario": name, "policy": p, "seed": seed, "success_ratio": info["success_ratio"],
                     "queries": info["queries"],
                     "share": {q: round(float(s), 4) for q, s in zip(env.policies, share, strict=True) if s > 0}})
    return rows


@dataclass
class EvalResult:
    out_dir: Path
    runs: list[dict]
    table: list[dict]


def summarise(runs: list[dict]) -> list[dict]:
    """Per scenario and policy: mean, CI half-width, n; plus per scenario the best static policy,
    ASET's paired difference to it (mean, CI) and the two verdicts of the issue's target."""
    table = []
    for sc in dict.fromkeys(r["scenario"] for r in runs):
        rs = [r for r in runs if r["scenario"] == sc]
        stats = {}
        for p in dict.fromkeys(r["policy"] for r in rs):
            vals = [r["success_ratio"] for r in sorted(rs, key=lambda r: r["seed"]) if r["policy"] == p]
            stats[p] = (*ci95(vals), len(vals), vals)
        statics = {p: s for p, s in stats.items() if p != ASET}
        best = max(statics, key=lambda p: (statics[p][0], p))
        row = {"scenario": sc, "best_static": best}
        for p, (m, h, n, _) in stats.items():
            row[p] = (m, h, n)
        if ASET in stats:
            diff = [a - b for a, b in zip(stats[ASET][3], statics[best][3], strict=True)]
            dm, dh = ci95(diff)
            row["diff"] = (dm, dh)
            row["within_1pt"] = dm >= -0.01
            row["above_beyond_ci"] = (dm - dh) > 0 if not math.isnan(dh) else False
        table.append(row)
    return table


def evaluate(cfg: AsetConfig, base: Path, *, seeds: int | None = None, duration_s: float | None = None,
             workers: int = 2, progress: bool = True, console=None) -> EvalResult:
    """Run the evaluation (``cfg.evaluation`` required); writes and returns the results.

    Raises:
        ValueError: no ``evaluation:`` section. FileNotFoundError: the checkpoint is missing.
    """
    if cfg.evaluation is None:
        raise ValueError(f"ASET config {cfg.name!r}: an 'evaluation:' section is required for testbed evaluate")
    ev = cfg.evaluation
    seeds = seeds or ev.seeds
    ckpt = resolve(base, ev.checkpoint)
    for suffix in (".npz", ".json"):
        if not ckpt.with_suffix(suffix).is_file():
            raise FileNotFoundError(f"checkpoint {ckpt.with_suffix(suffix)} is missing (run testbed train first)")
    scenarios = [str(resolve(base, s)) for s in ev.scenarios]
    jobs = [(s, k) for s in scenarios for k in range(1, seeds + 1)]
    runs: list[dict] = []
    dur = duration_s or ev.duration_s

    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("[bold]evaluate[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console)
        task = bar.add_task("eval", total=len(jobs))
        bar.start()
    try:
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futs = [pool.submit(run_scenario_seed, s, k, str(ckpt), dur) for s, k in jobs]
                for f in futs:
                    runs += f.result()
                    if bar is not None:
                        bar.advance(task)
        else:
            for s, k in jobs:
                runs += run_scenario_seed(s, k, str(ckpt), dur)
                if bar is not None:
                    bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()
    out = resolve(base, ev.out_dir) / cfg.name
    out.mkdir(parents=True, exist_ok=True)
    table = summarise(runs)
    _write(out, runs, table)
    return EvalResult(out, runs, table)


def _fmt(cell) -> str:
    m, h, _n = cell
    return f"{100 * m:.2f} ± {100 * h:.2f}" if not math.isnan(h) else f"{100 * m:.2f}"


def markdown_table(table: list[dict]) -> str:
    """The results as a Markdown table: success ratio in % (mean ± 95 % CI half-width) per policy,
    the best static policy, ASET - best (paired, points) and the verdicts."""
    pols = [p for p in table[0] if p not in ("scenario", "best_static", "diff", "within_1pt", "above_beyond_ci")]
    head = ["scenario", *pols, "best static", "ASET - best (pts)", "within 1 pt", "above beyond CI"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        cells = [row["scenario"]] + [_fmt(row[p]) if p in row else "-" for p in pols] + [row["best_static"]]
        if "diff" in row:
            dm, dh = row["diff"]
            cells += [f"{100 * dm:+.2f} ± {100 * dh:.2f}", "yes" if row["within_1pt"] else "NO",
                      "yes" if row["above_beyond_ci"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write(out: Path, runs: list[dict], table: list[dict]) -> None:
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "policy", "seed", "success_ratio", "queries", "aset_policy_share"])
        for r in runs:
            w.writerow([r["scenario"], r["policy"], r["seed"], f"{r['success_ratio']:.6f}", r["queries"],
                        r["share"] if r["policy"] == ASET else ""])
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "policy", "mean", "ci95", "n", "best_static"])
        for row in table:
            for p, v in row.items():
                if isinstance(v, tuple) and len(v) == 3:
                    w.writerow([row["scenario"], p, f"{v[0]:.6f}", f"{v[1]:.6f}", v[2], row["best_static"]])
    (out / "results.md").write_text(markdown_table(table))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = [p for p in table[0] if isinstance(table[0][p], tuple) and len(table[0][p]) == 3]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(table)), 4.5))
    width = 0.8 / len(pols)
    x = np.arange(len(table))
    for j, p in enumerate(pols):
        m = [100 * row[p][0] for row in table]
        h = [100 * (0 if math.isnan(row[p][1]) else row[p][1]) for row in table]
        ax.bar(x + (j - (len(pols) - 1) / 2) * width, m, width, yerr=h, capsize=2, label=p,
               color="black" if p == ASET else None)
    ax.set_xticks(x, [row["scenario"] for row in table], rotation=15)
    lo = min(100 * row[p][0] for row in table for p in pols)
    ax.set_ylim(max(0, lo - 10), 100.5)
    ax.set_ylabel("success ratio (%), mean ± 95% CI")
    ax.set_title("ASET vs static policies (simulator)")
    ax.legend(ncol=4, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "results.png", dpi=110)
    plt.close(fig)
