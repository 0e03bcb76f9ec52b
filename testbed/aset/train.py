"""``testbed train CONFIG``: train the ASET double DQN in the simulator over randomised scenarios.

Per episode a scenario is drawn from ``training.scenarios`` (the six ``experiments/scenario-*.yaml``
carry bursts, hotspot moves, link delay changes and cluster failures) and its load scaled by a
factor from ``training.randomise.load_scale``; the simulator is seeded from the training seed, so a
run is reproducible on the same machine. Outputs in ``training.out_dir/<name>/``:

- ``tb/``: TensorBoard logs (``tf.summary``: loss, epsilon, mean reward, episode success ratio);
- ``checkpoints/ckpt-<step>``: TensorFlow checkpoints (online + target network + optimizer);
- ``policy.npz`` / ``policy.json``: the exported greedy policy (also copied to
  ``training.export_to`` when set, e.g. ``models/aset/aset``);
- ``episodes.csv`` and ``curve.png``: the training curve (episode success ratio vs step).
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testbed.aset.config import AsetConfig, RandomiseSpec
from testbed.aset.envs import AsetSimEnv, PlanSampler
from testbed.config import Experiment, load_experiment
from testbed.plan import Plan, build_plan
from testbed.topology import load_topology


def scale_rates(data, factor: float):
    """Copy of a dumped workload structure with every ``*rate_qps`` number (or list of numbers)
    multiplied by ``factor``."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if k.endswith("rate_qps") or k.endswith("rates_qps"):
                if isinstance(v, int | float) and not isinstance(v, bool):
                    v = v * factor
                elif isinstance(v, list):
                    v = [x * factor if isinstance(x, int | float) else scale_rates(x, factor) for x in v]
            else:
                v = scale_rates(v, factor)
            out[k] = v
        return out
    if isinstance(data, list):
        return [scale_rates(x, factor) for x in data]
    return data


def scaled_experiment(exp: Experiment, factor: float) -> Experiment:
    """The experiment with its arrival rates scaled by ``factor`` (validated again)."""
    if factor == 1.0:
        return exp
    dump = exp.model_dump()
    dump["workload"] = scale_rates(dump["workload"], factor)
    return Experiment.model_validate(dump)


def scenario_sampler(paths: list[Path], randomise: RandomiseSpec) -> tuple[PlanSampler, list[Plan]]:
    """A :data:`PlanSampler` over the scenario files (uniform) with load scaling, and their
    unscaled plans. Every file is loaded and planned here, so a bad one fails before training.

    Raises:
        ConfigError, PlanError, TopologyError: a scenario file is invalid (named in the message).
    """
    loaded = []
    for p in paths:
        exp = load_experiment(p)
        raw = load_topology(exp.topology.source, p.parent)
        loaded.append((exp, raw, p.parent))
    plans = [build_plan(e, raw=r, base_dir=b) for e, r, b in loaded]
    lo, hi = randomise.load_scale

    def sample(rng: np.random.Generator) -> Plan:
        k = int(rng.integers(len(loaded)))
        exp, raw, base = loaded[k]
        factor = float(rng.uniform(lo, hi)) if hi > lo else lo
        return build_plan(scaled_experiment(exp, factor), raw=raw, base_dir=base)

    return sample, plans


@dataclass
class TrainResult:
    """What a training run produced: output folder, exported policy path (no suffix), per-episode
    log rows (step, scenario, success_ratio, mean_reward, epsilon), wall time in s."""

    out_dir: Path
    policy_path: Path
    episodes: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    steps: int = 0


def _scalar(tag: str, value: float, step: int) -> None:
    """Write one TensorBoard scalar with ``tf.summary.write`` (TensorFlow core: the TensorBoard
    package is not needed to write the event files, only to view them)."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = "scalars"
    md.data_class = summary_pb2.DATA_CLASS_SCALAR
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=md.SerializeToString())


def resolve(base: Path, p: str) -> Path:
    q = Path(p)
    return q if q.is_absolute() else base / q


def train(cfg: AsetConfig, base: Path, *, steps: int | None = None, progress: bool = True,
          simulator_factory=None, plans=None, console=None) -> TrainResult:
    """Train per ``cfg`` (``cfg.training`` required) and export the policy.

    Args:
        cfg: the ASET config. base: folder for relative paths (the repository).
        steps: override ``training.steps``. progress: show a rich progress bar.
        simulator_factory / plans: for tests (a fake simulator; a Plan or PlanSampler).

    Raises:
        ValueError: ``cfg.training`` is missing.
    """
    import tensorflow as tf

    from testbed.aset.agent import DQNAgent
    from testbed.aset.npolicy import export_policy

    if cfg.training is None:
        raise ValueError(f"ASET config {cfg.name!r}: a 'training:' section is required for testbed train")
    tr = cfg.training
    steps = steps or tr.steps
    if plans is None:
        plans, _ = scenario_sampler([resolve(base, s) for s in tr.scenarios], tr.randomise)
    env = AsetSimEnv(plans, cfg.observation, tr.episode_s, simulator_factory=simulator_factory)
    agent = DQNAgent(env.obs_size, len(env.policies), cfg.agent, seed=cfg.seed)
    out = resolve(base, tr.out_dir) / cfg.name
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    writer = tf.summary.create_file_writer(str(out / "tb"))
    result = TrainResult(out, out / "policy")
    t_start = time.perf_counter()
    obs, info = env.reset(seed=cfg.seed)
    scenario = info["scenario"]
    rewards: list[float] = []
    loss = None

    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        bar = Progress(TextColumn("[bold]train[/bold] {task.completed}/{task.total}"), BarColumn(),
                       TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                       console=console, transient=False)
        task = bar.add_task("train", total=steps, status="")
        bar.start()
    try:
        for step in range(1, steps + 1):
            action = agent.act(obs, explore=True)
            obs, _, _, truncated, info = env.step(action)
            for _i, o, a, r, nxt in info["transitions"]:
                agent.remember(o, a, r, nxt, False)
                rewards.append(r)
            loss = agent.maybe_train()
            if truncated:
                row = {"step": step, "scenario": scenario, "success_ratio": info["success_ratio"],
                       "queries": info["queries"], "mean_reward": float(np.mean(rewards)) if rewards else 0.0,
                       "epsilon": agent.epsilon(),
                       "policy_share": {p: int(n) for p, n in zip(env.policies, env.policy_windows.sum(0),
                                                                  strict=True)}}
                result.episodes.append(row)
                with writer.as_default():
                    _scalar("episode/success_ratio", row["success_ratio"], step)
                    _scalar("episode/mean_reward", row["mean_reward"], step)
                rewards = []
                obs, info = env.reset()
                scenario = info["scenario"]
            if step % 50 == 0:
                with writer.as_default():
                    _scalar("train/epsilon", agent.epsilon(), step)
                    if loss is not None:
                        _scalar("train/loss", loss, step)
            if step % tr.checkpoint_every == 0 or step == steps:
                agent.save(out / "checkpoints" / f"ckpt-{step}")
            if bar is not None and (step % 20 == 0 or step == steps):
                last = result.episodes[-1] if result.episodes else None
                status = (f"eps {agent.epsilon():.2f}  loss {loss if loss is not None else float('nan'):.4f}  "
                          f"last episode {last['scenario']} success {last['success_ratio']:.3f}" if last
                          else f"eps {agent.epsilon():.2f}")
                bar.update(task, completed=step, status=status)
    finally:
        if bar is not None:
            bar.stop()
        writer.close()
    ctx = env.contexts[0]
    meta = {"config": cfg.name, "seed": cfg.seed, "steps": steps, "trained_on": list(tr.scenarios)}
    export_policy(agent.weights(), result.policy_path, obs_spec=cfg.observation, applications=list(ctx.applications),
                  clusters=list(ctx.clusters), policies=list(env.policies), meta=meta)
    if tr.export_to:
        export_policy(agent.weights(), resolve(base, tr.export_to), obs_spec=cfg.observation,
                      applications=list(ctx.applications), clusters=list(ctx.clusters),
                      policies=list(env.policies), meta=meta)
    result.wall_s = time.perf_counter() - t_start
    result.steps = steps
    result.agent = agent  # for tests: the trained agent
    _write_curve(out, result.episodes)
    return result


def _write_curve(out: Path, episodes: list[dict]) -> None:
    """``episodes.csv`` and ``curve.png`` (episode success ratio vs step, with a moving mean)."""
    with open(out / "episodes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "scenario", "success_ratio", "queries", "mean_reward", "epsilon"])
        for e in episodes:
            w.writerow([e["step"], e["scenario"], f"{e['success_ratio']:.6f}", e["queries"],
                        f"{e['mean_reward']:.6f}", f"{e['epsilon']:.4f}"])
    if not episodes:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.array([e["step"] for e in episodes])
    y = np.array([e["success_ratio"] for e in episodes])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, y, ".", alpha=0.4, label="episode success ratio")
    k = max(1, len(y) // 10)
    if len(y) >= k:
        ax.plot(x[k - 1:], np.convolve(y, np.ones(k) / k, mode="valid"), "-", label=f"moving mean ({k} episodes)")
    ax.set_xlabel("training step (windows)")
    ax.set_ylabel("success ratio")
    ax.set_title("ASET training curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=110)
    plt.close(fig)
