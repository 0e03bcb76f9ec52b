"""The ``testbed`` command: ``plan``, ``run`` and ``cleanup``.

Exit codes: 0 success; 2 invalid input (experiment, topology, plan); 3 the emulation failed a
self-check or a component did not come up; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.config import ConfigError
from testbed.plan import Plan, PlanError, plan_experiment
from testbed.topology import TopologyError

console = Console(width=None if sys.stdout.isatty() else 160)


def print_plan(plan: Plan) -> None:
    """Print the resolved plan as tables: switches, links, hosts, expected paths, notes."""
    exp = plan.experiment
    console.print(f"[bold]Experiment[/bold] {exp.name}: topology {plan.topology_name!r}, "
                  f"{len(plan.switches)} switches, {len(plan.links)} links, {len(plan.hosts)} hosts, "
                  f"policy {exp.policy}, duration {exp.duration_s:g} s, seed {exp.seed}")
    t = Table(title="Switches")
    for col in ("name", "DPID", "label", "lat", "lon"):
        t.add_column(col)
    for s in plan.switches:
        t.add_row(s.name, f"{s.dpid:016x}", s.label,
                  "-" if s.lat is None else f"{s.lat:.2f}", "-" if s.lon is None else f"{s.lon:.2f}")
    console.print(t)
    label = {s.name: s.label for s in plan.switches}
    t = Table(title="Links (one-way delay)")
    for col in ("#", "a", "b", "km", "delay ms", "delay from", "bandwidth Mbit/s", "loss %"):
        t.add_column(col, justify="right" if col not in ("a", "b", "delay from") else "left")
    for lk in plan.links:
        t.add_row(str(lk.index), f"{lk.a} ({label[lk.a]})", f"{lk.b} ({label[lk.b]})",
                  "-" if lk.km is None else f"{lk.km:.0f}", f"{lk.delay_ms:.3f}", lk.delay_source,
                  f"{lk.bandwidth_mbps:g}", f"{lk.loss_pct:g}")
    console.print(t)
    t = Table(title="Hosts")
    for col in ("name", "role", "tier", "site", "switch", "IP", "MAC", "CPU cores", "models"):
        t.add_column(col)
    for h in plan.hosts:
        t.add_row(h.name, h.role, h.tier or "-", h.site, h.switch, h.ip, h.mac,
                  "-" if h.cpu_cores is None else f"{h.cpu_cores:g}", ", ".join(h.models) or "-")
    console.print(t)
    t = Table(title="Paths source -> cluster (least one-way delay)")
    for col in ("source", "cluster", "hops", "switches", "one-way ms", "expected RTT ms"):
        t.add_column(col, justify="right" if "ms" in col or col == "hops" else "left")
    for p in plan.paths:
        t.add_row(p.source, p.cluster, str(len(p.switches) - 1), " > ".join(p.switches),
                  f"{p.one_way_ms:.3f}", f"{p.rtt_ms:.3f}")
    console.print(t)
    if plan.notes:
        console.print("[bold]Notes[/bold]")
        for n in plan.notes:
            console.print(f"  - {n}")


def _cmd_plan(args: argparse.Namespace) -> int:
    plan = plan_experiment(args.experiment)
    if args.json:
        import json

        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print_plan(plan)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from testbed.run import run_experiment

    plan = plan_experiment(args.experiment)
    overrides = {}
    if args.duration is not None:
        overrides["duration_s"] = args.duration
    if args.link_emulator is not None:
        overrides["link_emulator"] = args.link_emulator
    return run_experiment(plan, console=console, runs_dir=args.runs_dir,
                          base_dir=args.experiment.parent, **overrides)


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from testbed.emulation.cleanup import RunLockedError, cleanup

    try:
        removed = cleanup(verbose=True)
    except (RunLockedError, PermissionError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))} (testbed cleanup needs root and no active run)")
        return 2
    console.print(f"cleanup: removed {removed} leftover item(s) of earlier runs")
    return 0


def _positive_s(text: str) -> float:
    value = float(text)
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be > 0 s")
    return value


def _command_modules() -> list:
    """The further subcommands: each module of :mod:`testbed.commands` has ``register(subparsers)``,
    which adds its parser with ``func(args) -> exit code`` as default. Modules import cheaply
    (no TensorFlow at import)."""
    import importlib
    import pkgutil

    import testbed.commands as pkg

    return [importlib.import_module(f"testbed.commands.{m.name}")
            for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``testbed`` console command."""
    ap = argparse.ArgumentParser(prog="testbed", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="print the resolved plan of an experiment; builds nothing, needs no root")
    p.add_argument("experiment", type=Path)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("run", help="emulate the experiment (root): Mininet + Ryu + TensorFlow servers")
    p.add_argument("experiment", type=Path)
    p.add_argument("--duration", type=_positive_s, help="override the load duration, in s (> 0)")
    p.add_argument("--link-emulator", choices=["auto", "netem", "userspace"], help="override emulation.link_emulator")
    p.add_argument("--runs-dir", type=Path, help="where run directories go (default: the experiment's runs_dir)")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("cleanup", help="remove what an interrupted or crashed run left behind (ours only)")
    p.set_defaults(func=_cmd_cleanup)
    for mod in _command_modules():
        mod.register(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, PlanError, TopologyError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
