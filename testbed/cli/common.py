"""Subcommands of ``testbed`` beyond plan/run/cleanup, one module each.

A module here defines ``register(subparsers) -> None``, which adds its parser and sets
``func(args: argparse.Namespace) -> int`` (the exit code) as its default. :mod:`testbed.cli.main` finds
the modules itself and handles ``ConfigError``/``PlanError``/``TopologyError`` (exit 2) and
Ctrl-C (exit 130); print with :data:`testbed.cli.main.console`.

:func:`duration_arg` is the one ``--duration`` of every command (run, simulate, sweep, evaluate);
:func:`plain_help` a docstring without its reST markup, for ``--help``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from rich.console import Console

from testbed.plan.checks import feasibility_warnings, overload_note
from testbed.plan.resolved import Plan
from testbed.spec.experiment import MAX_DURATION_S
from testbed.spec.units import UnitError, parse_duration_arg_s

#: The console of every command: no markup (text from files is data), no wrapping when piped.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, highlight=False, soft_wrap=True)

#: The help text of every ``--duration``.
DURATION_HELP = "override the load duration: seconds (30) or a number with its unit (30s, 500ms)"
#: The help text of every ``--runs-dir`` (run, simulate).
RUNS_DIR_HELP = ("where run directories go (default: the experiment's runs_dir, 'runs' unless set; a relative "
                 "runs_dir is under the repository, not next to the experiment file)")


def plain_help(doc: str | None) -> str:
    """A docstring as ``--help`` prints it: reST roles (``:mod:`x```) and inline literals
    (````x````) as plain text, so the console does not show the markup."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return re.sub(r"``([^`]+)``", r"\1", text)


def duration_arg(text: str) -> float:
    """argparse type of ``--duration`` in every command: seconds as a bare number or a number with
    its unit (:func:`testbed.spec.units.parse_duration_arg_s`), in (0, ``testbed.spec.experiment.MAX_DURATION_S``]
    s. Returns seconds."""

    try:
        value = parse_duration_arg_s(text, item="--duration")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be in (0, {MAX_DURATION_S:g}] s")
    return value


def bounded(kind: type[int] | type[float], low: float, high: float | None = None,
            unit: str = "") -> Callable[[str], int | float]:
    """argparse type of a number option (``kind``: int or float) in [``low``, ``high``] (no upper
    bound when ``high`` is None); ``unit`` names what is counted in the message (e.g. "workers")."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if v != v or v < low or (high is not None and v > high):  # v != v: NaN
            span = f">= {low:g}" if high is None else f"{low:g} .. {high:g}"
            raise argparse.ArgumentTypeError(f"{text!r}: need {noun} {span}{' ' + unit if unit else ''}")
        return v
    return parse


def int_at_least(n: int) -> Callable[[str], int]:
    """argparse type of an integer option that must be at least ``n``."""
    return bounded(int, n)  # type: ignore[return-value]


def print_feasibility(plan: Plan, out: Console | None = None) -> None:
    """Print the plan's zero-load feasibility lines (:func:`testbed.plan.checks.feasibility_warnings`)
    and its overload note (:func:`testbed.plan.checks.overload_note`), the ones ``testbed plan``
    lists under Notes, before a run or a simulation starts."""
    for line in feasibility_warnings(plan) + [n for n in (overload_note(plan),) if n]:
        (out or console).print(line if line.startswith("WARNING") else f"note: {line}", markup=False,
                               highlight=False)
