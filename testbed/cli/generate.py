"""``testbed generate --split train|held_out --seeds 1-20 [--out DIR]``: write generated scenarios
(:mod:`testbed.aset.generator`), each planned before it is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.aset.generator import write_scenarios
from testbed.cli.common import console
from testbed.core.errors import InputError


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: expected e.g. 1-20 or 1,4,9") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: need at least one seed >= 0")
    return out


def register(subparsers) -> None:
    """Add the ``generate`` subcommand."""
    p = subparsers.add_parser("generate", help="write seeded generated scenarios (topohub topologies, clusters, "
                                               "sources, zoo applications, loads, events) for ASET")
    p.add_argument("--split", choices=["train", "held_out"], default="held_out",
                   help="the training distribution, or the held-out set (held-out topologies and event patterns)")
    p.add_argument("--seeds", type=_seeds, default=_seeds("1-8"), help="seeds, e.g. 1-20 or 1,4,9 (default 1-8)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default experiments/generated/<split>)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = args.out or Path("experiments/generated") / args.split.replace("_", "-")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: not a folder")
    for p in write_scenarios(out, args.split, args.seeds):
        console.print(f"wrote {p}")
    return 0
