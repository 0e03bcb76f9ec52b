#!/usr/bin/env python3
"""Train a small Stable-Baselines3 DQN on ``testbed/AsetSim-v0`` and save it as a selector.

    .venv/bin/pip install -e '.[peer]'        # the optional extra: stable-baselines3, torch (CPU)
    .venv/bin/python examples/selector/train_sb3.py                          # -> examples/selector/dqn-capacity.zip
    .venv/bin/testbed simulate examples/selector/capacity-selector.yaml      # with selector: {sb3: ...}

The environment is Gymnasium's ``testbed/AsetSim-v0`` on the experiment (default observation:
500 ms windows; the action set: every built-in policy, the default of ``aset.selector.policies``)
with ``immediate_reward=True`` (each window's reward settled at once, as SB3 needs); its sources
are the sub-environments of one SB3 ``VecEnv`` (``benchmarks/aset_sb3.py``'s ``sources_vec_env``:
one network for every source, each row's observation ends with its source's identity one-hot).
The saved model's spaces are ``Discrete(number of built-in policies)`` and ``Box(obs_size,)``:
what ``aset.selector: {sb3: ...}`` checks at plan time against the experiment it drives.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def train(experiment: str, out: Path, steps: int, seed: int) -> Path:
    """Train ``steps`` windows (x the sources: SB3 steps) and save the model to ``out`` (.zip)."""
    import gymnasium
    from stable_baselines3 import DQN

    import testbed.aset  # noqa: F401 - registers testbed/AsetSim-v0
    from benchmarks.aset_sb3 import sources_vec_env

    env = gymnasium.make("testbed/AsetSim-v0", experiment=experiment, immediate_reward=True).unwrapped
    vec = sources_vec_env(env)
    n = vec.num_envs
    model = DQN("MlpPolicy", vec, learning_rate=1e-3, buffer_size=20_000, learning_starts=200, batch_size=64,
                gamma=0.9, train_freq=1, gradient_steps=1, target_update_interval=250 * n,
                exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                policy_kwargs={"net_arch": [64, 64]}, seed=seed, verbose=0, device="cpu")
    model.learn(total_timesteps=steps * n)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default=str(REPO / "experiments" / "scenario-capacity.yaml"))
    ap.add_argument("--out", default=str(REPO / "examples" / "selector" / "dqn-capacity.zip"))
    ap.add_argument("--steps", type=int, default=1600, help="windows of training (20 episodes of 40 s)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    from benchmarks.aset_sb3 import peer_extra_missing

    if peer_extra_missing("this example"):
        return 2
    t = time.perf_counter()
    out = train(args.experiment, Path(args.out), args.steps, args.seed)
    print(f"saved {out} ({out.stat().st_size / 1024:.0f} KiB) after {args.steps} windows in "
          f"{time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
