"""``testbed evaluate EXPERIMENT.yaml [EXPERIMENT.yaml ...]``: ASET (default the general checkpoint)
against every static policy, the fresh-state reference, and optionally the per-source mix, the
causal planner and the oracle, on any experiment files (:mod:`testbed.aset.general_eval`).

``testbed evaluate ASET_CONFIG.yaml``: the headroom of every scenario (every static policy, the
per-source static mix, the clairvoyant switching oracle; with --causal K the causal planner) and ASET
against them, over seeds in the simulator, confirmed on fresh seeds; tables of success ratio (mean ±
95 % CI, t-distribution), the paired differences and a plot (see :mod:`testbed.aset.evaluate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.aset.evaluate import agreement_markdown, evaluate, results_markdown, summary_markdown
from testbed.aset.general_eval import MIN_SEEDS, evaluate_experiments
from testbed.aset.general_eval import results_markdown as general_results_markdown
from testbed.cli.common import console, plain_help
from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT
from testbed.plan.policies import aset_actions, load_aset
from testbed.spec.aset import (
    MAX_CAUSAL_SAMPLES,
    MAX_EPISODE_S,  # one bound for evaluation.duration and --duration
)
from testbed.spec.experiment import DEFAULT_ASET_CHECKPOINT
from testbed.spec.schema import load_yaml_file
from testbed.spec.units import UnitError, parse_duration_arg_s

#: ``--duration``'s help: the range :func:`_episode_s` accepts (and the window rule evaluate checks).
DURATION_HELP = (f"override the simulated time per run: seconds (40) or with its unit (40s); more than 0 and at most "
                 f"1 h ({MAX_EPISODE_S:g} s), a whole number of decision windows (at least one)")


def _episode_s(text: str) -> float:
    """``--duration``: seconds or with a unit (:func:`testbed.spec.units.parse_duration_arg_s`, as
    :func:`testbed.cli.common.duration_arg`), in (0, :data:`MAX_EPISODE_S`] s: the range
    :data:`DURATION_HELP` and the message say (the decision windows are checked by
    :func:`testbed.aset.evaluate.check_durations`, which knows them).

    Raises:
        argparse.ArgumentTypeError: not a duration, or outside the range (naming it).
    """

    try:
        v = parse_duration_arg_s(text, item="--duration")
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < v <= MAX_EPISODE_S:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be in (0, {MAX_EPISODE_S:g}] s (at most 1 h: "
                                         f"every figure holds one run's queries in memory)")
    return v


def _int_at_least(n: int):
    def parse(text: str) -> int:
        v = int(text)
        if v < n:
            raise argparse.ArgumentTypeError(f"{text!r}: need an integer >= {n}")
        return v
    return parse


def _causal_samples(text: str) -> int:
    """``--causal K``: an integer in [0, MAX_CAUSAL_SAMPLES]."""

    v = _int_at_least(0)(text)
    if v > MAX_CAUSAL_SAMPLES:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_CAUSAL_SAMPLES} sampled futures (8 take about "
                                         f"5 min per scenario and seed)")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="headroom (statics, mix, oracle) and ASET on the scenarios (simulator)",
                              description=plain_help(__doc__))
    p.add_argument("config", help="ASET config YAML with an 'evaluation:' section, or experiment files")
    p.add_argument("more", nargs="*", help="further experiment files (with experiment files only)")
    p.add_argument("--checkpoint", default=None,
                   help="with experiment files: the ASET checkpoint (default models/aset/general)")
    p.add_argument("--mix", type=_int_at_least(0), default=0, metavar="N",
                   help="with experiment files: also the per-source static mix, chosen on seeds 1..N (0: off)")
    p.add_argument("--oracle", type=_int_at_least(0), default=0, metavar="N",
                   help="with experiment files: the clairvoyant oracle (and with --causal K the causal planner) "
                        "on seeds 1..N (0: off)")
    p.add_argument("--out", default=None, help="with experiment files: results folder (default runs/aset-eval/files)")
    p.add_argument("--seeds", type=_int_at_least(2), default=None, help="override evaluation.seeds (tuning seeds)")
    p.add_argument("--fresh-seeds", type=_int_at_least(0), default=None, help="override evaluation.fresh_seeds")
    p.add_argument("--duration", type=_episode_s, default=None, help=DURATION_HELP)
    p.add_argument("--headroom", action="store_true", help="headroom only (no checkpoint needed: before training)")
    p.add_argument("--specialised", action="store_true",
                   help="ASET = the checkpoint specialised to each scenario (testbed train --specialise); "
                        "not with --headroom, which runs no checkpoint")
    p.add_argument("--causal", type=_causal_samples, default=None, metavar="K",
                   help="also the causal planner, K sampled futures per decision, on the oracle's seeds "
                        "(override evaluation.causal_samples; 0: off; ~5 min per scenario and seed at K=8)")
    p.add_argument("--workers", type=_int_at_least(1), default=2, help="parallel workers (default 2)")
    p.add_argument("--backend", choices=["process", "ray"], default="process", help="parallel backend")
    p.add_argument("--ray-address", default=None, help="a Ray cluster (HOST:PORT or auto); default: local")
    p.set_defaults(func=_cmd)


#: An ASET config to name when given an experiment file (it has an ``evaluation:`` section).
EXAMPLE_CONFIG = "experiments/aset-train.yaml"
#: Top-level keys only an experiment file has (testbed.spec.experiment.Experiment), never an ASET config.
EXPERIMENT_KEYS = ("topology", "clusters", "workload")


def _refuse_an_experiment_file(path: str) -> None:
    """An experiment file given where an ASET config belongs is named as such, with a config to
    use instead (it printed one 'unknown key' line per key of the experiment).

    Raises:
        testbed.core.errors.InputError: ``path`` is an experiment file.
    """

    import yaml


    try:
        data = load_yaml_file(path)
    except (OSError, ValueError, yaml.YAMLError):  # unreadable or not YAML: the config loader says so
        return
    if isinstance(data, dict) and all(k in data for k in EXPERIMENT_KEYS):
        raise InputError(f"{path} is an experiment file (it has {', '.join(EXPERIMENT_KEYS)}); testbed evaluate takes "
                         f"an ASET config with an 'evaluation:' section, such as {EXAMPLE_CONFIG}, whose "
                         f"training.scenarios name the experiments it runs")


def _is_experiment(path: str) -> bool:
    try:
        _refuse_an_experiment_file(path)
    except InputError:
        return True
    return False


def _experiments(args: argparse.Namespace) -> int:
    """``testbed evaluate`` on experiment files (:func:`testbed.aset.general_eval.evaluate_experiments`).

    Raises:
        InputError: a file that is not an experiment, or an option of the config form."""
    files = [args.config, *args.more]
    bad = [f for f in files if not _is_experiment(f)]
    if bad:
        raise InputError(f"{', '.join(bad)}: not experiment files (give experiment files only, or one ASET config)")
    other = [o for o, v in (("--fresh-seeds", args.fresh_seeds), ("--headroom", args.headroom or None),
                            ("--specialised", args.specialised or None)) if v is not None]
    if other:
        raise InputError(f"{', '.join(other)}: options of an ASET config's evaluation, not of experiment files")
    ckpt = Path(args.checkpoint or DEFAULT_ASET_CHECKPOINT)
    ckpt = ckpt if ckpt.is_absolute() else REPO_ROOT / ckpt
    rows = evaluate_experiments(files, checkpoint=ckpt, seeds=args.seeds or MIN_SEEDS, duration_s=args.duration,
                                mix_seeds=args.mix, oracle_seeds=args.oracle, causal_samples=args.causal or 0,
                                workers=args.workers, backend="ray" if args.ray_address else args.backend,
                                ray_address=args.ray_address, out=Path(args.out or "runs/aset-eval/files"),
                                progress=lambda m: console.print(m, markup=False, highlight=False))
    console.print(general_results_markdown(rows), markup=False, highlight=False)
    return 0


def _cmd(args: argparse.Namespace) -> int:
    if _is_experiment(args.config):
        return _experiments(args)
    if args.more or args.checkpoint or args.mix or args.oracle or args.out:
        raise InputError(f"{args.config}: an ASET config takes no further files, --checkpoint, --mix, --oracle or "
                         f"--out (its evaluation: section says what runs)")
    _refuse_an_experiment_file(args.config)
    cfg, base = load_aset(args.config)
    if cfg.evaluation is None:
        raise InputError(f"{args.config}: no 'evaluation:' section")
    try:
        res = evaluate(cfg, base, seeds=args.seeds, duration_s=args.duration, workers=args.workers, console=console,
                       backend="ray" if args.ray_address else args.backend, ray_address=args.ray_address,
                       headroom_only=args.headroom, fresh_seeds=args.fresh_seeds, specialised=args.specialised,
                       causal_samples=args.causal)
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from None
    console.print(summary_markdown(res.table), markup=False, highlight=False)
    console.print(results_markdown(res.table, aset_actions(cfg)), markup=False, highlight=False)
    if res.agreement:
        console.print(agreement_markdown(res.agreement), markup=False, highlight=False)
    console.print(f"results: {res.out_dir / 'results.md'}, {res.out_dir / 'results.png'}")
    return 0
