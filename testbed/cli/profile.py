"""``testbed profile``: measure the zoo's service-time profiles (see :mod:`testbed.serve.profiler`).

    testbed profile          # every variant, both runtimes, shares 0.1,0.25,0.5,1,2, batches 1,8
    testbed profile --variants digits_small --runtimes tensorflow --shares 1 --batches 1 --samples 200
"""

from __future__ import annotations

import argparse

from testbed.cli.common import console, plain_help
from testbed.serve import profiler


def _run(args: argparse.Namespace) -> int:

    return profiler.main_args(args, log=lambda msg: console.print(msg, highlight=False, markup=False))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` subcommand."""

    p = subparsers.add_parser("profile", help="measure model service times per CPU share, batch size and runtime",
                              description=plain_help(profiler.__doc__.split("\n\n")[0]))
    profiler.add_arguments(p)
    p.set_defaults(func=_run)
