"""Benchmark: ASET decision time per window per dispatcher (observation + numpy forward pass).

    .venv/bin/python -m testbed.aset.bench [CHECKPOINT] [EXPERIMENT] [N]   (--help: the arguments)

defaults: ``models/aset/aset``, ``experiments/aset-live.yaml``, 20000 decisions. Builds the source's
selector exactly as every engine does (:class:`testbed.agent.live.SourceSelector` of the source
config ``testbed.emu.lifecycle`` writes) and feeds it window states drawn at random
(arrivals, stale cluster stats, path utilization, resolved queries with cluster and e2e, in-flight
counts). Prints n, mean, p50, p99, max in ms. Goal: p99 < 2 ms. Timings on the shared
2-core machine are noisy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from testbed.agent.live import SourceSelector, source_configs
from testbed.core.errors import InputError, TestbedError
from testbed.core.util import REPO_ROOT
from testbed.plan.build import plan_experiment
from testbed.plan.dilation import with_time_dilation
from testbed.spec.experiment import AsetSpec

REPO = REPO_ROOT


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1 decision")
    return n


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m testbed.aset.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?", default=str(REPO / "models/aset/aset"),
                    help="the exported policy, without .npz/.json (default: models/aset/aset)")
    ap.add_argument("experiment", nargs="?", default=str(REPO / "experiments/aset-live.yaml"),
                    help="the experiment whose first source's selector is timed (default: experiments/aset-live.yaml)")
    ap.add_argument("n", nargs="?", type=_positive_int, default=20_000, help="decisions to time (default: 20000)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Time ``n`` decisions (module docstring). Bad input (a missing file, a checkpoint that does
    not fit the experiment) is a :class:`testbed.core.errors.InputError`, printed once as the
    ``testbed`` command prints errors, with its exit code."""

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return _bench(Path(args.checkpoint).resolve(), Path(args.experiment).resolve(), args.n)
    except TestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _selector(ckpt: Path, plan):
    """The selector of the plan's first source with the checkpoint, as every engine builds it."""
    cfgs = source_configs(with_time_dilation(plan, 1.0), [plan.sources[0].name], AsetSpec(checkpoint=str(ckpt)))
    try:
        return SourceSelector(cfgs[0])
    except (KeyError, OSError, ValueError) as exc:  # missing files, a checkpoint of another experiment's shape
        raise InputError(f"checkpoint {ckpt} with experiment {plan.experiment.name!r}: {exc}") from None


def _bench(ckpt: Path, exp: Path, n: int) -> int:

    if not Path(f"{ckpt}.npz").is_file():  # before planning: the cheap check first
        raise InputError(f"checkpoint {ckpt}: no file {ckpt}.npz (give the exported policy without .npz/.json)")
    plan = plan_experiment(exp)
    sel = _selector(ckpt, plan)
    apps = list(sel.agent.context.applications)
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
                 "policy": sel.policies[int(rng.integers(len(sel.policies)))]}
        sel.choose(state)
    t = sel.timing()
    print(f"decisions {t['n']}: mean {t['mean_ms']:.4f} ms, p50 {t['p50_ms']:.4f} ms, p99 {t['p99_ms']:.4f} ms, "
          f"max {t['max_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
