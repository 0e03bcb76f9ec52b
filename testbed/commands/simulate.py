"""``testbed simulate EXPERIMENT.yaml``: run an experiment in the discrete-event simulator (no root,
no Mininet); the run directory has the emulation's layout (records, summary) plus
``run.json`` with ``"mode": "simulation"``."""

from __future__ import annotations

import argparse
from pathlib import Path


def _positive_s(text: str) -> float:
    from testbed.units import UnitError, parse_duration_s

    try:
        v = parse_duration_s(text, item="--duration")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError("--duration must be > 0")
    return v


def _seed(text: str) -> int:
    from testbed.config import MAX_SEED

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is 0 .. {MAX_SEED}")
    return v


def register(subparsers) -> None:
    from testbed.policies import CATALOGUE

    p = subparsers.add_parser("simulate", help="run an experiment in the simulator (fast, no root)",
                              description=__doc__)
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--duration", type=_positive_s, default=None, help="override the duration, e.g. 600s")
    p.add_argument("--seed", type=_seed, default=None, help="override the experiment's seed (0 .. 2^32 - 1)")
    p.add_argument("--policy", choices=CATALOGUE, default=None, help="override every source's policy")
    p.add_argument("--runs-dir", default=None, help="where run directories go (default: the experiment's runs_dir)")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    from testbed.cli import console
    from testbed.plan import check_load_bounds, plan_experiment
    from testbed.sim import simulate_experiment

    plan = plan_experiment(args.experiment)  # bad input: an InputError, printed once by testbed.cli
    if args.duration is not None:  # the same bounds the plan checked for the experiment's own duration
        check_load_bounds(plan.experiment, plan.weights, args.duration, Path(plan.base_dir))
    simulate_experiment(plan, Path(args.experiment).parent, Path(args.runs_dir) if args.runs_dir else None,
                        args.duration, args.seed, args.policy, console=console)
    return 0
