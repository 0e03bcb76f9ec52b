"""Benchmark: ASET decision time per window per dispatcher (observation + numpy forward pass).

    .venv/bin/python -m testbed.aset.bench [CHECKPOINT] [EXPERIMENT] [N]

defaults: ``models/aset/aset``, ``experiments/default.yaml``, 20000 decisions. Builds the live
selector exactly as the emulation's dispatcher does (source config: applications + per (cluster,
model) RTTs from the plan) and feeds it window states drawn at random (arrivals, stale cluster
stats, path utilization, resolved queries). Prints n, mean, p50, p99, max in ms. Goal (issue 5):
p99 < 2 ms. Timings on the shared 2-core machine are noisy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    from testbed.aset.live import LivePolicySelector
    from testbed.plan import plan_experiment

    argv = sys.argv[1:] if argv is None else argv
    ckpt = argv[0] if argv else str(REPO / "models/aset/aset")
    exp = argv[1] if len(argv) > 1 else str(REPO / "experiments/default.yaml")
    n = int(argv[2]) if len(argv) > 2 else 20_000
    plan = plan_experiment(exp)
    src = plan.sources[0].name
    apps = [a.name for a in plan.experiment.applications]
    cfg = {"source": src, "applications": [{"name": a} for a in apps],
           "options": [{"cluster": c.name, "model": m, "rtt_ms": plan.rtt_ms(src, c.name)}
                       for c in plan.clusters for m in c.models],
           "aset": {"checkpoint": ckpt}}
    sel = LivePolicySelector(cfg)
    rng = np.random.default_rng(0)
    for _ in range(n):
        state = {"arrivals": {a: int(rng.poisson(1.0)) for a in apps},
                 "clusters": {c.name: {"queue_len": int(rng.integers(0, 8)), "busy": 1, "workers": c.workers or 1,
                                       "utilization": float(rng.random()), "up": bool(rng.random() > 0.05)}
                              for c in plan.clusters},
                 "path_util": {c.name: float(rng.random()) for c in plan.clusters},
                 "resolved": [(apps[int(rng.integers(len(apps)))], bool(rng.random() > 0.2))
                              for _ in range(int(rng.integers(0, 4)))],
                 "policy": sel.ctx.policies[int(rng.integers(len(sel.ctx.policies)))]}
        sel.choose(state)
    t = sel.timing()
    print(f"decisions {t['n']}: mean {t['mean_ms']:.4f} ms, p50 {t['p50_ms']:.4f} ms, p99 {t['p99_ms']:.4f} ms, "
          f"max {t['max_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
