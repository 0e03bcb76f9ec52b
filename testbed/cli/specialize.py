"""``testbed specialize EXPERIMENT.yaml --budget 10m --out CHECKPOINT [--seed N] [--workers N]``:
a checkpoint of ASET specialized for that experiment (:mod:`testbed.aset.specialize`): the
per-source static mix over every built-in policy, found on tuning seeds, and a gated ensemble that
corrects it. Use it with ``policy: aset`` and ``aset: {checkpoint: CHECKPOINT}`` in ``simulate``,
``evaluate`` and ``run``. The tuning seeds (``1000000 + 1000 x seed + k``) are recorded in the
checkpoint: evaluate it on other seeds."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from testbed.aset.specialize import Settings, specialize
from testbed.cli.common import bounded, console, plain_help
from testbed.cli.simulate import seed_arg
from testbed.spec.units import UnitError, parse_duration_arg_s


def _budget(text: str) -> float:
    """argparse type of ``--budget``: minutes (``10m``, ``1.5min``) or what ``--duration`` takes (s)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:m|min)\s*", text)
    try:
        v = float(m.group(1)) * 60 if m else parse_duration_arg_s(text, item="--budget")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if v < 10:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be at least 10 s")
    return v


def register(subparsers) -> None:
    """Add the ``specialize`` subcommand."""
    p = subparsers.add_parser("specialize", help="specialize ASET for one experiment within a time budget "
                                                 "(per-source plan + gated corrections) -> a checkpoint",
                              description=plain_help(__doc__))
    p.add_argument("experiment", type=Path)
    p.add_argument("--budget", type=_budget, default=600.0,
                   help="wall-clock budget: minutes (10m) or seconds (300s, 300) (default 10m)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint path without suffix (writes .npz and .json)")
    p.add_argument("--seed", type=seed_arg, default=1, help="specialization seed (tuning seeds, variants; default 1)")
    p.add_argument("--workers", type=bounded(int, 1, 256, "workers"), default=2,
                   help="parallel simulations (default 2)")
    p.add_argument("--margin", type=bounded(float, 0, 100, "points of margin"), default=None,
                   help="the gate's margin in points (default: the one chosen on the validation set)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="what the budget counts: wall time (default), or the CPU time of the workers / their number "
                        "(the wall time on idle cores: for a machine shared with other jobs)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    settings = Settings(clock=args.clock) if args.margin is None else Settings(margin=args.margin, clock=args.clock)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*cols, console=console, transient=False) as bar:
        overall = bar.add_task("budget", total=args.budget, status="")
        tasks: dict[str, int] = {}

        def progress(what: str, done: int, total: int, status: str) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total, status=status)
            bar.update(tasks[what], completed=done, total=total, status=status)
            bar.update(overall, completed=min(args.budget, bar.tasks[overall].elapsed or 0.0))

        rep = specialize(args.experiment, args.out, budget_s=args.budget, seed=args.seed, workers=args.workers,
                         settings=settings, progress=progress)
    best = rep.statics[rep.best_static]
    console.print(f"plan (tuning seeds {rep.tuning_seeds[0]}..{rep.tuning_seeds[-1]}): best static {rep.best_static} "
                  f"{100 * best:.2f} %; mix {100 * rep.mix_ratio:.2f} % ({100 * (rep.mix_ratio - best):+.2f} points; "
                  f"{len(rep.mix_moves)} moves over {rep.mix_candidates} candidates, {len(rep.mix_starts)} "
                  f"start{'s' if len(rep.mix_starts) != 1 else ''})")
    for r in rep.rounds:
        trail = r["plan_minus_agent_points"]
        console.print(f"round {r['round']}: {r['episodes']} episodes, {r['labels']} labelled states"
                      + (f", plan - agent {trail:+.2f} points" if trail is not None else ""))
    check = rep.check.get("agent_minus_plan_points")
    console.print(f"check (seeds {rep.check_seeds[0]}..{rep.check_seeds[-1]}): agent - plan "
                  f"{'n/a' if check is None else f'{check:+.2f} points'}; corrections "
                  f"{'on' if rep.corrections else 'off (the checkpoint is the plan)'}")
    for t in rep.truncated:
        console.print(f"truncated: {t}")
    console.print(f"wrote {args.out}.npz, {args.out}.json ({rep.wall_s:.0f} s wall, {rep.cpu_s:.0f} s CPU)")
    return 0
