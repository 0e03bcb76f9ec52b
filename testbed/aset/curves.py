"""The learning curves ASET's trainers write: the double DQN's episodes (``episodes.csv``, ``curve.png``,
``curves.png``; :mod:`testbed.aset.dqn`) and the rollout regression's losses per epoch
(:mod:`testbed.aset.rollout`). matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def write_curve(out: Path, episodes: list[dict]) -> None:
    """``episodes.csv`` and ``curve.png`` (episode success ratio vs step, with a moving mean)."""
    with open(out / "episodes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "scenario", "success_ratio", "baseline_success_ratio", "queries", "mean_reward",
                    "epsilon"])
        for e in episodes:
            w.writerow([e["step"], e["scenario"], f"{e['success_ratio']:.6f}",
                        f"{e.get('baseline_success_ratio', float('nan')):.6f}", e["queries"],
                        f"{e['mean_reward']:.6f}", f"{e['epsilon']:.4f}"])
    if episodes:
        plot_curves(out / "curve.png", {"": episodes}, "ASET training curve")


def plot_curves(path: Path, runs: dict[str, list[dict]], title: str) -> None:
    """``path``: per run (label -> its episodes' rows), the moving mean of the episode success ratio
    and, with a reward baseline, of the success ratio above the baseline run (points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_base = any(not np.isnan(e.get("baseline_success_ratio", np.nan)) for eps in runs.values() for e in eps)
    fig, axes = plt.subplots(1, 2 if has_base else 1, figsize=(12 if has_base else 7, 4), squeeze=False)
    for label, eps in runs.items():
        x = np.array([e["step"] for e in eps])
        y = np.array([e["success_ratio"] for e in eps])
        k = max(1, len(y) // 10)
        if not label:
            axes[0, 0].plot(x, y, ".", alpha=0.4, label="episode success ratio")
        axes[0, 0].plot(x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"), "-",
                        label=f"{label + ': ' if label else ''}moving mean ({k} episodes)")
        if has_base:
            d = y - np.array([e.get("baseline_success_ratio", np.nan) for e in eps])
            axes[0, 1].plot(x[k - 1:], 100 * np.convolve(d, np.ones(k) / k, mode="valid"), "-", label=label or None)
    axes[0, 0].set_xlabel("training step (windows)")
    axes[0, 0].set_ylabel("episode success ratio")
    axes[0, 0].set_title(title)
    if has_base:
        axes[0, 1].axhline(0, color="k", lw=0.8)
        axes[0, 1].set_xlabel("training step (windows)")
        axes[0, 1].set_ylabel("success ratio - baseline run (points)")
        axes[0, 1].set_title("above the baseline policy (same arrivals)")
    for ax in axes.ravel():
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_loss_curves(path: Path, runs: dict[str, list[dict]], title: str) -> None:
    """``path``: per run, the train (solid) and validation (dashed) loss per epoch, and the plan
    rule's gain on the validation episodes (points) per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for k, (label, rows) in enumerate(runs.items()):
        x = [r["epoch"] for r in rows]
        color = f"C{k}"
        axes[0].plot(x, [r["train_loss"] for r in rows], "-", color=color, label=f"{label}: train")
        axes[0].plot(x, [r["val_loss"] for r in rows], "--", color=color, label=f"{label}: validation")
        axes[1].plot(x, [r["val_gain"] for r in rows], "-", color=color, label=label)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("Huber loss")
    axes[0].set_title(title)
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set_ylabel("team gain of the plan rule (points)")
    axes[1].set_title("validation episodes: target of the chosen action")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["plot_curves", "write_curve", "write_loss_curves"]
