"""``testbed train ASET_CONFIG.yaml``: train the ASET agent (double DQN) in the simulator over
randomised scenarios, one run per seed of ``training.seeds``; TensorBoard logs, checkpoints,
learning curves and the exported policy go to ``training.out_dir/<name>/`` (see
:mod:`testbed.aset.train`)."""

from __future__ import annotations

import argparse


def _int_at_least(n: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < n:
            raise argparse.ArgumentTypeError(f"{text!r}: need an integer >= {n}")
        return v
    return parse


_positive_int = _int_at_least(1)


def _seed_list(text: str) -> list[int]:
    from testbed.commands.simulate import seed_arg

    return [seed_arg(x.strip()) for x in text.split(",") if x.strip()] or [seed_arg(text)]


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train the ASET agent in the simulator (DQN)", description=__doc__)
    p.add_argument("config", help="ASET config YAML (e.g. experiments/aset-train.yaml)")
    p.add_argument("--steps", type=_positive_int, default=None, help="override training.steps (windows)")
    p.add_argument("--seeds", type=_seed_list, default=None, help="override training.seeds, e.g. 1,2,3")
    p.add_argument("--jobs", type=_positive_int, default=1, help="seeds trained at once (parallel processes)")
    p.add_argument("--rollout-workers", type=_int_at_least(0), default=None,
                   help="override training.rollout_workers")
    p.add_argument("--backend", choices=["process", "ray"], default="process", help="parallel backend")
    p.add_argument("--ray-address", default=None, help="a Ray cluster (HOST:PORT or auto); default: local")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    from testbed.aset.config import load_aset_config
    from testbed.aset.train import train_seeds
    from testbed.cli import console
    from testbed.errors import InputError

    cfg, base = load_aset_config(args.config)
    if cfg.training is None:
        raise InputError(f"{args.config}: no 'training:' section")
    upd = {}
    if args.seeds:
        upd["seeds"] = args.seeds
    if args.rollout_workers is not None:
        upd["rollout_workers"] = args.rollout_workers
    if upd:  # validated as if the file said so (the config's own bounds)
        try:
            training = type(cfg.training).model_validate({**cfg.training.model_dump(by_alias=True), **upd})
        except ValueError as exc:
            raise InputError(f"{args.config}: the command line's training overrides: {exc}") from None
        cfg = cfg.model_copy(update={"training": training})
    results = train_seeds(cfg, base, steps=args.steps, jobs=args.jobs, console=console,
                          backend="ray" if args.ray_address else args.backend, ray_address=args.ray_address)
    for res in results:
        last = res.episodes[-20:]
        mean = sum(e["success_ratio"] for e in last) / len(last) if last else float("nan")
        console.print(f"seed {res.seed}: {res.steps} steps in {res.wall_s:.0f} s; {len(res.episodes)} episodes, "
                      f"success ratio of the last {len(last)}: {mean:.3f}; policy {res.policy_path}.npz/.json")
    root = results[0].out_dir.parent if len(results) > 1 or results[0].out_dir.name.startswith("seed-") \
        else results[0].out_dir
    console.print(f"curves: {root / 'curves.png'}; TensorBoard: tensorboard --logdir {root}")
    if cfg.training.export_to:
        console.print(f"exported to {cfg.training.export_to}.npz/.json")
    return 0
