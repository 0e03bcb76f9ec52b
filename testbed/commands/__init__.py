"""Subcommands of ``testbed`` beyond plan/run/cleanup, one module each.

A module here defines ``register(subparsers) -> None``, which adds its parser and sets
``func(args: argparse.Namespace) -> int`` (the exit code) as its default. :mod:`testbed.cli` finds
the modules itself and handles ``ConfigError``/``PlanError``/``TopologyError`` (exit 2) and
Ctrl-C (exit 130); print with :data:`testbed.cli.console`.
"""
