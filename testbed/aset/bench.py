"""Benchmark: ASET decision time per window per dispatcher (observation + numpy forward pass).

    .venv/bin/python -m testbed.aset.bench [CHECKPOINT] [EXPERIMENT] [N]

defaults: ``models/aset/aset``, ``experiments/aset-live.yaml``, 20000 decisions. Builds the live
selector exactly as the emulation's dispatcher does (the source config ``testbed.run`` writes,
:meth:`testbed.boundaries.SourceConfig.from_plan`) and feeds it window states drawn at random
(arrivals, stale cluster stats, path utilization, resolved queries with cluster and e2e, in-flight
counts). Prints n, mean, p50, p99, max in ms. Goal (issue 5): p99 < 2 ms. Timings on the shared
2-core machine are noisy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from testbed.aset.live import LivePolicySelector
    from testbed.boundaries import SourceConfig
    from testbed.plan import plan_experiment

    argv = sys.argv[1:] if argv is None else argv
    ckpt = argv[0] if argv else str(REPO / "models/aset/aset")
    exp = argv[1] if len(argv) > 1 else str(REPO / "experiments/aset-live.yaml")
    n = int(argv[2]) if len(argv) > 2 else 20_000
    plan = plan_experiment(exp)
    src = plan.sources[0].name
    cfg = SourceConfig.from_plan(plan, src, 0, 1.0, Path(tempfile.gettempdir()))
    cfg = cfg.model_copy(update={"policy": "aset", "records": "",
                                 "aset": cfg.aset.model_copy(update={"checkpoint": ckpt}) if cfg.aset else None})
    sel = LivePolicySelector(cfg)
    apps = list(sel.ctx.applications)
    rng = np.random.default_rng(0)
    for _ in range(n):
        state = {"arrivals": {a: int(rng.poisson(1.0)) for a in apps},
                 "clusters": {c.name: {"queue_len": int(rng.integers(0, 8)), "busy": 1, "workers": c.workers or 1,
                                       "utilization": float(rng.random()), "up": bool(rng.random() > 0.05)}
                              for c in plan.clusters},
                 "path_util": {c.name: float(rng.random()) for c in plan.clusters},
                 "resolved": [(apps[int(rng.integers(len(apps)))], bool(rng.random() > 0.2), 0.0,
                               plan.clusters[int(rng.integers(len(plan.clusters)))].name, float(rng.uniform(5, 60)))
                              for _ in range(int(rng.integers(0, 4)))],
                 "in_flight": {c.name: int(rng.integers(0, 4)) for c in plan.clusters},
                 "policy": sel.ctx.policies[int(rng.integers(len(sel.ctx.policies)))]}
        sel.choose(state)
    t = sel.timing()
    print(f"decisions {t['n']}: mean {t['mean_ms']:.4f} ms, p50 {t['p50_ms']:.4f} ms, p99 {t['p99_ms']:.4f} ms, "
          f"max {t['max_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
