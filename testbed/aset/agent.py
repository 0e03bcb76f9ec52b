"""The ASET agent: double DQN in TensorFlow/Keras, and a numpy policy for deployment.

Learning (``docs/system-model.md``, "ASET"): Q-network = MLP (``agent.hidden``, default 2 x 64, ReLU) ->
one Q-value per policy of the catalogue; double DQN target (van Hasselt, Guez, Silver, "Deep
Reinforcement Learning with Double Q-learning", AAAI 2016)::

    y = r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a))

where the argmax (here and when acting) is over :func:`~testbed.agent.npolicy.plan_scores`, i.e.
Q + ``agent.plan_margin`` at the source's planned policy (0 by default: the plain rule). The
target thus evaluates the policy that is actually followed, the margin-greedy one.

Huber loss (delta ``agent.huber_delta``) on Q_online(s, a) - y, Adam; experience replay
(uniform, ring buffer of ``agent.replay_size``); target network copied every
``agent.target_update_steps`` gradient steps; epsilon-greedy with a linear schedule. One network
is shared by all dispatchers: every dispatcher's transition goes into the same replay buffer.

Deployment: :func:`~testbed.agent.npolicy.export_policy` writes the weights as ``NAME.npz`` plus
``NAME.json``; :class:`~testbed.agent.npolicy.NumpyPolicy` (no TensorFlow import) runs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from testbed.agent.npolicy import NumpyPolicy, ObservationSizeError, export_policy, plan_scores
from testbed.spec.aset import AgentSpec

__all__ = ["DQNAgent", "NumpyPolicy", "ObservationSizeError", "ReplayBuffer", "build_q_network",
           "checkpoint_io_sizes", "export_policy"]


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


def build_q_network(obs_size: int, n_actions: int, hidden: list[int], seed: int) -> tf.keras.Model:
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

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save`.

        Raises:
            ObservationSizeError: the checkpoint's network takes another observation size (or gives
                another number of actions) than this agent's; the message names both.
        """
        n_in, n_out = checkpoint_io_sizes(path)
        if n_in is not None and (n_in, n_out) != (self.obs_size, self.n_actions):
            raise ObservationSizeError(f"training checkpoint {path}: network of {n_in} observation features -> "
                                       f"{n_out} actions; this agent has {self.obs_size} -> {self.n_actions} "
                                       f"(the observation changed? retrain with testbed train)")
        theirs = checkpoint_layer_widths(path)
        ours = [int(w.shape[1]) for w in self.target.get_weights() if w.ndim == 2]
        if theirs and theirs != ours:
            raise ObservationSizeError(f"training checkpoint {path}: network layers of widths {theirs}; this agent's "
                                       f"are {ours} (agent.hidden changed? retrain with testbed train)")
        ckpt = tf.train.Checkpoint(online=self.online, target=self.target, optimizer=self.optimizer)
        ckpt.read(str(path)).expect_partial()


def _target_kernels(path: str | Path) -> list[tuple[int, list[int]]]:
    """(layer index, shape) of the target network's Dense kernels in a checkpoint, in layer order."""
    import re

    return sorted((int(m.group(1)), shape) for name, shape in tf.train.list_variables(str(path))
                  if (m := re.match(r"target/_operations/(\d+)/_kernel/", name)) and len(shape) == 2)


def checkpoint_layer_widths(path: str | Path) -> list[int]:
    """The output width of each Dense layer of a :meth:`DQNAgent.save` checkpoint's network (hidden
    layers then the actions; [] when its kernels are not found), read without building it."""
    return [int(shape[1]) for _, shape in _target_kernels(path)]


def checkpoint_io_sizes(path: str | Path) -> tuple[int | None, int | None]:
    """(observation size, actions) of the network in a :meth:`DQNAgent.save` checkpoint, without
    building it: its ``io_sizes``, or for a checkpoint written before those were saved, the shapes
    of the target network's first and last Dense kernels (the online network's variables may be
    stored under the optimizer's path); (None, None) when neither is there."""
    names = dict(tf.train.list_variables(str(path)))
    key = "io_sizes/.ATTRIBUTES/VARIABLE_VALUE"
    if key in names:
        n_in, n_out = (int(v) for v in tf.train.load_variable(str(path), key))
        return n_in, n_out
    kernels = _target_kernels(path)
    if not kernels:
        return None, None
    return int(kernels[0][1][0]), int(kernels[-1][1][1])
