"""``testbed train ASET_CONFIG.yaml``: train an ASET agent in the simulator, one run per training
seed. ``general:`` (the general agent, :mod:`testbed.aset.general`): data episodes over generated
scenarios, the scorer's fit, the export. ``training.method: dqn`` (the paper's double DQN,
:mod:`testbed.aset.dqn`): TensorBoard logs, checkpoints, learning curves and the exported policy go
to ``training.out_dir/<name>/``. ``training.method: rollout`` (:mod:`testbed.aset.rollout`): the
rollout data set, loss curves and the exported policy, same folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.agent.checkpoint import checkpoint_files
from testbed.aset.episode import episode_windows
from testbed.aset.general import train_general
from testbed.aset.rollout import train_rollout, written_lines
from testbed.aset.scenarios import resolve, training_scenarios
from testbed.cli.common import console, int_at_least, plain_help
from testbed.cli.simulate import seed_arg
from testbed.core.errors import InputError, counted, naming_file
from testbed.plan.policy_resolution import load_aset
from testbed.spec.experiment import format_validation_error

_positive_int = int_at_least(1)


def _seed_list(text: str) -> list[int]:

    return [seed_arg(x.strip()) for x in text.split(",") if x.strip()] or [seed_arg(text)]


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train the ASET agent in the simulator (DQN, or rollout regression)",
                              description=plain_help(__doc__))
    p.add_argument("config", help="ASET config YAML (e.g. experiments/aset-train.yaml)")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="override training.steps (windows); DQN only")
    p.add_argument("--seeds", type=_seed_list, default=None, help="override training.seeds, e.g. 1,2,3")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="seeds trained at once (parallel processes; default 1); with training.method: rollout, "
                        "data episodes simulated at once (default training.rollout.workers)")
    p.add_argument("--rollout-workers", type=int_at_least(0), default=None,
                   help="override training.rollout_workers (DQN only)")
    p.add_argument("--backend", choices=["process", "ray"], default="process", help="parallel backend")
    p.add_argument("--ray-address", default=None, help="a Ray cluster (HOST:PORT or auto); default: local")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    from pydantic import ValidationError


    cfg, base = load_aset(args.config)
    if cfg.general is not None:
        return _general(cfg, base, args)
    if cfg.training is None:
        raise InputError(f"{args.config}: no 'training:' section")
    if cfg.training.method == "rollout":
        _refuse_dqn_options(args)
    upd = {}
    if args.seeds:
        upd["seeds"] = args.seeds
    if args.rollout_workers is not None:
        upd["rollout_workers"] = args.rollout_workers
    if upd:  # validated as if the file said so (the config's own bounds)
        try:
            training = type(cfg.training).model_validate({**cfg.training.model_dump(by_alias=True), **upd})
        except ValidationError as exc:
            raise InputError(format_validation_error(exc, f"{args.config} with the command line's training "
                                                          "overrides", what="ASET config")) from None
        cfg = cfg.model_copy(update={"training": training})
        problem = cfg.training_problem()
        if problem:
            raise InputError(f"{args.config} with the command line's training overrides: {problem}")
    root = resolve(base, cfg.training.out_dir) / cfg.name
    try:  # every scenario planned and checked (together, against reward) before anything is written
        scenarios = training_scenarios(cfg, base)
    except InputError as exc:  # named after the config whose training section refers to them
        raise naming_file(exc, args.config) from None
    if cfg.training.method == "rollout":
        return _rollout(cfg, base, args, scenarios)
    from testbed.aset import dqn  # imports TensorFlow: only for the DQN

    before = _files(root)
    try:  # the steps, the seeds and every output path are checked before any work
        results = dqn.train_seeds(cfg, base, steps=args.steps, jobs=args.jobs or 1, console=console,
                              backend="ray" if args.ray_address else args.backend, ray_address=args.ray_address,
                              scenarios=scenarios)
    except InputError as exc:
        raise naming_file(exc, args.config) from None
    windows = episode_windows(cfg.observation.window_ms / 1e3, cfg.training.episode_s)
    for res in results:
        console.print(_seed_line(res, windows))
    for line in _written(root, results, cfg.training.export_to, _changed(before, _files(root)), windows):
        console.print(line)
    return 0


def _general(cfg, base: Path, args: argparse.Namespace) -> int:
    """A ``general:`` config (:mod:`testbed.aset.general`): the DQN's options are refused;
    ``--seeds`` and ``--jobs`` apply.

    Raises:
        InputError: a DQN option, or seeds the section refuses, named after the config."""
    from pydantic import ValidationError


    dqn = [o for o, v in (("--steps", args.steps), ("--rollout-workers", args.rollout_workers)) if v is not None]
    if dqn:
        raise InputError(f"{args.config}: {', '.join(dqn)}: not used by the general agent's training (general:)")
    if args.seeds:
        try:
            cfg = cfg.model_copy(update={"general": type(cfg.general).model_validate(
                {**cfg.general.model_dump(), "seeds": args.seeds, "export_seed": None})})
        except ValidationError as exc:
            raise InputError(format_validation_error(exc, f"{args.config} with --seeds", what="ASET config")) from None
    for line in train_general(cfg, base, jobs=args.jobs, backend="ray" if args.ray_address else args.backend,
                              ray_address=args.ray_address, console=console):
        console.print(line, markup=False, highlight=False)
    return 0


def _refuse_dqn_options(args: argparse.Namespace) -> None:
    """A rollout config (``training.method: rollout``): the DQN's options are refused, naming them.

    Raises:
        InputError: one of them was given."""
    dqn = [o for o, v in (("--steps", args.steps), ("--rollout-workers", args.rollout_workers)) if v is not None]
    if dqn:
        raise InputError(f"{args.config}: {', '.join(dqn)}: the DQN's (training.method: dqn); this config trains "
                         f"on rollout targets (training.rollout)")


def _rollout(cfg, base: Path, args: argparse.Namespace, scenarios) -> int:
    """``training.method: rollout`` (:mod:`testbed.aset.rollout`): the data, one regression per
    seed, the exports.

    Raises:
        InputError: named after the config (the seeds, an output path: before any work).
        RunFailure: the data left nothing to fit (nothing exported)."""

    try:
        results = train_rollout(cfg, base, workers=args.jobs, backend="ray" if args.ray_address else args.backend,
                                ray_address=args.ray_address, console=console, scenarios=scenarios)
    except InputError as exc:
        raise naming_file(exc, args.config) from None
    for line in written_lines(cfg, base, results):
        console.print(line, markup=False, highlight=False)
    return 0


def _seed_line(res, windows: int) -> str:
    """One seed's result: steps, time and the success ratio of its last episodes (if any finished)."""
    head = f"seed {res.seed}: {counted(res.steps, 'step')} in {res.wall_s:.0f} s; "
    if not res.episodes:
        return head + f"no episode finished (an episode is {counted(windows, 'step')})"
    last = res.episodes[-20:]
    mean = sum(e["success_ratio"] for e in last) / len(last)
    n = len(res.episodes)
    return head + f"{counted(n, 'episode')}, success ratio of the last {len(last)}: {mean:.3f}"


def _files(root: Path) -> dict[Path, int]:
    """Every file under ``root`` with its modification time (ns)."""
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


def _changed(before: dict[Path, int], after: dict[Path, int]) -> set[Path]:
    """The files that are new or were rewritten between the two listings."""
    return {p for p, t in after.items() if before.get(p) != t}


def _written(root: Path, results: list, export_to: str | None, changed: set[Path], windows: int) -> list[str]:
    """What this training wrote (``changed``: the files under ``root`` it created or rewrote), and
    what it did not write: the learning curves need one finished episode, and a file of that name
    left by an earlier run is said to be that run's, never shown as this one's."""
    lines = ["written:"]
    for res in results:
        out = res.out_dir
        n = len(res.episodes)
        files = [(Path(f"{res.policy_path}.npz"), f"{res.policy_path}.npz/.json (the exported policy)"),
                 (max((c for c in changed if c.parent == out / "checkpoints" and c.suffix == ".index"),
                      default=out / "checkpoints" / "-", key=lambda c: c.stat().st_mtime_ns), None),
                 (next((t for t in changed if t.parent == out / "tb"), out / "tb" / "-"),
                  f"{out / 'tb'}/ (TensorBoard logs)"),
                 (out / "episodes.csv", f"{out / 'episodes.csv'} ({counted(n, 'episode')})"),
                 (out / "curve.png", f"{out / 'curve.png'} (this seed's learning curve)")]
        for path, text in files:
            if path in changed:
                lines.append(f"  {text or f'{path.parent}/{path.stem} (the last checkpoint)'}")
    curves = root / "curves.png"
    if curves in changed:
        lines.append(f"  {curves} (the learning curves)")
    if export_to:

        lines.append(f"  {str(checkpoint_files(export_to)[0]).removesuffix('.npz')}.npz/.json (the policy, exported)")
    if curves not in changed:
        steps = max(r.steps for r in results)
        stale = f"; the {curves} there is an earlier run's" if curves.exists() else ""
        lines.append(f"not written: the learning curves: no episode finished in {counted(steps, 'step')}"
                     f" (an episode is {counted(windows, 'step')}){stale}")
    lines.append(f"TensorBoard: tensorboard --logdir {root}")
    return lines
