"""``testbed sweep EXPERIMENT.yaml... [--policies P,Q] [--seeds 5] [--jobs 2] --out DIR``: every policy x
experiment x seed through the simulator (or ``--emulate``: the emulation, root) in parallel
processes or on Ray (``--backend ray``: embedded local Ray; ``--ray-address HOST:PORT``: a cluster,
docs/scale-out.md); writes ``runs.csv``/``.parquet``, ``table.csv``, ``table.md`` (success ratio
mean +- 95% CI, latency percentiles, failure causes) and PNG plots to DIR. Each finished cell is
kept in ``DIR/cells/``: run the same command again and it skips them (resume)."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.cli.common import DURATION_HELP, console, duration_arg, plain_help
from testbed.core.distributed import DistributedError
from testbed.core.errors import EXIT_NOTHING_MEASURED, InputError, RunFailure
from testbed.core.plugins import normalize_ref, split_refs
from testbed.core.util import repeated, scenarios_problem
from testbed.model.policies import CATALOGUE
from testbed.plan.policy_resolution import check_policy
from testbed.results.sweep_runner import sweep
from testbed.spec.experiment import MAX_SEED, load_experiment


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="policies x scenarios x seeds in the simulator, with tables and plots",
                              description=plain_help(__doc__))
    p.add_argument("experiments", nargs="+", help="experiment YAML files (e.g. experiments/scenario-*.yaml)")
    p.add_argument("--policies", default="all",
                   help="comma-separated policies, or 'all' (the catalogue); a plug-in is an entry-point name or "
                        "package.module:callable, with parameters or not: closest,mypkg.sched:p2c(d=2)")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds (1..N), default 5")
    p.add_argument("--seed-base", type=int, default=1, help="first seed, default 1")
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes, or CPUs of the embedded Ray (default: CPU count)")
    p.add_argument("--backend", choices=("process", "ray"), default="process",
                   help="local process pool (default) or Ray; --ray-address implies ray")
    p.add_argument("--ray-address", default=None,
                   help="a running Ray cluster (HOST:PORT of its head, or 'auto'); default: embedded local Ray")
    p.add_argument("--emulate", action="store_true",
                   help="run every cell as an emulation (root; one per machine: Ray resource mininet=1)")
    p.add_argument("--link-emulator", choices=("auto", "netem", "userspace"), default=None,
                   help="with --emulate: as for testbed run")
    p.add_argument("--duration", type=duration_arg, default=None, help=DURATION_HELP)
    p.add_argument("--keep-runs", action="store_true", help="keep every run directory under OUT/runs")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=_cmd)


#: The most cells (experiments x policies x seeds) one sweep runs: every cell is planned in memory
#: before the first runs (10^8 seeds took the build VM's 24 GiB), and 10^5 simulated
#: cells are already days of CPU at seconds each.
MAX_SWEEP_CELLS = 100_000


def _check_arguments(args: argparse.Namespace) -> tuple[list[str], float | None]:
    """The policies and the duration override; every bad argument is an InputError naming it,
    before anything runs: unknown or no policies, seeds/jobs < 1, more than :data:`MAX_SWEEP_CELLS`
    cells, a negative seed base, an output
    path that is a file, the same experiment file twice, two experiments with one ``name`` (the
    tables key their rows by it, so their runs would be pooled)."""

    pols = list(CATALOGUE) if args.policies == "all" else split_refs(args.policies)
    if not pols:
        raise InputError(f"--policies: none given; known: {', '.join(CATALOGUE)}")
    pols = [normalize_ref(p) for p in pols]
    for p in pols:  # each resolved (a plug-in loaded and checked) before any cell runs
        check_policy(p, "--policies")
    twice_p = repeated(pols)
    if twice_p:  # its seeds would count twice in the table's mean and CI
        raise InputError(f"--policies: {twice_p[0]!r} is given twice")
    if not args.out.strip():
        raise InputError("--out: an empty path (name the output folder)")
    if args.seeds < 1 or (args.jobs is not None and args.jobs < 1):
        raise InputError("--seeds and --jobs must be >= 1")
    cells = len(args.experiments) * len(pols) * args.seeds
    if cells > MAX_SWEEP_CELLS:  # every cell is planned in memory before the first runs
        raise InputError(f"--seeds {args.seeds}: {len(args.experiments)} experiment(s) x {len(pols)} policies x "
                         f"{args.seeds} seeds = {cells} cells, more than the {MAX_SWEEP_CELLS} a sweep runs; lower "
                         f"--seeds (a sweep's folder can be extended with more seeds later)")
    if not 0 <= args.seed_base <= MAX_SEED - args.seeds + 1:  # the last seed, base + seeds - 1, <= MAX_SEED
        raise InputError(f"--seed-base {args.seed_base}: seeds {args.seed_base} .. {args.seed_base + args.seeds - 1} "
                         f"are not all in 0 .. {MAX_SEED}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise InputError(f"--out {args.out}: exists and is not a directory")
    names = [load_experiment(e).name for e in args.experiments]
    problem = scenarios_problem("experiments", args.experiments, names, "the sweep's tables")
    if problem:
        raise InputError(problem)
    return pols, args.duration


def _cmd(args: argparse.Namespace) -> int:

    pols, duration = _check_arguments(args)
    out = Path(args.out)
    try:
        table = sweep(args.experiments, pols, list(range(args.seed_base, args.seed_base + args.seeds)), out,
                      args.jobs, duration, args.keep_runs, console, backend=args.backend,
                      ray_address=args.ray_address, emulate=args.emulate, link_emulator=args.link_emulator)
    except DistributedError as exc:
        raise InputError(str(exc)) from None
    except RunFailure as exc:
        console.print(f"error: {exc}; the cells finished so far are kept: run again to resume")
        return exc.exit_code
    console.print((out / "table.md").read_text(), markup=False, highlight=False)
    console.print(f"{len(table)} rows; results in {out}", markup=False, highlight=False)
    return _nothing_measured(out, console)


def _nothing_measured(out: Path, console) -> int:
    """Exit code 5 (:data:`testbed.core.errors.EXIT_NOTHING_MEASURED`), naming them, when a cell of the
    sweep measured no query (its row's figures are empty, as ``testbed simulate`` would exit 5 on
    that run); else 0."""
    import pandas as pd


    runs = pd.read_parquet(out / "runs.parquet")
    empty = runs[runs["queries"] == 0]
    if empty.empty:
        return 0
    cells = ", ".join(f"{r.scenario} / {r.policy} / seed {r.seed}" for r in empty.head(5).itertuples())
    more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
    console.print(f"error: {len(empty)} of {len(runs)} cells measured no query ({cells}{more}): their rows are "
                  f"empty; lengthen --duration or raise the rate", markup=False, highlight=False)
    return EXIT_NOTHING_MEASURED
