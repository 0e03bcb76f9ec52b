"""``testbed train ASET_CONFIG.yaml``: train the ASET agent (double DQN) in the simulator over
randomised scenarios; TensorBoard logs, checkpoints, training curve and the exported policy go to
``training.out_dir/<name>/`` (see :mod:`testbed.aset.train`)."""

from __future__ import annotations

import argparse


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need an integer >= 1")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train the ASET agent in the simulator (DQN)", description=__doc__)
    p.add_argument("config", help="ASET config YAML (e.g. experiments/aset-train.yaml)")
    p.add_argument("--steps", type=_positive_int, default=None, help="override training.steps (windows)")
    p.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    from testbed.aset.config import load_aset_config
    from testbed.aset.train import train
    from testbed.cli import console

    cfg, base = load_aset_config(args.config)
    if args.seed is not None:
        cfg = cfg.model_copy(update={"seed": args.seed})
    if cfg.training is None:
        console.print(f"[red]error:[/red] {args.config}: no 'training:' section")
        return 2
    res = train(cfg, base, steps=args.steps, console=console)
    last = res.episodes[-5:]
    mean = sum(e["success_ratio"] for e in last) / len(last) if last else float("nan")
    console.print(f"trained {res.steps} steps in {res.wall_s:.0f} s; {len(res.episodes)} episodes, "
                  f"success ratio of the last {len(last)}: {mean:.3f}")
    console.print(f"policy: {res.policy_path}.npz/.json; curve: {res.out_dir / 'curve.png'}; "
                  f"TensorBoard: tensorboard --logdir {res.out_dir / 'tb'}")
    if cfg.training.export_to:
        console.print(f"exported to {cfg.training.export_to}.npz/.json")
    return 0
