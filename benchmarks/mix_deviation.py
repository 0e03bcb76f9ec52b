#!/usr/bin/env python3
"""Does one source gain by leaving a per-source static assignment? (docs/history.md, "ASET rounds")

    .venv/bin/python benchmarks/mix_deviation.py experiments/scenario-overload.yaml \\
        --assignment min_latency,cloud,min_latency,cloud --deviate min_latency [--seeds 1-5]

Runs the scenario in the simulator with a constant policy per source (sources sorted by name,
``testbed.aset.episode.run_static``) on each seed, then once per source with that source alone
switched to ``--deviate``. Prints each run's success ratio per source and in all (%, over the
seeds' queries) and the deviating source's own change in points. A source whose own figure rises
while the total falls is one that a reward of its own queries would pull away from the
assignment (the case of the overload mix).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def per_source(plan, assignment: list[str], seeds: list[int]) -> tuple[np.ndarray, float]:
    """(success ratio per source, success ratio in all) over the seeds' queries."""
    from testbed.aset.episode import run_static

    ok = n = 0
    for s in seeds:
        ep = run_static(plan, s, assignment)
        ok, n = ok + ep.ok.sum(0), n + ep.n.sum(0)
    return ok / n, float(ok.sum() / n.sum())


def main() -> int:
    from testbed.model.policies import CATALOGUE
    from testbed.plan.build import plan_experiment

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario")
    ap.add_argument("--assignment", required=True, help="one policy per source, sources sorted by name")
    ap.add_argument("--deviate", required=True, choices=CATALOGUE)
    ap.add_argument("--seeds", type=_seeds, default=_seeds("1-5"), help="e.g. 1-5")
    args = ap.parse_args()
    plan = plan_experiment(args.scenario)
    sources = sorted(h.name for h in plan.sources)
    base = [p.strip() for p in args.assignment.split(",")]
    bad = [p for p in base if p not in CATALOGUE]
    if len(base) != len(sources) or bad:
        ap.error(f"--assignment: need {len(sources)} policies of {', '.join(CATALOGUE)} "
                 f"(for {', '.join(sources)}); got {args.assignment!r}")
    own, total = per_source(plan, base, args.seeds)
    print(f"sources {', '.join(sources)}; seeds {args.seeds[0]}-{args.seeds[-1]}")
    print(f"assignment {','.join(base)}: per source {np.round(100 * own, 1).tolist()} %, all {100 * total:.2f} %")
    for i, src in enumerate(sources):
        if base[i] == args.deviate:
            continue
        alt = list(base)
        alt[i] = args.deviate
        r, t = per_source(plan, alt, args.seeds)
        print(f"{src} -> {args.deviate}: per source {np.round(100 * r, 1).tolist()} %, all {100 * t:.2f} %; "
              f"{src}'s own change {100 * (r[i] - own[i]):+.2f} pts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
