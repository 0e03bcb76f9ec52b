"""``testbed simulate EXPERIMENT.yaml``: run an experiment in the discrete-event simulator (no root,
no Mininet); the run directory has the emulation's layout (records, summary) plus
``run.json`` with ``"mode": "simulation"``. ``--speeds RUN_DIR``: simulate at the speeds an
emulated run measured (each model's profile samples x its residual speed factor there, the measured
factor itself when the run had ``emulation.speed: host``; :mod:`testbed.plan.speeds`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.cli.common import DURATION_HELP, RUNS_DIR_HELP, console, duration_arg, plain_help, print_feasibility
from testbed.core.errors import EXIT_ALL_FAILED, EXIT_BRINGUP, EXIT_NOTHING_MEASURED, InputError, RunFailure
from testbed.core.plugins import PluginError, normalize_ref
from testbed.core.util import repo_path
from testbed.model.policies import CATALOGUE
from testbed.plan.build import check_load_bounds, events_after_end, plan_experiment, runs_dir_problem
from testbed.plan.policy_resolution import check_policy
from testbed.plan.speeds import apply_speeds, read_speeds
from testbed.results import runs
from testbed.spec.experiment import MAX_SEED


def seed_arg(text: str) -> int:
    """argparse type of a seed: an integer 0 .. 2^32 - 1."""

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is 0 .. {MAX_SEED}")
    return v


def policy_arg(text: str) -> str:
    """argparse type of a policy: its string form (:func:`testbed.core.plugins.normalize_ref`);
    resolved later, where the policy is used."""
    try:
        return normalize_ref(text)
    except PluginError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers) -> None:

    p = subparsers.add_parser("simulate", help="run an experiment in the simulator (fast, no root)",
                              description=plain_help(__doc__))
    p.add_argument("experiment", help="experiment YAML file")
    p.add_argument("--duration", type=duration_arg, default=None, help=DURATION_HELP)
    p.add_argument("--seed", type=seed_arg, default=None, help="override the experiment's seed (0 .. 2^32 - 1)")
    p.add_argument("--policy", type=policy_arg, default=None,
                   help=f"override every source's policy: {', '.join(CATALOGUE)}, or a plug-in (an entry-point "
                        f"name or package.module:callable, with parameters: mypkg.sched:p2c(d=2); docs/extending.md)")
    p.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    p.add_argument("--speeds", metavar="RUN_DIR", default=None,
                   help="simulate at the speeds an emulated run of this experiment measured (its run.json's "
                        "speeds): each model's service samples x its residual factor there (the measured factor "
                        "itself with emulation.speed: host)")
    p.set_defaults(func=_cmd)


def _with_speeds(plan, run_dir: str):
    """``plan`` at the speeds of the run in ``run_dir`` (:func:`testbed.plan.speeds.apply_speeds`).

    Raises:
        InputError: ``run_dir`` is not a run folder, its run has no speeds, or they do not fit the plan.
    """
    where = Path(run_dir)
    if where.name == "run.json" and where.is_file():  # the run's file itself: its folder
        where = where.parent
    if not run_dir.strip() or not (where / "run.json").is_file():
        what = "a file, not a run's folder" if where.is_file() else "no run.json there"
        raise InputError(f"--speeds {run_dir!r}: {what} (give an emulated run's folder, e.g. runs/<run id>)")
    try:
        speeds = read_speeds(where)
    except ValueError as exc:
        raise InputError(f"--speeds {run_dir}: {exc}") from None
    if speeds is None:
        raise InputError(f"--speeds {run_dir}: its run.json has no speeds (a simulation, a run stopped before its "
                         f"servers were ready, or a run from before the speed check)")
    try:
        return apply_speeds(plan, speeds)
    except InputError as exc:
        raise InputError(f"--speeds {run_dir}: {exc}") from None


def _cmd(args: argparse.Namespace) -> int:

    plan = plan_experiment(args.experiment)  # bad input: an InputError, printed once by testbed.cli.main
    if args.speeds is not None:
        plan = _with_speeds(plan, args.speeds)
        console.print(f"speeds of {args.speeds}: {plan.notes[-1]}", markup=False, highlight=False)
    if args.policy is not None:
        check_policy(args.policy, "--policy")  # resolved and checked before anything runs
    if args.duration is not None:  # the same bounds the plan checked for the experiment's own duration
        check_load_bounds(plan.experiment, plan.weights, args.duration, Path(plan.base_dir))
    if args.runs_dir and Path(args.runs_dir).exists() and not Path(args.runs_dir).is_dir():
        raise InputError(f"--runs-dir {args.runs_dir}: exists and is not a directory")
    runs_dir = Path(args.runs_dir) if args.runs_dir else repo_path(plan.experiment.runs_dir)
    problem = runs_dir_problem(runs_dir)  # before simulating: the run directory is written at the end
    if problem:  # the exit code of testbed run's same check
        where = "--runs-dir" if args.runs_dir else f"runs_dir of {args.experiment}"
        raise RunFailure(f"{where}: {problem}; choose another --runs-dir (or runs_dir in the experiment)",
                         EXIT_BRINGUP)
    duration = args.duration or plan.experiment.duration_s
    late = events_after_end(plan.changes, duration)
    if late:
        console.print(f"note: {late}", markup=False, highlight=False)
    print_feasibility(plan)
    if plan.experiment.capture is not None:  # said, not skipped in silence
        console.print("note: the experiment's capture: section applies to an emulation only (the simulator has "
                      "no packets); no packet capture in this run", markup=False, highlight=False)
    _, s = runs.run_simulation(plan, Path(args.runs_dir) if args.runs_dir else None,
                               args.duration, args.seed, args.policy, console=console)
    if not s["queries"]:
        console.print("the run measured no query (exit code 5)", markup=False)
        return EXIT_NOTHING_MEASURED
    if s.get("all_failed"):
        console.print(f"error: {s['all_failed']} (exit code {EXIT_ALL_FAILED})", markup=False, highlight=False)
        return EXIT_ALL_FAILED
    return 0
