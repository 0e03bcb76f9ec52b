"""``testbed compare RUN_DIR [--out DIR]``: an emulated run beside its simulated twin (the run's plan,
seed and duration in the simulator), stage by stage: where the engines part, and the success
difference with its interval (:mod:`testbed.results.twin_comparison`; docs/reports.md, "The twin report")."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.cli.common import console, plain_help
from testbed.results.twin_comparison import compare_run


def register(subparsers) -> None:
    """Add the ``compare`` subcommand."""
    p = subparsers.add_parser("compare", help="compare an emulated run with its simulated twin, stage by stage",
                              description=plain_help(__doc__))
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="an emulated run's folder (testbed run)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: RUN_DIR/compare): compare.html, compare.md, compare.json, figures/, "
                        "and simulated/ (the twin's run folder)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    result = compare_run(args.run_dir, args.out)  # bad input: an InputError, printed once by testbed.cli.main
    console.print(result["verdict"], markup=False, highlight=False)
    console.print(f"twin report: {result['html']} (Markdown: {result['markdown']}; every figure: {result['json']})",
                  markup=False, highlight=False)
    return 0
