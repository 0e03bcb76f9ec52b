"""``testbed generate --split train|held_out|validation|test --seeds 1-20 [--out DIR]``: write generated scenarios
(:mod:`testbed.aset.generator`), each planned before it is written.

At most :data:`MAX_SEEDS` seeds per command (each scenario is drawn and planned, about 0.3-1 s
here, and written, ~3 KB): the count is checked before anything is drawn, the number to write is
said up front, and a progress bar shows the time left.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from testbed.aset.generator import write_scenarios
from testbed.cli.common import console
from testbed.core.errors import InputError

#: The most seeds one ``testbed generate`` writes: about 1-3 h of drawing and planning here (0.3-1 s
#: per scenario) and 30 MB of files; write more in several commands (``--seeds 1-10000``, then
#: ``--seeds 10001-20000``).
MAX_SEEDS = 10_000


def _seeds(text: str) -> list[int]:
    """``--seeds``: ranges and single seeds (``1-20``, ``1,4,9``, ``1-5,9``), each >= 0, at most
    :data:`MAX_SEEDS` in all (counted before the list is built)."""
    bounds: list[tuple[int, int]] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            bounds.append((int(lo), int(hi or lo)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: expected e.g. 1-20 or 1,4,9") from None
    if any(lo > hi for lo, hi in bounds):
        raise argparse.ArgumentTypeError(f"seeds {text!r}: a range goes from the smaller seed to the larger (1-20)")
    n = sum(hi - lo + 1 for lo, hi in bounds)
    if not bounds or n == 0 or min(lo for lo, _ in bounds) < 0:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: need at least one seed >= 0")
    if n > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: {n:,} seeds; at most {MAX_SEEDS:,} per command (each "
                                         f"scenario is drawn and planned, 0.3-1 s here: {MAX_SEEDS:,} take 1-3 h); "
                                         f"write more in several commands")
    return [s for lo, hi in bounds for s in range(lo, hi + 1)]


def register(subparsers) -> None:
    """Add the ``generate`` subcommand."""
    what = "write seeded generated scenarios (topohub topologies, clusters, sources, zoo applications, loads, events)"
    p = subparsers.add_parser("generate", help=what + " for ASET",
                              description=what[0].upper() + what[1:] + " for training and evaluating ASET: one "
                              "experiment file per seed, the same file for the same split and seed (at most 10,000 "
                              "seeds at once).")
    p.add_argument("--split", choices=["train", "held_out", "validation", "test"], default="held_out",
                   help="the training distribution, the held-out set (held-out topologies and event patterns), or "
                        "the frozen validation and test sets (topologies training never sees)")
    p.add_argument("--seeds", type=_seeds, default=_seeds("1-8"),
                   help=f"seeds, e.g. 1-20 or 1,4,9 (default 1-8; at most {MAX_SEEDS:,})")
    p.add_argument("--out", type=Path, default=None, help="output folder (default experiments/generated/<split>)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = args.out or Path("experiments/generated") / args.split.replace("_", "-")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: not a folder")
    n = len(args.seeds)
    console.print(f"generating {n} scenario(s) of split {args.split} into {out} (each drawn and planned, 0.3-1 s "
                  f"here; the time left is shown)", markup=False, highlight=False)
    with Progress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=console, transient=n == 1) as prog:
        task = prog.add_task("generate", total=n)
        for seed in args.seeds:
            for p in write_scenarios(out, args.split, [seed]):
                prog.console.print(f"wrote {p}", markup=False, highlight=False)
            prog.advance(task)
    return 0
