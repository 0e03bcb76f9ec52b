"""Online fine-tuning of the exported ASET policy against a running emulation.

    .venv/bin/python -m testbed.aset.finetune experiments/aset-live.yaml \\
        --checkpoint models/aset/aset --epsilon 0.1 --out runs/aset-finetune

Steps: (1) bind an :class:`~testbed.aset.envs.AsetLiveEnv` on a Unix socket; (2) copy the
experiment with ``policy: aset`` and ``aset.options.control_socket`` set and start ``testbed run``
on it under ``flock /tmp/testbed-emulation.lock`` (it queues behind other emulations); (3) load
the checkpoint's weights into a :class:`~testbed.aset.agent.DQNAgent` (online and target network)
and, every window, act epsilon-greedy for every source, store the transitions the env settles and
run the gradient steps they are due; (4) when the run ends (no window state for ``--idle`` s),
export the fine-tuned policy to ``OUT/policy.{npz,json}`` and write ``OUT/finetune.json`` (windows,
transitions, mean reward, losses, policy shares, the emulation run directory).

The live reward is the plain window success ratio (the emulation has no baseline run on the same
arrivals), with the team share the checkpoint was trained with (``reward_team_weight`` of its
meta), so fine-tuning on it is a check that the loop runs end to end, not a training recipe.
Root needed (the emulation).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from testbed.agent.npolicy import NumpyPolicy, export_policy, policy_files
from testbed.aset.envs import AsetLiveEnv, plan_contexts
from testbed.core.util import REPO_ROOT
from testbed.plan.build import plan_experiment
from testbed.spec.aset import AgentSpec
from testbed.spec.schema import load_yaml_file

REPO = REPO_ROOT
LOCK = "/tmp/testbed-emulation.lock"


def _live_experiment(experiment: Path, checkpoint: str, socket_path: str, window: str) -> Path:
    """A copy of ``experiment`` next to it whose sources ask the live env every window."""
    data = load_yaml_file(experiment)
    data.update(policy="aset", name=f"{data['name']}-finetune",
                aset={"checkpoint": checkpoint, "window": window, "options": {"control_socket": socket_path}})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=experiment.parent, prefix=".finetune-",
                                     delete=False) as f:
        yaml.safe_dump(data, f, sort_keys=False)
        return Path(f.name)


def _agent_from_policy(policy, obs_size: int, n_actions: int, epsilon: float, seed: int, plan_margin: float = 0.0):
    """A DQN agent whose online and target networks hold the exported policy's weights; constant
    epsilon; training from the first batch on (hyper-parameters of the checkpoint's training);
    the checkpoint's decision rule (``plan_margin``)."""
    from testbed.aset.agent import DQNAgent  # imports TensorFlow: only when fine-tuning

    npz, meta = policy_files(policy)
    w = [np.load(npz)[f"w{i}"] for i in range(2 * json.loads(meta.read_text())["layers"])]
    hidden = [int(w[i].shape[1]) for i in range(0, len(w) - 2, 2)]
    spec = AgentSpec(hidden=hidden, learning_rate=1e-4, gamma=0.5, batch_size=32, replay_size=10_000,
                     train_start=32, target_update_steps=100, epsilon_start=epsilon, epsilon_end=epsilon,
                     epsilon_decay_steps=1, plan_margin=plan_margin)
    agent = DQNAgent(obs_size, n_actions, spec, seed=seed)
    agent.online.set_weights(w)
    agent.target.set_weights(w)
    return agent


def _finish(proc: subprocess.Popen, wait_s: float = 120.0) -> int:
    """The run's exit code: wait up to ``wait_s`` for its teardown, then SIGTERM its process
    group (our child, started in its own session) and wait 60 s more."""
    import os
    import signal

    try:
        return proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=60)


def _start_run(experiment: Path, runs_dir: Path, log: Path, duration_s: float | None, lock: bool) -> subprocess.Popen:
    """``testbed run experiment`` (under the emulation lock unless ``lock`` is False) in a session
    of its own, its output in ``log``."""
    cmd = (["flock", LOCK] if lock else []) + [str(Path(sys.executable).with_name("testbed")), "run", str(experiment),
                                               "--runs-dir", str(runs_dir)]
    if duration_s is not None:
        cmd += ["--duration", f"{duration_s:g}"]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


@dataclass
class _Learned:
    """What the live loop did: rewards of the settled transitions, the losses of the gradient
    steps, windows stepped, windows per policy, s until the first window state came."""

    rewards: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    windows: int = 0
    shares: np.ndarray | None = None
    t_first: float = 0.0


def _learn_live(env: AsetLiveEnv, agent, idle_s: float) -> _Learned:
    """Act (epsilon-greedy) on every window state the emulation sends, store each settled
    transition and train as the agent's schedule says, until no state comes for ``idle_s`` (the
    load ended) or the episode is truncated."""
    learned = _Learned(shares=np.zeros(len(env.policies), np.int64))
    t0 = time.monotonic()
    obs, _ = env.reset()  # waits for the bring-up (and for the lock)
    learned.t_first = time.monotonic() - t0
    env.timeout_s = idle_s
    while True:
        action = agent.act(obs, explore=True)
        try:
            obs, _, _, trunc, info = env.step(action)
        except TimeoutError:
            break  # the load ended: no more window states
        learned.windows += 1
        learned.shares += np.bincount(action, minlength=len(env.policies))
        for _i, o, a, r, nxt in info["transitions"]:
            agent.remember(o, a, r, nxt, False)
            learned.rewards.append(r)
            loss = agent.maybe_train()
            if loss is not None:
                learned.losses.append(loss)
        if trunc:
            break
    return learned


def finetune(experiment: Path, checkpoint: Path, out: Path, epsilon: float = 0.1, seed: int = 1,
             start_timeout_s: float = 300.0, idle_s: float = 10.0, duration_s: float | None = None,
             lock: bool = True) -> dict:
    """Run the loop of the module docstring; returns (and writes) its summary. ``duration_s``:
    override the experiment's load duration (``testbed run --duration``). ``lock=False``: run
    ``testbed run`` without taking the emulation lock, for a caller that already holds it
    (``flock LOCK pytest -m emulation``: a nested flock on the same file would wait forever).
    If the emulation does not send a window state within ``start_timeout_s`` (or fails), the run
    is stopped (SIGTERM to its process group) instead of being waited for."""

    pol = NumpyPolicy(checkpoint)
    plan = plan_experiment(experiment)
    contexts = plan_contexts(plan, tuple(pol.meta["policies"]), pol.obs_spec)
    pol.check_contexts(contexts, f"the live env of {experiment}")
    out.mkdir(parents=True, exist_ok=True)
    sock = str(Path(tempfile.gettempdir()) / f"aset-finetune-{int(time.time())}.sock")
    episode = int((duration_s or plan.experiment.duration_s) / (pol.obs_spec.window_ms / 1e3)) + 10
    team = float((pol.meta.get("meta") or {}).get("reward_team_weight") or 0.0)  # as the checkpoint was trained
    env = AsetLiveEnv(contexts, pol.obs_spec, sock, timeout_s=start_timeout_s, episode_windows=episode,
                      team_weight=team)
    agent = _agent_from_policy(checkpoint, env.obs_size, len(env.policies), epsilon, seed, pol.plan_margin)
    tmp = _live_experiment(experiment, str(checkpoint), sock, f"{pol.obs_spec.window_ms:g}ms")
    runs_dir = out / "runs"
    proc = _start_run(tmp, runs_dir, out / "run.log", duration_s, lock)
    try:
        learned = _learn_live(env, agent, idle_s)
    finally:
        env.close()
        rc = _finish(proc)
        tmp.unlink(missing_ok=True)
    export_policy(agent.weights(), out / "policy", obs_spec=pol.obs_spec, applications=list(pol.meta["applications"]),
                  clusters=list(pol.meta["clusters"]), policies=list(pol.meta["policies"]),
                  sources=list(pol.sources), deadlines_ms=list(pol.meta.get("deadlines_ms") or []),
                  plan_margin=pol.plan_margin,
                  meta={"finetuned_from": str(checkpoint), "experiment": str(experiment), "windows": learned.windows})
    runs = sorted(p for p in runs_dir.glob("*") if p.is_dir()) if runs_dir.is_dir() else []
    rewards, losses = learned.rewards, learned.losses
    summary = {"experiment": str(experiment), "checkpoint": str(checkpoint), "run_rc": rc,
               "run": str(runs[-1]) if runs else None, "wait_for_first_window_s": round(learned.t_first, 1),
               "windows": learned.windows, "transitions": len(rewards), "gradient_steps": len(losses),
               "mean_reward": float(np.mean(rewards)) if rewards else None,
               "loss_first_last": [losses[0], losses[-1]] if losses else None, "epsilon": epsilon,
               "policy_windows": {p: int(n) for p, n in zip(env.policies, learned.shares, strict=True)}}
    (out / "finetune.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", type=Path, nargs="?", default=REPO / "experiments/aset-live.yaml")
    ap.add_argument("--checkpoint", type=Path, default=REPO / "models/aset/aset")
    ap.add_argument("--out", type=Path, default=REPO / "runs/aset-finetune")
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--idle", type=float, default=10.0, help="s without window states that end the loop")
    ap.add_argument("--no-lock", action="store_true", help="the caller already holds the emulation lock")
    args = ap.parse_args(argv)
    summary = finetune(args.experiment.resolve(), args.checkpoint.resolve(), args.out.resolve(), args.epsilon,
                       idle_s=args.idle, lock=not args.no_lock)
    print(json.dumps(summary, indent=1))
    return 0 if summary["windows"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
