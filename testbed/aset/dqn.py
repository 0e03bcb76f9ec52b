"""The paper's agent: a double DQN (TensorFlow/Keras) that picks each dispatcher's policy per
window, trained in the simulator over randomised scenarios (``testbed train`` of an ASET config
with ``training:``, ``method: dqn``). One file, top to bottom: the replay buffer, the Q-network, the
agent, then the training run.

Learning (``docs/system-model.md``, "ASET"): Q-network = MLP (``agent.hidden``, default 2 x 64,
ReLU) -> one Q-value per policy of the action set; double DQN target (van Hasselt, Guez, Silver,
"Deep Reinforcement Learning with Double Q-learning", AAAI 2016)::

    y = r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a))

where the argmax (here and when acting) is over :func:`~testbed.agent.npolicy.plan_scores`, i.e.
Q + ``agent.plan_margin`` at the source's planned policy (0 by default: the plain rule). Huber
loss (``agent.huber_delta``), Adam; uniform experience replay (``agent.replay_size``); target
network copied every ``agent.target_update_steps`` gradient steps; epsilon-greedy with a linear
schedule. One network is shared by all dispatchers: every dispatcher's transition goes into the
same replay buffer. The environment is :class:`testbed.aset.envs.AsetSimEnv` (one step = one
window of every dispatcher; a window's reward is settled once its queries are resolved).

Training: per episode a scenario is drawn from ``training.scenarios`` and its load scaled by a
factor from ``training.randomise.load_scale``; the simulator is seeded from the training seed, so a
run is reproducible on the same machine. One run per seed of ``training.seeds``. Outputs in
``training.out_dir/<name>/seed-<k>/``: ``tb/`` (TensorBoard: loss, epsilon, mean reward, episode
success ratio), ``checkpoints/ckpt-<step>`` (TensorFlow training checkpoints), ``policy.{npz,json}``
(the greedy policy: a ``qnetwork`` checkpoint, :mod:`testbed.agent.checkpoint`), ``episodes.csv``
and ``curve.png``; in ``training.out_dir/<name>/``: ``curves.png`` (every seed) and the policy of
``export_seed`` copied to ``training.export_to``.

Rollout workers (``training.rollout_workers`` N >= 1): episodes are simulated N at a time in worker
processes (:func:`testbed.core.distributed.imap_unordered`, process pool or Ray) by the numpy copy of
the current online network with the current epsilon; the learner then stores their transitions
and runs the gradient steps those windows are due.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from testbed.agent.checkpoint import copy_checkpoint
from testbed.agent.npolicy import NumpyPolicy, plan_scores
from testbed.aset.curves import plot_curves, write_curve
from testbed.aset.envs import AsetSimEnv
from testbed.aset.scenarios import (
    PlanSampler,
    TrainResult,
    check_outputs,
    clear_run_dir,
    export_weights,
    resolve,
    scenario_sampler,
    tf_one_thread,
    training_scenarios,
    training_seeds,
)
from testbed.core.distributed import imap_unordered
from testbed.core.errors import EXIT_NOTHING_MEASURED, InputError, RunFailure, counted
from testbed.plan.build import Plan
from testbed.plan.policy_resolution import aset_actions
from testbed.spec.aset import AgentSpec, AsetConfig, TrainingSpec


# ----------------------------------------------------------------------------- the agent
class ReplayBuffer:
    """Uniform experience replay: a ring buffer of (obs, action, reward, next_obs, done).

    Shapes: obs/next_obs (capacity, obs_size) float32; action int32; reward, done float32.
    """

    def __init__(self, capacity: int, obs_size: int):
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_size), np.float32)
        self.next_obs = np.zeros((capacity, obs_size), np.float32)
        self.action = np.zeros(capacity, np.int32)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.size = 0
        self._i = 0

    def add(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        i = self._i
        self.obs[i], self.action[i], self.reward[i], self.next_obs[i], self.done[i] = (
            obs, action, reward, next_obs, float(done))
        self._i = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
        idx = rng.integers(0, self.size, size=n)
        return self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.done[idx]


def build_q_network(obs_size: int, n_actions: int, hidden: list[int], seed: int):
    """MLP ``obs_size -> hidden... (ReLU) -> n_actions`` (linear). Glorot-uniform init, seeded."""
    inp = tf.keras.Input(shape=(obs_size,), dtype=tf.float32)
    x = inp
    for i, width in enumerate(hidden):
        x = tf.keras.layers.Dense(width, activation="relu",
                                  kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + i))(x)
    out = tf.keras.layers.Dense(n_actions, kernel_initializer=tf.keras.initializers.GlorotUniform(
        seed=seed + len(hidden)))(x)
    return tf.keras.Model(inp, out)


class DQNAgent:
    """Double DQN agent shared by all dispatchers.

    Args:
        obs_size: length of the observation (see :func:`testbed.agent.observation.observation_size`).
        n_actions: size of the policy catalogue.
        spec: hyper-parameters (:class:`testbed.spec.aset.AgentSpec`).
        seed: seeds the network init, the replay sampling and epsilon-greedy.
    """

    def __init__(self, obs_size: int, n_actions: int, spec: AgentSpec, seed: int = 0):
        tf.random.set_seed(seed)
        self.spec = spec
        self.obs_size, self.n_actions = obs_size, n_actions
        self.rng = np.random.default_rng(seed)
        self.online = build_q_network(obs_size, n_actions, spec.hidden, seed)
        self.target = build_q_network(obs_size, n_actions, spec.hidden, seed)
        self.target.set_weights(self.online.get_weights())
        self.optimizer = tf.keras.optimizers.Adam(learning_rate=spec.learning_rate)
        self.replay = ReplayBuffer(spec.replay_size, obs_size)
        self.decisions = 0
        self.updates = 0
        self._gamma = tf.constant(spec.gamma, tf.float32)
        self._loss = tf.keras.losses.Huber(delta=spec.huber_delta)

    # -- acting -------------------------------------------------------------------------------
    def epsilon(self) -> float:
        """Linear schedule over ``epsilon_decay_steps`` decisions."""
        s = self.spec
        frac = min(1.0, self.decisions / s.epsilon_decay_steps)
        return s.epsilon_start + frac * (s.epsilon_end - s.epsilon_start)

    @tf.function(reduce_retracing=True)
    def _q(self, obs: tf.Tensor) -> tf.Tensor:
        return self.online(obs, training=False)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, n_actions), for observations of shape (batch, obs_size)."""
        return self._q(tf.convert_to_tensor(np.asarray(obs, np.float32))).numpy()

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Actions (int array, shape (batch,)) for a batch of observations (one row per dispatcher);
        epsilon-greedy when ``explore`` (each row explores independently), greedy otherwise."""
        obs = np.atleast_2d(obs)
        greedy = np.argmax(plan_scores(self.q_values(obs), obs, self.spec.plan_margin, self.n_actions), axis=1)
        if not explore:
            return greedy
        eps = self.epsilon()
        self.decisions += len(obs)
        rnd = self.rng.random(len(obs)) < eps
        return np.where(rnd, self.rng.integers(0, self.n_actions, len(obs)), greedy)

    # -- learning -----------------------------------------------------------------------------
    @tf.function
    def _train_step(self, obs, action, reward, next_obs, done):
        next_online = plan_scores(self.online(next_obs, training=False), next_obs, self.spec.plan_margin,
                                  self.n_actions)
        best = tf.argmax(next_online, axis=1, output_type=tf.int32)
        next_target = self.target(next_obs, training=False)
        next_q = tf.gather(next_target, best, axis=1, batch_dims=1)
        y = tf.stop_gradient(reward + self._gamma * (1.0 - done) * next_q)
        with tf.GradientTape() as tape:
            q = tf.gather(self.online(obs, training=True), action, axis=1, batch_dims=1)
            loss = self._loss(y, q)
        grads = tape.gradient(loss, self.online.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.online.trainable_variables, strict=True))
        return loss

    def remember(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        """Store one transition (reward in [0, 1]: the window's success ratio)."""
        self.replay.add(obs, action, reward, next_obs, done)

    def maybe_train(self) -> float | None:
        """One gradient step if the buffer holds ``train_start`` transitions and it is time
        (every ``train_every`` calls); copy to the target network on schedule. Returns the loss."""
        s = self.spec
        if self.replay.size < max(s.train_start, s.batch_size):
            return None
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls % s.train_every:
            return None
        batch = self.replay.sample(self.rng, s.batch_size)
        loss = float(self._train_step(*(tf.convert_to_tensor(b) for b in batch)))
        self.updates += 1
        if self.updates % s.target_update_steps == 0:
            self.target.set_weights(self.online.get_weights())
        return loss

    # -- checkpoints --------------------------------------------------------------------------
    def weights(self) -> list[np.ndarray]:
        """Online network weights [W0, b0, W1, b1, ...] (Dense kernels are (in, out))."""
        return [np.asarray(w) for w in self.online.get_weights()]

    def save(self, path: str | Path) -> None:
        """Training checkpoint (``tf.train.Checkpoint``: online, target, optimizer, and ``io_sizes``
        = [observation size, actions], checked by :meth:`load`) at ``path``."""
        ckpt = tf.train.Checkpoint(online=self.online, target=self.target, optimizer=self.optimizer,
                                   io_sizes=tf.Variable([self.obs_size, self.n_actions], dtype=tf.int64))
        ckpt.write(str(path))


# ----------------------------------------------------------------------------- training
def check_can_train(cfg: AsetConfig, plans: list[Plan], steps: int, item: str) -> None:
    """Refuse a run whose network could take no gradient step: each step (window) gives at most one
    transition per dispatcher (source), and the first gradient step needs ``agent.train_start`` (and
    ``agent.batch_size``) of them in the replay buffer.

    Args:
        plans: the training scenarios' plans (all of one set of sources). steps: the run's steps;
            item: where they come from, for the message (``training.steps``, ``--steps``).

    Raises:
        InputError: naming the steps, the dispatchers and ``agent.train_start`` / ``batch_size``.
    """
    ag, n = cfg.agent, len(plans[0].sources)
    need = max(ag.train_start, ag.batch_size)
    if steps * n < need:
        which = "agent.train_start" if ag.train_start >= ag.batch_size else "agent.batch_size"
        raise InputError(f"{item} {steps} x {counted(n, 'dispatcher')} (the sources of the training scenarios) = at "
                         f"most {counted(steps * n, 'transition')}, fewer than {which} {need}: the network would take "
                         f"no gradient step and an untrained policy would be exported; raise the steps to at least "
                         f"{-(-need // n)} or lower {which}")


def _scalar(tag: str, value: float, step: int) -> None:
    """Write one TensorBoard scalar with ``tf.summary.write`` (TensorFlow core: the TensorBoard
    package is not needed to write the event files, only to view them)."""
    from tensorflow.core.framework import summary_pb2

    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = "scalars"
    md.data_class = summary_pb2.DATA_CLASS_SCALAR
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=md.SerializeToString())


class _Run:
    """The state of one training run (one seed): env, agent, log writer, progress bar."""

    def __init__(self, cfg: AsetConfig, base: Path, seed: int, out: Path, plans, simulator_factory):
        tf_one_thread()
        tr = cfg.training
        self.cfg, self.seed, self.out = cfg, seed, out
        if plans is None:  # every check before the run's folders (below)
            plans = training_scenarios(cfg, base)[0]
        self.plans = plans
        self.env = AsetSimEnv(plans, cfg.observation, tr.episode_s, simulator_factory=simulator_factory,
                              policies=aset_actions(cfg), reward=cfg.reward)
        self.agent = DQNAgent(self.env.obs_size, len(self.env.policies), cfg.agent, seed=seed)
        clear_run_dir(out)  # an earlier run's checkpoints and events would pass for this one's
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.writer = tf.summary.create_file_writer(str(out / "tb"))
        self.result = TrainResult(out, out / "policy", seed)
        self.rewards: list[float] = []
        self.loss: float | None = None


def _log_episode(run: _Run, step: int, scenario: str, info: dict, share: np.ndarray) -> None:
    """One row of ``episodes.csv`` and the TensorBoard episode scalars."""
    row = {"step": step, "scenario": scenario, "success_ratio": info["success_ratio"], "queries": info["queries"],
           "baseline_success_ratio": info.get("baseline_success_ratio", float("nan")),
           "mean_reward": float(np.mean(run.rewards)) if run.rewards else 0.0, "epsilon": run.agent.epsilon(),
           "policy_share": {p: int(n) for p, n in zip(run.env.policies, share, strict=True)}}
    run.result.episodes.append(row)
    with run.writer.as_default():
        _scalar("episode/success_ratio", row["success_ratio"], step)
        _scalar("episode/mean_reward", row["mean_reward"], step)
    run.rewards = []


def _log_step(run: _Run, step: int) -> None:
    with run.writer.as_default():
        _scalar("train/epsilon", run.agent.epsilon(), step)
        if run.loss is not None:
            _scalar("train/loss", run.loss, step)


def _learn_in_process(run: _Run, steps: int, bar) -> None:
    """The plain loop: act epsilon-greedy, step the env, store settled transitions, train."""
    env, agent, tr = run.env, run.agent, run.cfg.training
    obs, info = env.reset(seed=run.seed)
    scenario = info["scenario"]
    for step in range(1, steps + 1):
        action = agent.act(obs, explore=True)
        obs, _, _, truncated, info = env.step(action)
        for _i, o, a, r, nxt in info["transitions"]:
            agent.remember(o, a, r, nxt, False)
            run.rewards.append(r)
        run.loss = agent.maybe_train() or run.loss
        if truncated:
            _log_episode(run, step, scenario, info, env.policy_windows.sum(0))
            obs, info = env.reset()
            scenario = info["scenario"]
        if step % 50 == 0:
            _log_step(run, step)
        if step % tr.checkpoint_every == 0 or step == steps:
            agent.save(run.out / "checkpoints" / f"ckpt-{step}")
        _progress(bar, run, step, steps)


def rollout_episode(cfg_json: str, weights: list[np.ndarray], epsilon: float, seed: int, base: str) -> dict:
    """One training episode in a worker process: the plan drawn from the config's scenarios, the
    given network weights acting epsilon-greedy; returns its transitions and figures."""

    cfg = AsetConfig.model_validate_json(cfg_json)
    sampler = _worker_sampler(cfg, Path(base))
    env = AsetSimEnv(sampler, cfg.observation, cfg.training.episode_s, policies=aset_actions(cfg), reward=cfg.reward)
    pol = NumpyPolicy.from_weights(weights, cfg.observation, cfg.agent.plan_margin)
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trans: list[tuple] = []
    done, steps = False, 0
    while not done:
        greedy = pol.act(obs)
        explore = rng.random(len(greedy)) < epsilon
        action = np.where(explore, rng.integers(0, len(env.policies), len(greedy)), greedy)
        obs, _, _, done, out = env.step(action)
        trans += out["transitions"]
        steps += 1
    return {"scenario": info["scenario"], "transitions": trans, "steps": steps, "info": out,
            "share": env.policy_windows.sum(0)}


_SAMPLERS: dict[str, PlanSampler] = {}


def _worker_sampler(cfg: AsetConfig, base: Path) -> PlanSampler:
    key = cfg.model_dump_json()
    if key not in _SAMPLERS:
        _SAMPLERS[key] = scenario_sampler([resolve(base, s) for s in cfg.training.scenarios], cfg.training.randomise)[0]
    return _SAMPLERS[key]


def _learn_with_workers(run: _Run, steps: int, bar, base: Path, backend: str, ray_address: str | None) -> None:
    """Rollout workers (module docstring): N episodes at a time, then the learner's updates."""

    agent, tr = run.agent, run.cfg.training
    n = tr.rollout_workers
    cfg_json = run.cfg.model_dump_json()
    step, rng = 0, np.random.default_rng(run.seed)
    next_ckpt = tr.checkpoint_every
    while step < steps:
        weights = agent.weights()
        eps = agent.epsilon()
        tasks = [(cfg_json, weights, eps, int(rng.integers(2**31 - 1)), str(base)) for _ in range(n)]
        for _, ep in imap_unordered(rollout_episode, tasks, backend=backend, jobs=n, ray_address=ray_address):
            for _i, o, a, r, nxt in ep["transitions"]:
                agent.remember(o, a, r, nxt, False)
                run.rewards.append(r)
            for _ in range(ep["steps"]):
                agent.decisions += len(run.env.contexts)
                run.loss = agent.maybe_train() or run.loss
            step += ep["steps"]
            _log_episode(run, step, ep["scenario"], ep["info"], ep["share"])
            _log_step(run, step)
            _progress(bar, run, min(step, steps), steps)
        if step >= next_ckpt or step >= steps:
            agent.save(run.out / "checkpoints" / f"ckpt-{step}")
            next_ckpt += tr.checkpoint_every


def _progress(bar, run: _Run, step: int, steps: int) -> None:
    if bar is None or not (step % 20 == 0 or step == steps):
        return
    last = run.result.episodes[-1] if run.result.episodes else None
    loss = run.loss if run.loss is not None else float("nan")
    status = (f"seed {run.seed}  eps {run.agent.epsilon():.2f}  loss {loss:.4f}  last episode {last['scenario']} "
              f"success {last['success_ratio']:.3f}" if last else f"seed {run.seed}  eps {run.agent.epsilon():.2f}")
    bar[0].update(bar[1], completed=step, status=status)


def _progress_bar(console, steps: int):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn("[bold]train[/bold] {task.completed}/{task.total}"), BarColumn(),
                   TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                   console=console, transient=False)
    task = bar.add_task("train", total=steps, status="")
    bar.start()
    return bar, task


def _export(run: _Run, path: Path, steps: int) -> None:
    """The greedy policy as ``path.npz`` + ``path.json`` (no TensorFlow needed to run it)."""
    meta = {"steps": steps, "reward_baseline": run.cfg.reward.baseline,
            "reward_baseline_mix": run.cfg.reward.baseline_mix, "reward_team_weight": run.cfg.reward.team_weight}
    export_weights(run.cfg, run.env, run.agent.weights(), path, run.seed, meta)


def train(cfg: AsetConfig, base: Path, *, steps: int | None = None, progress: bool = True,
          simulator_factory=None, plans=None, console=None, seed: int | None = None,
          out_dir: Path | None = None, backend: str = "process", ray_address: str | None = None) -> TrainResult:
    """One training run (one seed) per ``cfg`` (``cfg.training`` required) in ``out_dir``, emptied
    first of what an earlier run wrote there (:func:`clear_run_dir`); exports its policy unless the
    network took no gradient step (``updates`` 0 in the result: nothing exported, the caller says so).

    Args:
        cfg: the ASET config. base: folder for relative paths (the repository).
        steps: override ``training.steps``. progress: show a rich progress bar.
        simulator_factory / plans: for tests (a fake simulator; a Plan or PlanSampler).
        seed: the run's seed (default the config's). out_dir: the run's folder (default
            ``training.out_dir/<name>``). backend / ray_address: where rollout workers run.

    Raises:
        ValueError: ``cfg.training`` is missing.
    """
    tr = _dqn_training(cfg)
    steps = steps or tr.steps
    seed = cfg.seed if seed is None else int(seed)
    out = out_dir or resolve(base, tr.out_dir) / cfg.name
    run = _Run(cfg, base, seed, out, plans, simulator_factory)
    t_start = time.perf_counter()
    bar = _progress_bar(console, steps) if progress else None
    try:
        if tr.rollout_workers and simulator_factory is None:
            _learn_with_workers(run, steps, bar, base, backend, ray_address)
        else:
            _learn_in_process(run, steps, bar)
    finally:
        if bar is not None:
            bar[0].stop()
        run.writer.close()
    if run.agent.updates:  # an untrained network is no policy
        _export(run, run.result.policy_path, steps)
    run.result.wall_s = time.perf_counter() - t_start
    run.result.steps = steps
    run.result.agent = run.agent
    run.result.updates = run.agent.updates
    write_curve(out, run.result.episodes)
    return run.result


def _dqn_training(cfg: AsetConfig) -> TrainingSpec:
    """``cfg.training`` of a DQN training.

    Raises:
        ValueError: no ``training:`` section, or ``training.method: rollout``
            (:func:`testbed.aset.rollout.train_rollout` trains that).
    """
    if cfg.training is None:
        raise ValueError(f"ASET config {cfg.name!r}: a 'training:' section is required for testbed train")
    if cfg.training.method != "dqn":
        raise ValueError(f"ASET config {cfg.name!r}: training.method is {cfg.training.method}, not dqn: "
                         f"testbed.aset.rollout.train_rollout trains it (testbed train does)")
    return cfg.training


def _train_seed(cfg_json: str, base: str, seed: int, steps: int | None, out: str) -> dict:
    """One seed's training run in a worker process; returns what the parent needs."""
    cfg = AsetConfig.model_validate_json(cfg_json)
    res = train(cfg, Path(base), steps=steps, progress=False, seed=seed, out_dir=Path(out))
    return {"seed": seed, "episodes": res.episodes, "wall_s": res.wall_s, "steps": res.steps,
            "policy_path": str(res.policy_path), "out_dir": str(res.out_dir), "updates": res.updates}


def _from_worker(r: dict) -> TrainResult:
    """The :class:`TrainResult` of a :func:`_train_seed` answer."""
    return TrainResult(Path(r["out_dir"]), Path(r["policy_path"]), r["seed"], r["episodes"], r["wall_s"], r["steps"],
                       updates=r["updates"])


def refuse_untrained(results: list[TrainResult], what: Callable[[TrainResult], str]) -> None:
    """A run whose network took no gradient step exported nothing: say so, and that nothing was
    copied (``training.export_to``), with a non-zero exit.

    Raises:
        RunFailure: exit code 5 (:data:`testbed.core.errors.EXIT_NOTHING_MEASURED`), naming the runs.
    """
    bad = [r for r in results if not r.updates]
    if bad:
        runs = "; ".join(f"{what(r)}: {counted(r.steps, 'step')}, {counted(len(r.episodes), 'episode')} finished"
                         for r in bad)
        raise RunFailure(f"{runs}: the network took no gradient step (fewer transitions settled than "
                         f"agent.train_start asks before the first): nothing exported, no policy copied; raise "
                         f"the steps", EXIT_NOTHING_MEASURED)


def train_seeds(cfg: AsetConfig, base: Path, *, steps: int | None = None, jobs: int = 1, backend: str = "process",
                ray_address: str | None = None, console=None,
                scenarios: tuple[PlanSampler, list[Plan]] | None = None) -> list[TrainResult]:
    """One run per seed of ``training.seeds`` (``seed-<k>/`` each, emptied first of an earlier
    run's outputs; ``jobs`` at a time), the combined ``curves.png``, and the policy of
    ``export_seed`` (default the first seed) copied to ``training.export_to``. ``scenarios``:
    :func:`training_scenarios` of ``cfg`` when the caller has them (else planned and checked here).
    Everything is checked before anything is written.

    Raises:
        ValueError: no ``training:`` section, or not ``method: dqn``. InputError (ConfigError,
            PlanError...): the scenarios (:func:`training_scenarios`), ``training.seeds``
            (:func:`training_seeds`), steps too few to train (:func:`check_can_train`), an output
            path that cannot be written (:func:`check_outputs`). RunFailure: a seed's network took
            no gradient step (:func:`refuse_untrained`; nothing copied to ``export_to``).
    """

    tr = _dqn_training(cfg)
    seeds = training_seeds(cfg)
    root = resolve(base, tr.out_dir) / cfg.name
    sampler, plans = scenarios or training_scenarios(cfg, base)  # bad scenarios fail here, before any output
    check_can_train(cfg, plans, steps or tr.steps, "--steps" if steps else "training.steps")
    check_outputs(cfg, base, seeds)
    results: list[TrainResult] = []
    if jobs <= 1 or len(seeds) == 1:
        for s in seeds:
            results.append(train(cfg, base, steps=steps, seed=s, out_dir=root / f"seed-{s}", console=console,
                                 backend=backend, ray_address=ray_address, plans=sampler))
    else:
        tasks = [(cfg.model_dump_json(), str(base), s, steps, str(root / f"seed-{s}")) for s in seeds]
        for _, r in imap_unordered(_train_seed, tasks, backend=backend, jobs=jobs, ray_address=ray_address):
            results.append(_from_worker(r))
            if console is not None:
                console.print(f"seed {r['seed']}: {counted(r['steps'], 'step')} in {r['wall_s']:.0f} s")
    results.sort(key=lambda r: seeds.index(r.seed))
    write_curves(root, results)
    refuse_untrained(results, lambda r: f"seed {r.seed}")
    chosen = tr.export_seed if tr.export_seed is not None else seeds[0]
    if tr.export_to:

        src = next(r for r in results if r.seed == chosen).policy_path
        copy_checkpoint(src, resolve(base, tr.export_to))
    return results


def write_curves(root: Path, results: list[TrainResult]) -> None:
    """``curves.png``: every seed's learning curve (moving mean of the episode success ratio and,
    with a reward baseline, of the success ratio above the baseline run)."""
    root.mkdir(parents=True, exist_ok=True)
    runs = {f"seed {r.seed}": r.episodes for r in results if r.episodes}
    if runs:
        plot_curves(root / "curves.png", runs, f"ASET learning curves ({len(runs)} seeds)")
