#!/usr/bin/env python3
"""Peer check of our double DQN: Stable-Baselines3's DQN trained on the same Gymnasium environment.

    .venv/bin/pip install -e '.[peer]'      # the optional extra: stable-baselines3 2.9.2, torch 2.13.0 (CPU)
    nice -n 19 .venv/bin/python benchmarks/aset_sb3.py experiments/aset-train.yaml \\
        --scenarios experiments/scenario-capacity.yaml,experiments/scenario-hotspot.yaml --steps 16000

For each scenario: SB3's DQN (same MLP 2 x 64, gamma, learning rate, replay, epsilon schedule and
target-update period as our config) learns on :class:`testbed.aset.envs.AsetSimEnv` with
``immediate_reward=True`` (each window settled at once on a copy of the simulator, so every step's
reward is that step's: SB3 has no delayed transitions), the sources as the sub-environments of
one SB3 ``VecEnv`` over one shared simulator (:class:`SourcesVecEnv`: one network for every
dispatcher, as ours; each row's observation ends with its source's identity one-hot). Then both
greedy policies (SB3's and ``evaluation.checkpoint``) run on the evaluation seeds through
:func:`testbed.aset.jobs.agent_job`'s measure; prints mean success ratio and 95 % CI of each,
and of min_latency, on the same seeds. The checkpoint is checked against each scenario's
observation before SB3 trains (a checkpoint of another observation size fails at once, naming
both sizes, instead of after the training).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def peer_extra_missing(what: str) -> bool:
    """True, with the install command said on stderr, when the optional extra 'peer'
    (Stable-Baselines3 and torch) that ``what`` needs is not installed."""
    try:
        import stable_baselines3  # noqa: F401 - the optional extra
    except ImportError:
        print(f"error: {what} needs the optional extra 'peer' (Stable-Baselines3 and torch): "
              ".venv/bin/pip install -e '.[peer]'", file=sys.stderr)
        return True
    return False


def sources_vec_env(env):
    """An SB3 ``VecEnv`` whose sub-environments are the sources of one :class:`AsetSimEnv`."""
    from stable_baselines3.common.vec_env import VecEnv

    class SourcesVecEnv(VecEnv):
        def __init__(self, inner):
            self.inner = inner
            n = len(inner.contexts)
            obs_space = type(inner.observation_space)(0.0, inner.observation_space.high.max(), (inner.obs_size,),
                                                      np.float32)
            import gymnasium as gym

            super().__init__(n, obs_space, gym.spaces.Discrete(len(inner.policies)))
            self._actions = np.zeros(n, np.int64)

        def reset(self):
            obs, _ = self.inner.reset()
            return obs

        def step_async(self, actions):
            self._actions = np.asarray(actions, np.int64)

        def step_wait(self):
            obs, _, _, trunc, info = self.inner.step(self._actions)
            rewards = np.zeros(self.num_envs, np.float32)
            for i, _o, _a, r, _n in info["transitions"]:
                rewards[i] = r
            dones = np.full(self.num_envs, bool(trunc))
            infos = [{} for _ in range(self.num_envs)]
            if trunc:
                for k in range(self.num_envs):
                    infos[k]["terminal_observation"] = obs[k]
                    infos[k]["TimeLimit.truncated"] = True
                obs, _ = self.inner.reset()
            return obs, rewards, dones, infos

        def close(self):
            pass

        def get_attr(self, name, indices=None):
            return [getattr(self.inner, name)] * self.num_envs

        def set_attr(self, name, value, indices=None):
            setattr(self.inner, name, value)

        def env_method(self, name, *args, indices=None, **kwargs):
            return [getattr(self.inner, name)(*args, **kwargs)] * self.num_envs

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * self.num_envs

        def seed(self, seed=None):
            return [None] * self.num_envs

    return SourcesVecEnv(env)


def run(cfg_path: str, scenarios: list[str], steps: int, seeds: int) -> int:
    from stable_baselines3 import DQN

    from testbed.aset.envs import AsetSimEnv
    from testbed.aset.jobs import agent_job, static_job
    from testbed.core.util import ci95, repo_path
    from testbed.plan.build import plan_experiment
    from testbed.plan.policy_resolution import aset_actions, load_aset
    from testbed.spec.experiment import AsetSpec

    cfg, base = load_aset(cfg_path)
    a = cfg.agent
    agent = AsetSpec(checkpoint=str(repo_path(cfg.evaluation.checkpoint, base))).model_dump_json()
    for sc in scenarios:
        plan = plan_experiment(repo_path(sc, base))
        env = AsetSimEnv(plan, cfg.observation, plan.experiment.duration_s, policies=aset_actions(cfg),
                         reward=cfg.reward, immediate_reward=True)
        vec = sources_vec_env(env)
        n = vec.num_envs
        model = DQN("MlpPolicy", vec, learning_rate=a.learning_rate, buffer_size=a.replay_size,
                    learning_starts=a.train_start, batch_size=a.batch_size, gamma=a.gamma, train_freq=1,
                    gradient_steps=1, target_update_interval=a.target_update_steps * n,
                    exploration_fraction=min(1.0, a.epsilon_decay_steps / (steps * n)),
                    exploration_initial_eps=a.epsilon_start, exploration_final_eps=a.epsilon_end,
                    policy_kwargs={"net_arch": list(a.hidden)}, seed=cfg.seed, verbose=0)
        model.learn(total_timesteps=steps * n)
        sb3, ours, minlat = [], [], []
        for k in range(1, seeds + 1):
            env_eval = AsetSimEnv(plan, cfg.observation, plan.experiment.duration_s, policies=aset_actions(cfg))
            obs, _ = env_eval.reset(seed=k, options={"sim_seed": k})
            done = False
            while not done:
                act, _ = model.predict(obs, deterministic=True)
                obs, _, _, done, _ = env_eval.step(act)
            sb3.append(env_eval.ep.success_ratio)
            r = agent_job(str(repo_path(sc, base)), k, agent, None)
            ours.append(r["ok"] / r["n"])
            ok, nq = static_job(str(repo_path(sc, base)), k, ["min_latency"], None)["min_latency"]
            minlat.append(ok / nq)
        for name, v in (("SB3 DQN", sb3), ("ours (double DQN)", ours), ("min_latency", minlat)):
            m, h = ci95(v)
            print(f"{plan.experiment.name}: {name:18s} {100 * m:.2f} ± {100 * h:.2f} % over {seeds} seeds")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--scenarios", default="experiments/scenario-capacity.yaml,experiments/scenario-hotspot.yaml")
    ap.add_argument("--steps", type=int, default=16000, help="windows of training (x the sources: SB3 steps)")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args(argv)
    if peer_extra_missing("this benchmark"):
        return 2
    return run(args.config, args.scenarios.split(","), args.steps, args.seeds)


if __name__ == "__main__":
    sys.exit(main())
