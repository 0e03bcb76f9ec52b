"""``testbed zoo add``: add a model of one's own (a LiteRT ``.tflite`` or a TensorFlow SavedModel)
to the model zoo, checked, hashed and profiled (:mod:`testbed.serve.zoo_add`).

    testbed zoo add my.tflite --family digits --variant digits_mine --accuracy 0.95 \\
        --accuracy-source "measured on the digits held-out split, examples/own_model/train.py"

An experiment then serves it like any variant: ``models: [digits_mine]`` on a cluster (a
``.tflite`` needs ``server: {runtime: litert}``, a SavedModel the default ``tensorflow``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.cli.common import console, plain_help
from testbed.core.util import REPO_ROOT
from testbed.serve import profiler, zoo_add

DEFAULT_ZOO = REPO_ROOT / "models" / "zoo"


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _ints(text: str) -> tuple[int, ...]:
    vals = _floats(text)
    if any(v != int(v) for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers only")
    return tuple(int(v) for v in vals)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``zoo`` subcommand and its ``add``."""
    p = subparsers.add_parser("zoo", help="the model zoo: add a model of one's own",
                              description=plain_help(__doc__.split("\n\n")[0]))
    sub = p.add_subparsers(dest="zoo_cmd", required=True)
    a = sub.add_parser("add", help="add a .tflite or SavedModel as a new variant: checked, hashed, profiled",
                       description=plain_help(zoo_add.__doc__.split("\n\n")[0]),
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("file", type=Path, help="a LiteRT .tflite file or a TensorFlow SavedModel directory")
    a.add_argument("--family", required=True, help="the application family it serves (digits, parity, cancer, ...)")
    a.add_argument("--variant", required=True, help="the new variant's name (what experiments put in models:)")
    a.add_argument("--accuracy", required=True, type=float, help="its top-1 accuracy, a fraction in [0, 1]")
    a.add_argument("--accuracy-source", required=True, help="where the accuracy comes from (paper, measurement)")
    a.add_argument("--zoo-dir", type=Path, default=DEFAULT_ZOO, help="the zoo")
    a.add_argument("--profiles-dir", type=Path, default=None,
                   help="where its profile goes (default: the folder 'profiles' next to the zoo)")
    a.add_argument("--force", action="store_true", help="replace a variant of that name added before")
    m = zoo_add.Measuring()
    a.add_argument("--shares", type=_floats, default=m.shares, help="CPU shares to profile at [cores]")
    a.add_argument("--batches", type=_ints, default=m.batches, help="batch sizes to profile")
    a.add_argument("--samples", type=int, default=m.samples, help="timed calls per back-to-back measurement")
    a.add_argument("--isolated-samples", type=int, default=m.isolated_samples,
                   help="timed calls per isolated measurement (fractional shares)")
    a.add_argument("--max-seconds", type=float, default=m.max_seconds,
                   help=f"stop a measurement after this long once it has {profiler.MIN_SAMPLES} samples")
    a.add_argument("--warmup", type=int, default=m.warmup, help="untimed calls before each measurement")
    a.add_argument("--no-cgroup", action="store_true", help="no CPU quota: profile share 1 only, at full speed")
    a.add_argument("--handling-n", type=int, default=m.handling_n,
                   help="queries of the request-handling measurement (>= 100)")
    a.set_defaults(func=_add)


def _add(args: argparse.Namespace) -> int:
    measuring = zoo_add.Measuring(shares=args.shares, batches=args.batches, samples=args.samples,
                                  isolated_samples=args.isolated_samples, max_seconds=args.max_seconds,
                                  warmup=args.warmup, use_cgroup=not args.no_cgroup, handling_n=args.handling_n)
    req = zoo_add.AddRequest(source=args.file, family=args.family, variant=args.variant, accuracy=args.accuracy,
                             accuracy_source=args.accuracy_source, zoo_dir=args.zoo_dir,
                             profiles_dir=args.profiles_dir or zoo_add.default_profiles_dir(args.zoo_dir),
                             force=args.force, measuring=measuring)
    res = zoo_add.add_model(req, log=lambda msg: console.print(msg, markup=False, highlight=False))
    for w in res.warnings:
        console.print(f"warning: {w}", style="yellow", markup=False, highlight=False)
    e = res.entry
    runtime = "litert" if e.get("tflite") else "tensorflow"
    console.print(f"added {res.variant!r} (family {e['family']}, {runtime}, {e['params']} params, accuracy "
                  f"{e['accuracy']:g} declared"
                  + (f", {res.measured['accuracy']:.4f} measured on {res.measured['n']} held-out samples"
                     if res.measured else "") + ")", markup=False, highlight=False)
    for path in res.written:
        console.print(f"  wrote {path}", markup=False, highlight=False)
    serve = "server: {runtime: litert}, " if runtime == "litert" else ""
    console.print(f"serve it: a cluster with {serve}models: [{res.variant}]"
                  + ("" if args.zoo_dir.resolve() == DEFAULT_ZOO.resolve() else
                     f"; the experiment's zoo_dir: {req.zoo_dir}, profiles_dir: {req.profiles_dir}"),
                  markup=False, highlight=False)
    return 0
