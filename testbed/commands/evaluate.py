"""``testbed evaluate ASET_CONFIG.yaml``: ASET against every static policy on the scenarios over
several seeds in the simulator; a table of success ratio (mean ± 95 % CI, t-distribution), the
paired difference to the best static policy, and a plot (see :mod:`testbed.aset.evaluate`)."""

from __future__ import annotations

import argparse


def _int_at_least(n: int):
    def parse(text: str) -> int:
        v = int(text)
        if v < n:
            raise argparse.ArgumentTypeError(f"{text!r}: need an integer >= {n}")
        return v
    return parse


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="ASET vs every static policy on the scenarios (simulator)",
                              description=__doc__)
    p.add_argument("config", help="ASET config YAML with an 'evaluation:' section")
    p.add_argument("--seeds", type=_int_at_least(2), default=None, help="override evaluation.seeds")
    p.add_argument("--duration", type=float, default=None, help="override the simulated seconds per run")
    p.add_argument("--workers", type=_int_at_least(1), default=2, help="parallel processes (default 2)")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    from rich.table import Table

    from testbed.aset.config import load_aset_config
    from testbed.aset.evaluate import ASET, evaluate
    from testbed.cli import console

    cfg, base = load_aset_config(args.config)
    if cfg.evaluation is None:
        console.print(f"[red]error:[/red] {args.config}: no 'evaluation:' section")
        return 2
    try:
        res = evaluate(cfg, base, seeds=args.seeds, duration_s=args.duration, workers=args.workers,
                       console=console)
    except FileNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    t = Table(title="Success ratio % (mean ± 95% CI over seeds)")
    pols = [p for p in res.table[0] if isinstance(res.table[0][p], tuple) and len(res.table[0][p]) == 3]
    for col in ["scenario", *pols, "ASET - best"]:
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for row in res.table:
        cells = [row["scenario"]]
        for p in pols:
            m, h, _ = row[p]
            s = f"{100 * m:.2f}±{100 * h:.2f}"
            cells.append(f"[bold]{s}[/bold]" if p in (row["best_static"], ASET) else s)
        dm, dh = row["diff"]
        cells.append(f"{100 * dm:+.2f}±{100 * dh:.2f}")
        t.add_row(*cells)
    console.print(t)
    console.print(f"results: {res.out_dir / 'results.md'}, {res.out_dir / 'results.png'}")
    return 0
