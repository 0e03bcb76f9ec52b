#!/usr/bin/env python3
"""How much of the clairvoyant headroom a selector that cannot see the future could reach.

    nice -n 19 .venv/bin/python benchmarks/causal_headroom.py [--config experiments/aset-rollout.yaml]
        [--results runs/aset-eval/aset-rollout] [--seeds 1,2,3] [--samples 8] [--min-t 1.64] [--horizon N]
        [--scenarios scenario-degradation,...] [--jobs 2] [--backend process|ray] [--out DIR]

The clairvoyant oracle of ``testbed evaluate`` (:func:`testbed.aset.headroom.rollout_oracle`)
scores every candidate policy on the seed's own future: the arrivals, service times and losses
that will happen. Issue 13's targets measure ASET against its headroom. This benchmark runs the
causal planner (:func:`testbed.aset.headroom.causal_planner`): the same multiagent rollout over
the per-source mix, with the same look-ahead, but every candidate scored on ``--samples``
futures drawn afresh at the window's start, and it leaves the mix only for a candidate whose
paired gain over the samples has a one-sided t statistic of at least ``--min-t`` (1.64: 95 %;
0: any positive mean gain, which with few samples deviates on noise). It knows the model, the
scenario's scheduled events and the whole present (every queue and query in flight), none of the
future's draws. Its schedule is then run on the seed, and that run is its figure.

It reads the evaluation's ``runs.csv`` and ``oracle.json`` from ``--results`` (a finished
``testbed evaluate`` of ``--config``): the per-source mix of each scenario, and the per-seed success
of every static policy, the mix, the oracle and ASET. It refuses to pair with them when the mix,
re-run here on a seed, does not give the evaluation's count: the simulator changed since.

Writes ``DIR/causal.csv`` (one row per scenario and seed) and ``DIR/causal.md`` (per scenario,
mean ± 95 % CI over the seeds that have the oracle and the planner, paired differences in points):
best static, mix, clairvoyant oracle, causal planner, ASET; headroom (oracle - best static); causal
headroom (planner - best static); clairvoyance share ((oracle - planner) / (oracle - best static));
ASET - planner; the planner's deviations from the mix (share of windows x sources).
Default ``--out``: ``<results>/causal``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.aset.evaluate import causal_job, summarise  # noqa: E402
from testbed.core.distributed import imap_unordered  # noqa: E402
from testbed.core.util import ci95, markdown_table, repo_path  # noqa: E402
from testbed.plan.build import plan_experiment  # noqa: E402
from testbed.plan.policies import aset_actions, load_aset  # noqa: E402

FIGURES = ("best", "mix", "oracle", "causal", "aset")


def read_evaluation(results: Path) -> tuple[dict[str, list[str]], dict[tuple[str, int], dict[str, tuple[int, int]]]]:
    """(mix per scenario name, {(scenario, seed): {policy: (ok, n)}}) of the tuning seeds.

    Raises:
        SystemExit: a file is missing or not what ``testbed evaluate`` writes.
    """
    try:
        mixes = json.loads((results / "oracle.json").read_text())["mixes"]
        with open(results / "runs.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        per: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
        for r in rows:
            if r["kind"] == "tuning":
                per.setdefault((r["scenario"], int(r["seed"])), {})[r["policy"]] = (int(r["ok"]), int(r["n"]))
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{results}: not a finished testbed evaluate ({exc})") from None
    return mixes, per


def best_static(results: Path, actions: list[str]) -> dict[str, str]:
    """The evaluation's best static policy per scenario (chosen on its tuning seeds):
    :func:`testbed.aset.evaluate.summarise` of its ``runs.csv``."""
    with open(results / "runs.csv", newline="") as f:
        runs = [{**r, "seed": int(r["seed"]), "success_ratio": float(r["success_ratio"])} for r in csv.DictReader(f)]
    return {t["scenario"]: t["best_static"] for t in summarise(runs, actions) if t["kind"] == "tuning"}


def table(rows: list[dict]) -> list[dict]:
    """One row per scenario: means, paired differences and the clairvoyance share (module docstring)."""
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == sc and not math.isnan(r["oracle"])]

        def pct(key: str, rs=rs) -> str:
            m, h = ci95([r[key] for r in rs])
            return f"{100 * m:.2f}" + ("" if math.isnan(h) else f" ± {100 * h:.2f}")

        def diff(a: str, b: str, rs=rs) -> str:
            m, h = ci95([r[a] - r[b] for r in rs])
            return f"{100 * m:+.2f}" + ("" if math.isnan(h) else f" ± {100 * h:.2f}")

        head = sum(r["oracle"] - r["best"] for r in rs)
        share = sum(r["oracle"] - r["causal"] for r in rs) / head if head > 0 else math.nan
        out.append({"scenario": sc, "seeds": len(rs), "best static": rs[0]["best_static"] if rs else "-",
                    **{f"{k} %": pct(k) for k in FIGURES},
                    "headroom (pts)": diff("oracle", "best"), "causal headroom (pts)": diff("causal", "best"),
                    "clairvoyance share": "-" if math.isnan(share) else f"{100 * share:.0f} %",
                    "causal - mix": diff("causal", "mix"), "ASET - causal": diff("aset", "causal"),
                    "planner deviates": f"{100 * sum(r['deviations'] for r in rs) / max(1, len(rs)):.1f} %"})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="experiments/aset-rollout.yaml")
    ap.add_argument("--results", default="runs/aset-eval/aset-rollout")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--min-t", type=float, default=1.64, help="paired t statistic to leave the mix (0: mean > 0)")
    ap.add_argument("--horizon", type=int, default=None,
                    help="windows of look-ahead (default: evaluation.oracle_horizon)")
    ap.add_argument("--scenarios", default=None, help="comma-separated scenario names (default: the evaluation's)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--backend", default="process", choices=["process", "ray"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.samples < 1:
        ap.error(f"--samples must be >= 1, not {a.samples}")
    cfg, base = load_aset(a.config)
    ev = cfg.evaluation
    if ev is None:
        ap.error(f"{a.config}: no evaluation section")
    results = Path(a.results)
    mixes, per = read_evaluation(results)
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    paths = {plan_experiment(repo_path(s, base)).experiment.name: str(repo_path(s, base)) for s in ev.scenarios}
    names = list(paths) if a.scenarios is None else [x.strip() for x in a.scenarios.split(",") if x.strip()]
    for n in names:
        if n not in paths or n not in mixes:
            ap.error(f"scenario {n!r} is not in both {a.config} and {results}; known: {', '.join(paths)}")
        for k in seeds:
            if (n, k) not in per:
                ap.error(f"{results}: no tuning run of {n} on seed {k}")
    horizon = a.horizon if a.horizon is not None else ev.oracle_horizon
    actions = list(aset_actions(cfg))
    tasks = [(paths[n], k, mixes[n], actions, a.samples, ev.duration_s, horizon, a.min_t) for n in names for k in seeds]
    print(f"causal planner: {len(names)} scenarios x seeds {seeds}, {a.samples} sampled futures, t >= {a.min_t:g}, "
          f"horizon {horizon} "
          f"windows, {a.jobs} jobs ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", flush=True)
    t0, res = time.monotonic(), [None] * len(tasks)
    for i, r in imap_unordered(causal_job, tasks, backend=a.backend, jobs=a.jobs):
        res[i] = r
        print(f"  {names[i // len(seeds)]} seed {seeds[i % len(seeds)]}: {r['ok']}/{r['n']} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    rows, best = [], best_static(results, actions)
    for (n, k), r in zip([(n, k) for n in names for k in seeds], res, strict=True):
        c = per[(n, k)]
        if c.get("mix") != (r["base_ok"], r["n"]):
            raise SystemExit(f"{n} seed {k}: the mix gives {r['base_ok']}/{r['n']} here and {c.get('mix')} in "
                             f"{results}/runs.csv: the simulator changed since that evaluation; run it again")
        b = best[n]
        ratio = {p: c[p][0] / c[p][1] if p in c else math.nan for p in (b, "mix", "oracle", "aset")}
        rows.append({"scenario": n, "seed": k, "best_static": b, "best": ratio[b], "mix": ratio["mix"],
                     "oracle": ratio["oracle"], "causal": r["ok"] / r["n"], "aset": ratio["aset"],
                     "deviations": r["deviations"], "trials": r["trials"]})
    out = Path(a.out) if a.out else results / "causal"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "causal.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = markdown_table(table(rows))
    (out / "causal.md").write_text(f"Causal planner, {a.samples} sampled futures, t >= {a.min_t:g}, horizon {horizon}, "
                                   f"seeds {seeds} "
                                   f"(`benchmarks/causal_headroom.py`)\n\n{md}\n")
    print(md)
    print(f"written: {out / 'causal.csv'}, {out / 'causal.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
