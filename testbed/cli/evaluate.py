"""``testbed evaluate EXPERIMENT.yaml [EXPERIMENT.yaml ...]`` or ``testbed evaluate ASET_CONFIG.yaml``:
ASET (default the general checkpoint) against every static policy and the references (the
per-source mix, the fresh-state reference; with --oracle N the clairvoyant oracle and, with
--causal K, the causal planner), in the simulator, under one protocol: everything chosen on the
tuning seeds, everything scored on evaluation seeds disjoint from them (overlaps are refused),
paired on common random numbers (:mod:`testbed.aset.evaluate`; docs/aset.md, "Evaluation").
An ASET config's ``evaluation:`` section gives the same settings in a file."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.aset.evaluate import Protocol, evaluate
from testbed.cli.common import console, int_at_least, plain_help
from testbed.core.errors import InputError
from testbed.core.util import repo_path
from testbed.model.policies import CATALOGUE
from testbed.plan.policy_resolution import aset_actions, load_aset
from testbed.spec.aset import (
    DEFAULT_EVALUATION_SEEDS,
    DEFAULT_TUNING_SEEDS,
    MAX_CAUSAL_SAMPLES,
    MAX_EPISODE_S,  # one bound for evaluation.duration and --duration
    parse_seeds,
)
from testbed.spec.experiment import DEFAULT_ASET_CHECKPOINT
from testbed.spec.schema import load_yaml_file
from testbed.spec.units import UnitError, parse_duration_arg_s

#: ``--duration``'s help: the range :func:`_episode_s` accepts (and the window rule evaluate checks).
DURATION_HELP = (f"override the simulated time per run: seconds (40) or with its unit (40s); more than 0 and at most "
                 f"1 h ({MAX_EPISODE_S:g} s), a whole number of decision windows (at least one)")

#: Where ``testbed evaluate`` of experiment files writes without ``--out`` (under the repository).
DEFAULT_FILES_OUT = "runs/aset-eval/files"


def _episode_s(text: str) -> float:
    """``--duration``: seconds or with a unit (:func:`testbed.spec.units.parse_duration_arg_s`), in
    (0, :data:`MAX_EPISODE_S`] s.

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


def _causal_samples(text: str) -> int:
    """``--causal K``: an integer in [0, MAX_CAUSAL_SAMPLES]."""
    v = int_at_least(0)(text)
    if v > MAX_CAUSAL_SAMPLES:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_CAUSAL_SAMPLES} sampled futures (8 take about "
                                         f"5 min per scenario and seed)")
    return v


def _seeds(count_from: int):
    def parse(text: str) -> list[int]:
        try:
            return parse_seeds(text, count_from=count_from)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _agent(text: str) -> tuple[str, str]:
    """(label, checkpoint) of a ``--checkpoint``: ``LABEL=PATH`` or ``PATH`` (its own label)."""
    label, sep, path = text.partition("=")
    return (label, path) if sep and label and path else (text, text)


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="ASET against every static policy and the references (simulator), "
                                               "chosen on tuning seeds, scored on evaluation seeds",
                              description=plain_help(__doc__))
    p.add_argument("config", help="experiment files, or one ASET config YAML with an 'evaluation:' section")
    p.add_argument("more", nargs="*", help="further experiment files")
    p.add_argument("--checkpoint", action="append", default=None, metavar="PATH",
                   help=f"the agent to evaluate (default {DEFAULT_ASET_CHECKPOINT}); repeat for several columns, "
                        f"each named by its path, or LABEL=PATH; {{stem}} in PATH stands for each scenario's file "
                        f"stem (a checkpoint per scenario, e.g. testbed specialize's)")
    p.add_argument("--headroom", action="store_true", help="no agent: the static policies and the references only")
    p.add_argument("--tuning-seeds", type=_seeds(DEFAULT_TUNING_SEEDS[0]), default=None, metavar="SEEDS",
                   help="seeds everything is chosen on: a range (1-5), a list (1,4,9) or a count (5 = 1-5); "
                        "default 1-5")
    p.add_argument("--seeds", type=_seeds(DEFAULT_EVALUATION_SEEDS[0]), default=None, metavar="SEEDS",
                   help="evaluation seeds, disjoint from the tuning seeds: a range (101-120), a list or a count "
                        "(20 = 101-120); default 101-120 (20, the protocol's least)")
    p.add_argument("--no-mix", action="store_true", help="skip the per-source mix")
    p.add_argument("--no-fresh", action="store_true", help="skip the fresh-state reference")
    p.add_argument("--oracle", type=int_at_least(0), default=None, metavar="N",
                   help="the clairvoyant oracle (and with --causal K the causal planner) on the first N evaluation "
                        "seeds (N >= 5; 0: off, the default)")
    p.add_argument("--causal", type=_causal_samples, default=None, metavar="K",
                   help="the causal planner with K sampled futures per decision, on the oracle's seeds "
                        "(~5 min per scenario and seed at K=8)")
    p.add_argument("--out", default=None, help=f"results folder (default {DEFAULT_FILES_OUT} of experiment files, or "
                                               f"the ASET config's evaluation.out_dir/<name>; a default is under the "
                                               f"repository whatever the current directory, as simulate's runs/)")
    p.add_argument("--duration", type=_episode_s, default=None, help=DURATION_HELP)
    p.add_argument("--workers", type=int_at_least(1), default=2, help="parallel workers (default 2)")
    p.add_argument("--backend", choices=["process", "ray"], default="process", help="parallel backend")
    p.add_argument("--ray-address", default=None, help="a Ray cluster (HOST:PORT or auto); default: local")
    p.set_defaults(func=_cmd)


#: Top-level keys only an experiment file has (testbed.spec.experiment.Experiment), never an ASET config.
EXPERIMENT_KEYS = ("topology", "clusters", "workload")


def _is_experiment(path: str) -> bool:
    import yaml

    try:
        data = load_yaml_file(path)
    except (OSError, ValueError, yaml.YAMLError):  # unreadable or not YAML: the loaders say so
        return True
    return isinstance(data, dict) and all(k in data for k in EXPERIMENT_KEYS)


def _cmd(args: argparse.Namespace) -> int:
    backend = "ray" if args.ray_address else args.backend
    if _is_experiment(args.config):
        files = [args.config, *args.more]
        bad = [f for f in files if not _is_experiment(f)]
        if bad:
            raise InputError(f"{', '.join(bad)}: not experiment files (give experiment files only, or one ASET config)")
        protocol = Protocol(tuning=args.tuning_seeds or list(DEFAULT_TUNING_SEEDS),
                            seeds=args.seeds or list(DEFAULT_EVALUATION_SEEDS), actions=list(CATALOGUE),
                            mix=not args.no_mix, fresh=not args.no_fresh, reference_seeds=args.oracle or 0,
                            causal_samples=args.causal or 0, duration_s=args.duration)
        out = Path(args.out) if args.out else repo_path(DEFAULT_FILES_OUT)
        checkpoints = args.checkpoint or [DEFAULT_ASET_CHECKPOINT]
    else:
        if args.more:
            raise InputError(f"{args.config}: an ASET config takes no further files (its evaluation.scenarios say "
                             f"what runs)")
        cfg, base = load_aset(args.config)
        ev = cfg.evaluation
        if ev is None:
            raise InputError(f"{args.config}: no 'evaluation:' section")
        files = [str(repo_path(s, base)) for s in ev.scenarios]
        protocol = Protocol(tuning=args.tuning_seeds or list(ev.tuning_seeds), seeds=args.seeds or list(ev.seeds),
                            actions=list(aset_actions(cfg)), mix=ev.mix and not args.no_mix,
                            fresh=ev.fresh and not args.no_fresh,
                            reference_seeds=ev.reference_seeds if args.oracle is None else args.oracle,
                            causal_samples=ev.causal_samples if args.causal is None else args.causal,
                            causal_min_t=ev.causal_min_t, horizon=ev.oracle_horizon,
                            duration_s=args.duration or ev.duration_s)
        out = Path(args.out) if args.out else repo_path(ev.out_dir, base) / cfg.name
        checkpoints = args.checkpoint or [str(repo_path(ev.checkpoint, base))]
    agents = {} if args.headroom else dict(_agent(c) for c in checkpoints)
    res = evaluate(files, protocol, out, agents=agents, workers=args.workers, backend=backend,
                   ray_address=args.ray_address, console=console)
    console.print(res.markdown, markup=False, highlight=False)
    console.print(f"results: {res.out / 'results.md'}, {res.out / 'results.json'}, {res.out / 'runs.csv'}",
                  markup=False, highlight=False)
    return 0
