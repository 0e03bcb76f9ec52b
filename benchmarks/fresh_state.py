#!/usr/bin/env python3
"""What fresh state changes for each load-aware static policy (docs/aset.md, "The general agent").

    .venv/bin/python benchmarks/fresh_state.py experiments/scenario-overload.yaml [--seeds 1-5]

Per policy and seed, on common random numbers, three simulator runs of every source on the policy:

- ``stale``: the system model (reports every report interval; the simulator dispatches each
  report interval's queries stream by stream, as it always does);
- ``stale_10ms``: the same reports, but the simulator advances in 10 ms steps, as it does with
  fresh state, so a source's queries are dispatched in time order across its streams; nothing more
  is heard (the step's own effect);
- ``fresh``: ``view="fresh"``: every 10 ms every dispatcher hears the clusters' true state.

Prints the success % means and the paired differences (points, mean ± 95 % CI) fresh - stale,
stale_10ms - stale, fresh - stale_10ms (what the information alone changes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment")
    ap.add_argument("--seeds", type=_seeds, default=_seeds("1-5"))
    ap.add_argument("--policies", default="least_loaded,min_latency,max_accuracy")
    args = ap.parse_args()

    from testbed.aset.episode import run_static
    from testbed.aset.jobs import plan_of
    from testbed.core.util import ci95
    from testbed.sim.engine import Simulator

    plan = plan_of(args.experiment)
    n = len(plan.sources)
    hear = Simulator._hear_fresh
    for pol in args.policies.split(","):
        r: dict[str, list[float]] = {"stale": [], "stale_10ms": [], "fresh": []}
        for s in args.seeds:
            r["stale"].append(100 * run_static(plan, s, [pol] * n).success_ratio)
            Simulator._hear_fresh = lambda self, t: None  # the 10 ms steps without what they hear
            try:
                r["stale_10ms"].append(100 * run_static(plan, s, [pol] * n, view="fresh").success_ratio)
            finally:
                Simulator._hear_fresh = hear
            r["fresh"].append(100 * run_static(plan, s, [pol] * n, view="fresh").success_ratio)

        def d(a: str, b: str, r: dict[str, list[float]] = r) -> str:
            m, h = ci95([x - y for x, y in zip(r[a], r[b], strict=True)])
            return f"{a} - {b} {m:+.2f} ± {h:.2f}"

        means = ", ".join(f"{k} {ci95(v)[0]:.2f}" for k, v in r.items())
        print(f"{Path(args.experiment).stem} {pol}: {means}; {d('fresh', 'stale')}; {d('stale_10ms', 'stale')}; "
              f"{d('fresh', 'stale_10ms')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
