"""Gymnasium environments of ASET: over the simulator (:class:`AsetSimEnv`) and over a live
emulation (:class:`AsetLiveEnv`), with identical observation and action spaces.

Multi-dispatcher design (our choice, system-model.md leaves it open): ONE environment step is ONE
decision window dt for ALL dispatchers of the shared network.

- ``action_space = MultiDiscrete([n_policies] * n_sources)``: row i = the policy index (into the
  catalogue) that source i applies per query during the next window.
- ``observation_space = Box(0, clip, (n_sources, obs_size), float32)``: row i = the observation of
  source i (:mod:`testbed.aset.observation`; sources, applications, clusters sorted by name).
- Reward of the window of source i = success ratio of the queries source i CREATED in that window,
  known only once all of them are resolved (completed, dropped, or past their deadline: at most
  max deadline + one report interval later). The env therefore returns each finished transition
  in ``info["transitions"]`` as ``(source_index, obs, action, reward, next_obs)`` as soon as its
  reward is settled (windows without queries give no transition); the scalar ``reward`` of
  ``step`` is the mean reward of the transitions settled in that step (0.0 when none), for tools
  that read it. Episodes end by truncation after ``episode_s`` (never ``terminated``); the last
  step runs the simulator past the deadline so every window settles.

One shared Q-network serves all rows (the trainer batches them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from testbed.aset.config import ObservationSpec
from testbed.aset.observation import SourceContext, SourceObserver, observation_size
from testbed.plan import Plan

#: A function drawing the plan of the next episode (randomised scenario) from the env's rng.
PlanSampler = Callable[[np.random.Generator], Plan]


def _catalogue() -> tuple[str, ...]:
    from testbed.policies import CATALOGUE

    return CATALOGUE


def plan_contexts(plan: Plan, policies: tuple[str, ...]) -> list[SourceContext]:
    """One :class:`SourceContext` per source of the plan, sorted by source name; applications and
    clusters sorted by name; RTT from ``plan.rtt_ms``."""
    apps = tuple(sorted(a.name for a in plan.experiment.applications))
    clusters = tuple(sorted(c.name for c in plan.clusters))
    return [SourceContext(s.name, apps, clusters, tuple(plan.rtt_ms(s.name, c) for c in clusters), policies)
            for s in sorted(plan.sources, key=lambda h: h.name)]


def max_deadline_s(plan: Plan) -> float:
    """The largest application deadline of the plan, in s."""
    return max(a.deadline_ms for a in plan.experiment.applications) / 1e3


class _Settler:
    """Books the queries of each (source, window) and emits transitions once they are settled."""

    def __init__(self, n_sources: int):
        self.counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])  # (w, i) -> [ok, n]
        self.decisions: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
        self.next_obs: dict[tuple[int, int], np.ndarray] = {}
        self.n = n_sources

    def settle(self, upto_window: int) -> list[tuple]:
        """Transitions of every decided window < ``upto_window`` whose next observation is known."""
        out = []
        for key in sorted(k for k in self.decisions if k[0] < upto_window and k in self.next_obs):
            obs, action = self.decisions.pop(key)
            nxt = self.next_obs.pop(key)
            ok, n = self.counts.pop(key, (0, 0))
            if n:
                out.append((key[1], obs, action, ok / n, nxt))
        for key in [k for k in self.counts if k[0] < upto_window]:
            del self.counts[key]
        return out


class AsetSimEnv(gym.Env):
    """ASET over the discrete-event simulator (:class:`testbed.sim.Simulator`).

    Args:
        plans: a :class:`Plan`, or a :data:`PlanSampler` drawing one per episode (randomised
            scenarios). Every plan must have the same sources, applications and clusters (names).
        obs_spec: the observation settings (window dt, K, scales).
        episode_s: simulated seconds per episode (truncation).
        initial_policy: the policy every source applies before its first decision.
        simulator_factory: ``(plan, seed, policies, **sim_kwargs) -> simulator``; default
            ``testbed.sim.Simulator(plan, seed=seed, policies=policies, **sim_kwargs)``. Tests may
            pass a fake.
        sim_kwargs: extra simulator arguments, e.g. ``base_dir`` (for trace / demand-matrix paths).

    Raises:
        ValueError: ``episode_s`` shorter than one window, or a sampled plan of another shape.
    """

    metadata = {"render_modes": []}

    def __init__(self, plans: Plan | PlanSampler, obs_spec: ObservationSpec, episode_s: float,
                 initial_policy: str = "closest", simulator_factory: Callable | None = None,
                 policies: tuple[str, ...] | None = None, sim_kwargs: dict | None = None):
        super().__init__()
        self._sim_kwargs = dict(sim_kwargs or {})
        self._sampler: PlanSampler = plans if callable(plans) else (lambda rng, p=plans: p)
        self.spec_obs = obs_spec
        self.dt = obs_spec.window_ms / 1e3
        if episode_s < self.dt:
            raise ValueError(f"episode_s {episode_s} is shorter than one window ({self.dt} s)")
        self.episode_s = float(episode_s)
        self.policies = tuple(policies or _catalogue())
        if initial_policy not in self.policies:
            raise ValueError(f"initial_policy {initial_policy!r} is not in the catalogue {self.policies}")
        self.initial_policy = initial_policy
        self._factory = simulator_factory or _default_simulator
        probe = self._sampler(np.random.default_rng(0))
        self.contexts = plan_contexts(probe, self.policies)
        self._shape = self._shape_of(self.contexts)
        ctx = self.contexts[0]
        self.obs_size = observation_size(len(ctx.applications), len(ctx.clusters), len(self.policies),
                                         obs_spec.history_windows)
        self.observation_space = gym.spaces.Box(0.0, float(obs_spec.clip), (len(self.contexts), self.obs_size),
                                                np.float32)
        self.action_space = gym.spaces.MultiDiscrete([len(self.policies)] * len(self.contexts))
        self.sim = None
        self.plan: Plan | None = None

    @staticmethod
    def _shape_of(ctxs: list[SourceContext]) -> tuple:
        return tuple(c.source for c in ctxs), ctxs[0].applications, ctxs[0].clusters

    @property
    def source_names(self) -> list[str]:
        return [c.source for c in self.contexts]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """New episode: draw a plan, start a simulator seeded from the env's rng.

        ``options={"plan": Plan}`` forces the plan (evaluation), ``options={"sim_seed": int}``
        the simulator seed. Returns the observation (n_sources, obs_size) and info with the
        scenario name.
        """
        super().reset(seed=seed)
        options = options or {}
        plan = options.get("plan") or self._sampler(self.np_random)
        ctxs = plan_contexts(plan, self.policies)
        if self._shape_of(ctxs) != self._shape:
            raise ValueError(f"plan {plan.experiment.name!r}: sources/applications/clusters "
                             f"{self._shape_of(ctxs)} differ from the env's {self._shape}")
        self.plan, self.contexts = plan, ctxs
        sim_seed = int(options.get("sim_seed", self.np_random.integers(2**31 - 1)))
        self.current = [self.initial_policy] * len(ctxs)
        self.sim = self._factory(plan, sim_seed, {c.source: self.initial_policy for c in ctxs}, **self._sim_kwargs)
        self.observers = [SourceObserver(c, self.spec_obs) for c in ctxs]
        self._index = {c.source: i for i, c in enumerate(ctxs)}
        self.window = 0
        self.n_windows = max(1, int(round(self.episode_s / self.dt)))
        self.settle_lag = int(math.ceil((max_deadline_s(plan) + self._report_s()) / self.dt)) + 1
        self.settler = _Settler(len(ctxs))
        self.stats = {"queries": 0, "success": 0}
        self.policy_windows = np.zeros((len(ctxs), len(self.policies)), np.int64)
        self._pending: list[list] = [[] for _ in ctxs]
        self._arrivals: list[dict] = [defaultdict(int) for _ in ctxs]
        obs = np.stack([o.observe(self._window_state(i)) for i, o in enumerate(self.observers)])
        self._last_obs = obs
        return obs, {"scenario": plan.experiment.name, "sim_seed": sim_seed}

    def _report_s(self) -> float:
        exp = self.plan.experiment
        for attr in ("report_interval_s",):
            v = getattr(exp, attr, None) or getattr(getattr(exp, "emulation", None), attr, None)
            if v:
                return float(v)
        return 0.5

    def _window_state(self, i: int) -> dict:
        """The raw window state of source i (module docstring of observation.py), from the sim."""
        ctx = self.contexts[i]
        sim = self.sim
        try:
            heard = sim.cluster_state(ctx.source)
        except TypeError:
            heard = sim.cluster_state()
        lu = sim.link_utilization()
        path_util = {}
        for c in ctx.clusters:
            links = sim.path_links(ctx.source, c)
            path_util[c] = max((lu.get((a, b), lu.get((b, a), 0.0)) for a, b in links), default=0.0)
        return {"arrivals": dict(self._arrivals[i]), "clusters": heard, "path_util": path_util,
                "resolved": self._pending[i], "policy": self.current[i]}

    def _collect(self) -> None:
        """Drain the simulator's resolved queries into the settler and the per-window views."""
        for q in self.sim.drain_resolved():
            i = self._index.get(q.source)
            if i is None:
                continue
            w = int(q.t0_s // self.dt)
            self.settler.counts[(w, i)][0] += int(bool(q.success))
            self.settler.counts[(w, i)][1] += 1
            self._pending[i].append((q.application, bool(q.success)))
            if q.t0_s < self.n_windows * self.dt:
                self.stats["queries"] += 1
                self.stats["success"] += int(bool(q.success))

    def _count_arrivals(self) -> None:
        created = created_since_last_call(self.sim)
        for q in created:
            i = self._index.get(q[0])
            if i is not None:
                self._arrivals[i][q[1]] += 1

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply one policy per source for the next window, simulate it, observe.

        Args:
            action: int array (n_sources,): index into the catalogue per source (sorted order).

        Returns:
            (obs (n_sources, obs_size), reward, terminated=False, truncated, info) with
            ``info["transitions"]`` (see the module docstring) and, at truncation,
            ``info["success_ratio"]``: the episode's success ratio over all its queries.
        """
        action = np.asarray(action, dtype=np.int64).reshape(-1)
        if action.shape != (len(self.contexts),) or action.min() < 0 or action.max() >= len(self.policies):
            raise ValueError(f"action {action.tolist()}: need {len(self.contexts)} indices in "
                             f"[0, {len(self.policies)})")
        w = self.window
        for i, a in enumerate(action):
            name = self.policies[int(a)]
            if name != self.current[i]:
                self.sim.set_policy(self.contexts[i].source, name)
                self.current[i] = name
            self.policy_windows[i, int(a)] += 1
            self.settler.decisions[(w, i)] = (self._last_obs[i], int(a))
        self.sim.run_until((w + 1) * self.dt)
        self._arrivals = [defaultdict(int) for _ in self.contexts]
        self._count_arrivals()
        self._pending = [[] for _ in self.contexts]
        self._collect()
        obs = np.stack([o.observe(self._window_state(i)) for i, o in enumerate(self.observers)])
        self._last_obs = obs
        self.window = w + 1
        truncated = self.window >= self.n_windows
        for i in range(len(self.contexts)):
            self.settler.next_obs[(w, i)] = obs[i]
        if truncated:  # let every decided window settle: run past the last deadline
            self.sim.run_until(self.window * self.dt + self.settle_lag * self.dt)
            self._collect()
            trans = self.settler.settle(self.window + 1)
        else:
            trans = self.settler.settle(w + 1 - self.settle_lag)
        info: dict[str, Any] = {"transitions": trans, "window": self.window}
        if truncated:
            n = self.stats["queries"]
            info["success_ratio"] = self.stats["success"] / n if n else float("nan")
            info["queries"] = n
        reward = float(np.mean([t[3] for t in trans])) if trans else 0.0
        return obs, reward, False, truncated, info


def created_since_last_call(sim) -> list[tuple[str, str]]:
    """(source, application) of every query the simulator created since the last call.

    Uses the simulator's own counter when it has one (``drain_created``); the contract of
    issue 4 does not require it, so without it the list is empty and the arrival-rate features
    stay 0 (documented gap)."""
    fn = getattr(sim, "drain_created", None)
    if fn is None:
        return []
    return [(getattr(q, "source", None) or q[0], getattr(q, "application", None) or q[1]) for q in fn()]


def _default_simulator(plan: Plan, seed: int, policies: Mapping[str, str], **kwargs):
    """The real simulator; when it has no ``drain_created`` yet, a subclass that counts the
    queries each source creates (one ``_decide`` call per created query)."""
    from testbed.sim import Simulator

    if hasattr(Simulator, "drain_created"):
        return Simulator(plan, seed=seed, policies=dict(policies), **kwargs)
    return _counting_simulator_class()(plan, seed=seed, policies=dict(policies), **kwargs)


_COUNTING = None


def _counting_simulator_class():
    global _COUNTING
    if _COUNTING is None:
        from testbed.sim import Simulator

        class CountingSimulator(Simulator):
            """:class:`testbed.sim.Simulator` + ``drain_created()``: (source, application) of every
            query created since the last call (the arrival-rate features of ASET)."""

            def _decide(self, si, ai):
                self.__dict__.setdefault("_aset_created", []).append((self.sources[si], self.apps[ai].name))
                return super()._decide(si, ai)

            def drain_created(self):
                out = self.__dict__.get("_aset_created", [])
                self._aset_created = []
                return out

        _COUNTING = CountingSimulator
    return _COUNTING


class AsetLiveEnv(gym.Env):
    """ASET over a running emulation, with the SAME spaces as :class:`AsetSimEnv`.

    Each source's dispatcher (``testbed.workload`` with ``policy: aset`` and
    ``aset.control_socket`` set) sends its raw window state to this env over a Unix datagram
    socket (the filesystem is shared across Mininet's network namespaces) and waits for the
    policy name; :meth:`step` replies to every source and waits for the next window's states.
    Rewards: the live window state carries ``(application, success[, t0_s])`` of the queries
    resolved in the window; with ``t0_s`` the env settles per creation window exactly as the
    simulator env, without it the reward is the success ratio of the queries resolved in the
    window (an approximation, said in ``info["reward_kind"]``).

    Args:
        contexts: one :class:`SourceContext` per source (sorted by source), as in the sim env.
        obs_spec: the same observation settings as the checkpoint.
        socket_path: the Unix socket path to bind.
        timeout_s: how long to wait for every source's state per window.
    """

    metadata = {"render_modes": []}

    def __init__(self, contexts: list[SourceContext], obs_spec: ObservationSpec, socket_path: str,
                 timeout_s: float = 5.0, episode_windows: int = 600):
        super().__init__()
        from testbed.aset.live import ControlServer

        self.contexts = contexts
        self.spec_obs = obs_spec
        self.policies = contexts[0].policies
        ctx = contexts[0]
        self.obs_size = observation_size(len(ctx.applications), len(ctx.clusters), len(self.policies),
                                         obs_spec.history_windows)
        self.observation_space = gym.spaces.Box(0.0, float(obs_spec.clip), (len(contexts), self.obs_size),
                                                np.float32)
        self.action_space = gym.spaces.MultiDiscrete([len(self.policies)] * len(contexts))
        self.server = ControlServer(socket_path)
        self.timeout_s = timeout_s
        self.episode_windows = episode_windows

    def _gather(self) -> tuple[np.ndarray, float]:
        states = self.server.receive_all([c.source for c in self.contexts], self.timeout_s)
        obs, rewards = [], []
        for i, c in enumerate(self.contexts):
            st = states[c.source]
            obs.append(self.observers[i].observe(st))
            res = st.get("resolved") or []
            if res:
                rewards.append(sum(1 for r in res if r[1]) / len(res))
        return np.stack(obs), float(np.mean(rewards)) if rewards else 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.observers = [SourceObserver(c, self.spec_obs) for c in self.contexts]
        self.window = 0
        obs, _ = self._gather()
        return obs, {"reward_kind": "resolved_in_window"}

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action, dtype=np.int64).reshape(-1)
        self.server.reply_all({c.source: self.policies[int(a)] for c, a in zip(self.contexts, action, strict=True)})
        obs, reward = self._gather()
        self.window += 1
        return obs, reward, False, self.window >= self.episode_windows, {"reward_kind": "resolved_in_window"}

    def close(self) -> None:
        srv = getattr(self, "server", None)
        if srv is not None:
            srv.close()
