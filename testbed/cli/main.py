"""The ``testbed`` command: plan, run, cleanup, compare, evaluate, generate, new-experiment, profile,
report, simulate, specialize, sweep, train and zoo.

``plan``, ``run`` and ``cleanup`` are here; the others are one module each in :mod:`testbed.cli`
(:data:`COMMAND_MODULES`).

Exit codes (:mod:`testbed.core.errors`): 0 success; 2 invalid input (nothing was built); 3 a
precondition or self-check failed, or a component did not come up; 4 a component died during the
run; 5 the run measured nothing; 130 interrupted (Ctrl-C).

Errors are handled in one place, :func:`main`: every :class:`testbed.core.errors.TestbedError` is
printed once, as plain text, and its exit code returned. Console output never interprets text
as markup: the shared :data:`console` has markup off, so labels, names and file contents (which
may hold ``[/bold]`` and the like) print verbatim; our own styling goes through ``style=``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from testbed.agent.live import check_agents
from testbed.aset.scenarios import resolve, training_scenarios
from testbed.cli import (
    compare,
    evaluate,
    generate,
    new_experiment,
    profile,
    report,
    simulate,
    specialize,
    sweep,
    train,
    zoo,
)
from testbed.cli.common import DURATION_HELP, RUNS_DIR_HELP, console, duration_arg, plain_help, print_feasibility
from testbed.core.errors import EXIT_INTERRUPTED, InputError, TestbedError
from testbed.core.plugins import DEFAULT_TIMEOUT_S, TIMEOUT_ENV
from testbed.emu.cleanup import cleanup
from testbed.plan.build import Plan, plan_experiment
from testbed.plan.dilation import check_dilation, with_time_dilation
from testbed.plan.policy_resolution import load_aset
from testbed.plan.resolved import PlanError
from testbed.results.runs import run_emulation
from testbed.results.twin_comparison import twin_line
from testbed.spec.schema import load_yaml_file

#: The console every subcommand prints to. ``markup=False``: ``[...]`` in a string is printed as
#: it is, never as console markup (untrusted text: labels, names, file contents, error messages).
#: ``soft_wrap=True``: a line is never broken by the console (a long path in a message stays whole,
#: and a message stays one line to grep); tables still fit the width.


def plain(text: object) -> Text:
    """``text`` as a rich Text that is printed verbatim whatever the console's settings."""
    return Text(str(text))


def _table(title: str, columns: list[str], rows: list[list[object]], right: set[str] = frozenset()) -> Table:
    t = Table(title=plain(title))
    for col in columns:
        t.add_column(plain(col), justify="right" if col in right else "left", overflow="fold")
    for row in rows:
        t.add_row(*(plain(c) for c in row))
    return t


def print_plan(plan: Plan, out: Console | None = None) -> None:
    """Print the resolved plan as tables: switches, links, hosts, expected paths, notes. Every
    cell is plain text (dataset labels may contain anything)."""
    out = out or console
    exp = plan.experiment
    head = Text("Experiment", style="bold")
    head.append(f" {exp.name}: topology {plan.topology_name!r}, {len(plan.switches)} switches, {len(plan.links)} "
                f"links, {len(plan.hosts)} hosts, policy {exp.policy}, duration {exp.duration_s:g} s, seed {exp.seed}"
                + (", time dilation auto (chosen from a measured warm-up when it runs)" if plan.dilation_auto else
                   f", time dilation {plan.time_dilation:g} (run {plan.time_dilation:g} x slower than the wall clock)"
                   if plan.time_dilation != 1.0 else ""), style="")
    out.print(head)
    out.print(_table("Switches", ["name", "DPID", "label", "lat", "lon"],
                     [[s.name, f"{s.dpid:016x}", s.label, "-" if s.lat is None else f"{s.lat:.2f}",
                       "-" if s.lon is None else f"{s.lon:.2f}"] for s in plan.switches]))
    label = {s.name: s.label for s in plan.switches}
    out.print(_table("Links (one-way delay)",
                     ["#", "a", "b", "km", "delay ms", "delay from", "bandwidth Mbit/s", "loss %"],
                     [[lk.index, f"{lk.a} ({label[lk.a]})", f"{lk.b} ({label[lk.b]})",
                       "-" if lk.km is None else f"{lk.km:.0f}", f"{lk.delay_ms:.3f}", lk.delay_source,
                       f"{lk.bandwidth_mbps:g}", f"{lk.loss_pct:g}"] for lk in plan.links],
                     right={"#", "km", "delay ms", "bandwidth Mbit/s", "loss %"}))
    out.print(_table("Hosts", ["name", "role", "tier", "site", "switch", "IP", "MAC", "CPU cores", "models"],
                     [[h.name, h.role, h.tier or "-", h.site, h.switch, h.ip, h.mac,
                       "-" if h.cpu_cores is None else f"{h.cpu_cores:g}", ", ".join(h.models) or "-"]
                      for h in plan.hosts]))
    out.print(_table("Paths source -> cluster (least one-way delay)",
                     ["source", "cluster", "hops", "switches", "one-way ms", "expected RTT ms"],
                     [[p.source, p.cluster, len(p.switches) - 1, " > ".join(p.switches), f"{p.one_way_ms:.3f}",
                       f"{p.rtt_ms:.3f}"] for p in plan.paths],
                     right={"hops", "one-way ms", "expected RTT ms"}))
    if plan.changes:
        out.print(_table("Events (the timeline both engines apply; s since the load starts)",
                         ["t s", "event", "kind", "target", "value"],
                         [[f"{c.t_s:g}", c.event if not c.step else f"{c.event}.{c.step}", c.kind,
                           " - ".join(c.link) if c.link else c.cluster or "-",
                           "-" if c.value is None else f"{c.value:g}"] for c in plan.changes],
                         right={"t s", "value"}))
    if plan.notes:
        out.print(Text("Notes", style="bold"))
        for n in plan.notes:
            out.print(plain(f"  - {n}"))


#: Top-level keys of an ASET config (testbed.spec.aset.AsetConfig) that no experiment has.
ASET_CONFIG_KEYS = frozenset({"agent", "training", "evaluation", "observation", "reward", "actions"})


def _plan_aset_config(path: Path) -> int:
    """``testbed plan`` on an ASET config (``experiments/aset-*.yaml``): the config validated, and
    its training scenarios planned and checked together (as ``testbed train`` does before it
    trains) and its evaluation scenarios planned; a line saying so."""

    cfg, base = load_aset(path)
    n_train = len(training_scenarios(cfg, base)[1]) if cfg.training is not None else 0
    evaluation = [plan_experiment(resolve(base, s)) for s in cfg.evaluation.scenarios] if cfg.evaluation else []
    console.print(f"{path}: an ASET config ({cfg.name}), valid: {n_train} training scenario(s) planned and checked "
                  f"together, {len(evaluation)} evaluation scenario(s) planned; `testbed train` and `testbed "
                  f"evaluate` run it", markup=False, highlight=False)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:

    try:
        top = load_yaml_file(args.experiment)
    except Exception:  # noqa: BLE001 - not YAML, not readable: load_experiment names the problem
        top = None
    if isinstance(top, dict) and ASET_CONFIG_KEYS & set(top) and "topology" not in top:
        return _plan_aset_config(args.experiment)
    plan = plan_experiment(args.experiment)
    check_agents(plan)  # what testbed run checks before bring-up
    if args.json:
        import json

        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(plan)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    plan = plan_experiment(args.experiment)
    if args.time_dilation is not None:  # a number, or auto: chosen by run_emulation from a measured warm-up
        plan = with_time_dilation(plan, args.time_dilation)
    overrides = {}
    if args.duration is not None:
        overrides["duration_s"] = args.duration
    if args.link_emulator is not None:
        overrides["link_emulator"] = args.link_emulator
    print_feasibility(plan)
    return run_emulation(plan, console=console, runs_dir=args.runs_dir, process_ends=True, strict=args.strict,
                         twin=twin_line, **overrides)


def _dilation_arg(text: str) -> float | str:
    """``--time-dilation``: ``auto`` or a number within 1 .. MAX_TIME_DILATION."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        k = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'auto'") from None
    try:
        return check_dilation(k)
    except PlanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _plugin_timeout_arg(text: str) -> str:
    """``--plugin-timeout``: a number of seconds >= 0 (0: no limit), as the environment variable's text."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time limit of a plug-in's import and plan-time checks is a "
                                         f"number of seconds >= 0 (0: no limit)")
    return text.strip()


def _cmd_cleanup(args: argparse.Namespace) -> int:

    try:
        removed = cleanup(verbose=True)
    except PermissionError as exc:
        raise InputError(f"{exc} (testbed cleanup needs root)") from None
    console.print(f"cleanup: removed {removed} leftover item(s) of earlier runs")
    return 0


#: The further subcommands: each module has ``register(subparsers)``, which adds its parser with
#: ``func(args) -> exit code`` as default. Modules import cheaply (no TensorFlow at import).
COMMAND_MODULES = (compare, evaluate, generate, new_experiment, profile, report, simulate, specialize, sweep, train,
                   zoo)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed", description=plain_help(__doc__.split("\n\n")[0].replace("\n", " ")))
    ap.add_argument("--plugin-timeout", type=_plugin_timeout_arg, metavar="S",
                    help=f"the time limit (s) of a plug-in's import and of its plan-time checks (policies, "
                         f"selectors of one's own; default {DEFAULT_TIMEOUT_S:g}, 0: none); sets {TIMEOUT_ENV}, "
                         f"which every process of a run inherits")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="print the resolved plan of an experiment; builds nothing, needs no root",
                       description="Validate an experiment (or an ASET config) and print what it resolves to: "
                                   "switches, links with their delays, hosts, paths and their RTTs, the events' "
                                   "timeline, and notes. Nothing is built; no root needed. Exit 2 names what is "
                                   "invalid.")
    p.add_argument("experiment", type=Path)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("run", help="emulate the experiment (root): Mininet + Ryu + inference servers",
                       description="Emulate an experiment on this machine (root): Mininet with Open vSwitch, a "
                                   "Ryu controller, real inference servers on CPU-limited cluster hosts and query "
                                   "sources; every query measured. Writes a run directory (records, summary, "
                                   "run.json) and prints the summary. Exit codes: README.md.")
    p.add_argument("experiment", type=Path)
    p.add_argument("--duration", type=duration_arg, help=DURATION_HELP)
    p.add_argument("--link-emulator", choices=["auto", "netem", "userspace"], help="override emulation.link_emulator")
    p.add_argument("--runs-dir", type=Path, help=RUNS_DIR_HELP)
    p.add_argument("--time-dilation", type=_dilation_arg, metavar="K|auto",
                   help="override emulation.time_dilation: run the emulated system K (1-100) times slower than the "
                        "wall clock, or 'auto': K chosen from a short measured warm-up of this experiment's load "
                        "(docs/dilation.md)")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when the run's own measurements say its time dilation was too small (the summary "
                        "says so in any case; docs/dilation.md, 'Too small a k')")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("cleanup", help="remove what an interrupted or crashed run left behind (ours only)")
    p.set_defaults(func=_cmd_cleanup)
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return ap


def _value_options(ap: argparse.ArgumentParser) -> set[str]:
    """The option strings (of ``ap`` and its subcommands) that take one value."""
    out: set[str] = set()
    stack = [ap]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif isinstance(action, argparse._StoreAction) and action.option_strings and action.nargs is None:
                out.update(action.option_strings)
    return out


def _attach_negative_values(argv: list[str], options: set[str]) -> list[str]:
    """``--duration -1s`` as ``--duration=-1s``: argparse takes a value that starts with ``-`` and
    is not a plain number for an option, and fails with "expected one argument"; attached, the
    value reaches the option's own check, which says what is wrong with it."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok, nxt = argv[i], argv[i + 1] if i + 1 < len(argv) else ""
        attach = tok in options and re.fullmatch(r"-\.?\d.*", nxt) is not None
        out.append(f"{tok}={nxt}" if attach else tok)
        i += 2 if attach else 1
    return out


class _PipeSafe:
    """Standard output that outlives its reader: once the reader has gone (``testbed ... | head``),
    writes are dropped instead of raising, so the command runs to its end and exits with its own
    code (a run keeps measuring); the closed pipe is replaced by /dev/null, as the Python docs advise
    (library/signal, "Note on SIGPIPE")."""

    def __init__(self, stream):
        self._stream, self.lost = stream, False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``testbed`` console command: the one place errors are printed."""
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    ap = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(_attach_negative_values(argv, _value_options(ap)))
    if args.plugin_timeout is not None:
        os.environ[TIMEOUT_ENV] = args.plugin_timeout  # read where a plug-in is loaded, here and in a run's processes
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # `testbed run` has its own during the run
    try:
        return args.func(args)
    except TestbedError as exc:
        console.print(Text("error: ", style="red") + plain(exc), soft_wrap=True)  # paths stay whole
        return exc.exit_code
    except KeyboardInterrupt:
        console.print(Text("interrupted", style="yellow"))
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM unwinds as Ctrl-C does (exit 130, what was measured kept, pool workers stopped): the
    README's exit codes promise it for every command (without it a sweep or an evaluation would die
    with 143 and leave its workers running)."""
    raise KeyboardInterrupt


__all__ = ["console", "main", "plain", "print_plan"]

if __name__ == "__main__":
    sys.exit(main())
