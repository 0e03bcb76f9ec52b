"""The Gymnasium environment of ASET over the simulator (:class:`AsetSimEnv`, ``testbed/AsetSim-v0``):
what the paper's double DQN (:mod:`testbed.aset.dqn`), the rollout regression's data and a
Stable-Baselines3 model (examples/selector/train_sb3.py) learn on.

Multi-dispatcher design (our choice, ``docs/system-model.md``, "ASET"): ONE environment step is ONE
decision window for ALL dispatchers of the shared network. The window is a whole number of report
intervals (500 ms in the scenarios; :func:`testbed.aset.episode.window_of`).

- ``action_space = MultiDiscrete([n_policies] * n_sources)``: row i = the policy index (into the
  action set) that source i applies per query during the next window.
- ``observation_space = Box(0, clip, (n_sources, obs_size), float32)``: row i = the observation of
  source i (:mod:`testbed.agent.observation`; sources, applications, clusters sorted by name; row i
  ends with source i's identity one-hot).
- Reward of the window of source i = success ratio of the queries source i CREATED in that window
  (optionally minus the same figure of a baseline run on the same seed, ``RewardSpec``), known
  only once all of them are resolved (at most the largest deadline later). The env therefore
  returns each finished transition in ``info["transitions"]`` as ``(source_index, obs, action,
  reward, next_obs)`` as soon as its reward is settled (windows without queries give no
  transition); the scalar ``reward`` of ``step`` is the mean reward of the transitions settled in
  that step (0.0 when none), for tools that read it. With ``immediate_reward=True`` the env
  instead settles each window at once on a copy of the simulator (exact, about 3x slower), so the
  scalar reward of a step is the reward of that step's decisions: what single-step learners such
  as Stable-Baselines3 need. Episodes end by truncation after ``episode_s`` (never
  ``terminated``); the last step runs the simulator until every query is resolved.

Every count comes from :class:`testbed.aset.episode.Episode`, the measure of ``testbed evaluate``.
One shared Q-network serves all rows (the trainer batches them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from pydantic import Field

from testbed.agent.observation import SourceContext, SourceObserver, context_size
from testbed.aset.episode import Episode, run_static, window_of
from testbed.aset.scenarios import SHAPE_PARTS, PlanSampler, scenario_sampler, space_shape  # noqa: F401
from testbed.model.policies import CATALOGUE
from testbed.plan.build import Plan
from testbed.plan.policy_resolution import aset_actions, load_aset
from testbed.sim.window import SimWindowStates
from testbed.spec.aset import AsetConfig, ObservationSpec, RandomiseSpec, RewardSpec, plan_key
from testbed.spec.experiment import ConfigError, format_validation_error
from testbed.spec.schema import Num, StrictModel


def plan_contexts(plan: Plan, policies: tuple[str, ...], obs_spec: ObservationSpec | None = None
                  ) -> list[SourceContext]:
    """One :class:`SourceContext` per source of the plan, sorted by source name (the source-id
    order of the observation); applications and clusters sorted by name; RTT from
    ``plan.rtt_ms``; each application's deadline; with ``obs_spec.plans``, each source's planned
    policy for this scenario (:meth:`ObservationSpec.planned`).

    Raises:
        ValueError: ``obs_spec.plans`` has no plan of this scenario's size (the message names it).
    """
    apps = sorted(plan.experiment.applications, key=lambda a: a.name)
    clusters = tuple(sorted(c.name for c in plan.clusters))
    sources = tuple(sorted(h.name for h in plan.sources))
    planned = obs_spec.planned(plan_key(plan.experiment), sources) if obs_spec is not None else None
    return [SourceContext(s, tuple(a.name for a in apps), clusters, tuple(plan.rtt_ms(s, c) for c in clusters),
                          policies, tuple(float(a.deadline_ms) for a in apps), sources=sources,
                          plan=planned[i] if planned else None)
            for i, s in enumerate(sources)]


def max_deadline_s(plan: Plan) -> float:
    """The largest application deadline of the plan, in s."""
    return max(a.deadline_ms for a in plan.experiment.applications) / 1e3


class _Settler:
    """Holds each (window, source) decision until its queries are all resolved; then emits the
    transition with the reward from the per-(window, source) counts."""

    def __init__(self, team_weight: float = 0.0) -> None:
        self.decisions: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
        self.next_obs: dict[tuple[int, int], np.ndarray] = {}
        self.team_weight = float(team_weight)

    def settle(self, upto_window: int, ok: np.ndarray, n: np.ndarray, base_ok: np.ndarray | None) -> list[tuple]:
        """Transitions of every decided window < ``upto_window`` whose next observation is known.

        Reward of (window w, source i): ``(1 - team_weight) * own + team_weight * team``, own =
        (ok[w, i] - base_ok[w, i]) / n[w, i], team = the same over every source's queries of
        window w (``RewardSpec``); windows where source i created nothing give no transition.
        """
        out = []
        for key in sorted(k for k in self.decisions if k[0] < upto_window and k in self.next_obs):
            obs, action = self.decisions.pop(key)
            nxt = self.next_obs.pop(key)
            w, i = key
            if w < len(n) and n[w, i]:
                gain = ok[w] - base_ok[w] if base_ok is not None else ok[w]
                r = float(gain[i]) / n[w, i]
                if self.team_weight:
                    r += self.team_weight * (float(gain.sum()) / float(n[w].sum()) - r)
                out.append((i, obs, action, r, nxt))
        return out


class WindowView(SimWindowStates):
    """The window states of an :class:`Episode`'s sources (:class:`testbed.sim.window.SimWindowStates`),
    one row per context (its source, and its clusters for the path utilization); reads the
    episode's current simulator."""

    def __init__(self, ep: Episode, contexts: list[SourceContext]):
        self.ep, self.contexts = ep, contexts
        super().__init__(ep.sim, [c.source for c in contexts], [c.clusters for c in contexts])

    @property
    def sim(self):
        return self.ep.sim


class AsetSimEnv(gym.Env):
    """ASET over the discrete-event simulator (:class:`testbed.sim.Simulator`, via :class:`Episode`).

    Args:
        plans: a :class:`Plan`, or a :data:`PlanSampler` drawing one per episode (randomised
            scenarios). Every plan must have the same sources, applications and clusters (names).
        obs_spec: the observation settings (window, K, scales).
        episode_s: simulated seconds per episode (truncation).
        initial_policy: the policy every source applies before its first decision.
        simulator_factory: ``(plan, seed, policies) -> simulator``; default the real simulator.
            Tests may pass a fake.
        policies: the action set (policy names in action-index order; default the catalogue).
        reward: :class:`testbed.spec.aset.RewardSpec` (default: the plain success ratio).
        immediate_reward: settle every window at once on a copy of the simulator (module docstring).

    Raises:
        ValueError: ``episode_s`` shorter than one window, or a sampled plan of another shape.
    """

    metadata = {"render_modes": []}

    def __init__(self, plans: Plan | PlanSampler, obs_spec: ObservationSpec, episode_s: float,
                 initial_policy: str = "closest", simulator_factory: Callable | None = None,
                 policies: tuple[str, ...] | None = None, reward: RewardSpec | None = None,
                 immediate_reward: bool = False):
        super().__init__()
        self._sampler: PlanSampler = plans if callable(plans) else (lambda rng, p=plans: p)
        self.spec_obs = obs_spec
        self.dt = obs_spec.window_ms / 1e3
        if episode_s < self.dt:
            raise ValueError(f"episode_s {episode_s} is shorter than one window ({self.dt} s)")
        self.episode_s = float(episode_s)
        self.policies = tuple(policies or CATALOGUE)
        if initial_policy not in self.policies:
            initial_policy = self.policies[0]
        self.initial_policy = initial_policy
        self.reward_spec = reward or RewardSpec()
        self.immediate = bool(immediate_reward)
        self._factory = simulator_factory
        probe = self._sampler(np.random.default_rng(0))
        self.contexts = plan_contexts(probe, self.policies, obs_spec)
        self._shape = space_shape(probe)
        self.obs_size = context_size(self.contexts[0], obs_spec)
        self.observation_space = gym.spaces.Box(0.0, float(obs_spec.clip), (len(self.contexts), self.obs_size),
                                                np.float32)
        self.action_space = gym.spaces.MultiDiscrete([len(self.policies)] * len(self.contexts))
        self.ep: Episode | None = None
        self.plan: Plan | None = None

    @property
    def source_names(self) -> list[str]:
        return [c.source for c in self.contexts]

    @property
    def sim(self):
        """The simulator of the current episode."""
        return self.ep.sim if self.ep is not None else None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """New episode: draw a plan, start a simulator seeded from the env's rng.

        ``options={"plan": Plan}`` forces the plan (evaluation), ``options={"sim_seed": int}``
        the simulator seed. Returns the observation (n_sources, obs_size) and info with the
        scenario name and the simulator seed.
        """
        super().reset(seed=seed)
        options = options or {}
        plan = options.get("plan") or self._sampler(self.np_random)
        ctxs = plan_contexts(plan, self.policies, self.spec_obs)
        if space_shape(plan) != self._shape:
            raise ValueError(f"plan {plan.experiment.name!r}: sources/applications/clusters "
                             f"{space_shape(plan)} differ from the env's {self._shape}")
        self.plan, self.contexts = plan, ctxs
        sim_seed = int(options.get("sim_seed", self.np_random.integers(2**31 - 1)))
        self.current = [self.initial_policy] * len(ctxs)
        self.ep = Episode(plan, sim_seed, {c.source: self.initial_policy for c in ctxs}, self.dt, self.episode_s,
                          simulator_factory=self._factory)
        base = self.reward_spec.baseline_for(plan_key(plan.experiment), len(ctxs))
        self.base_ok = None
        self.base_ratio = math.nan
        if base is not None:
            ref = run_static(plan, sim_seed, base, self.dt, self.episode_s) if self._factory is None \
                else self._fake_static(plan, sim_seed, base)
            self.base_ok, self.base_ratio = ref.ok, ref.success_ratio
        self.view = WindowView(self.ep, ctxs)
        self.observers = [SourceObserver(c, self.spec_obs) for c in ctxs]
        self.settle_lag = int(math.ceil(max_deadline_s(plan) / self.dt)) + 1
        self.settler = _Settler(self.reward_spec.team_weight)
        self.policy_windows = np.zeros((len(ctxs), len(self.policies)), np.int64)
        obs = self._observe()
        return obs, {"scenario": plan.experiment.name, "sim_seed": sim_seed}

    def _fake_static(self, plan: Plan, seed: int, policies: list[str]) -> Episode:
        assignment = {c.source: p for c, p in zip(self.contexts, policies, strict=True)}
        ep = Episode(plan, seed, assignment, self.dt, self.episode_s, simulator_factory=self._factory)
        ep.finish()
        return ep

    def _observe(self) -> np.ndarray:
        obs = np.stack([o.observe(self.view.state(i, self.current[i])) for i, o in enumerate(self.observers)])
        self._last_obs = obs
        return obs

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply one policy per source for the next window, simulate it, observe.

        Args:
            action: int array (n_sources,): index into the action set per source (sorted order).

        Returns:
            (obs (n_sources, obs_size), reward, terminated=False, truncated, info) with
            ``info["transitions"]`` (module docstring) and, at truncation,
            ``info["success_ratio"]`` / ``info["queries"]``: the episode's figures over all its
            queries (and ``info["baseline_success_ratio"]`` with a reward baseline).
        """
        action = np.asarray(action, dtype=np.int64).reshape(-1)
        if action.shape != (len(self.contexts),) or action.min() < 0 or action.max() >= len(self.policies):
            raise ValueError(f"action {action.tolist()}: need {len(self.contexts)} indices in "
                             f"[0, {len(self.policies)})")
        ep, w = self.ep, self.ep.w
        for i, a in enumerate(action):
            self.current[i] = self.policies[int(a)]
            self.policy_windows[i, int(a)] += 1
            self.settler.decisions[(w, i)] = (self._last_obs[i], int(a))
        ep.set_policies(self.current)
        resolved = ep.step()
        self.view.absorb(resolved)
        obs = self._observe()
        for i in range(len(self.contexts)):
            self.settler.next_obs[(w, i)] = obs[i]
        truncated = ep.w >= ep.n_windows
        if truncated:
            ep.finish()
            trans = self.settler.settle(ep.n_windows + 1, ep.ok, ep.n, self.base_ok)
        elif self.immediate:
            ok, n = ep.settled_counts()
            trans = self.settler.settle(w + 1, ok, n, self.base_ok)
        else:
            trans = self.settler.settle(ep.w - self.settle_lag + 1, ep.ok, ep.n, self.base_ok)
        info: dict[str, Any] = {"transitions": trans, "window": ep.w}
        if truncated:
            info["success_ratio"], info["queries"] = ep.success_ratio, ep.queries
            if self.base_ok is not None:
                info["baseline_success_ratio"] = self.base_ratio
        reward = float(np.mean([t[3] for t in trans])) if trans else 0.0
        return obs, reward, False, truncated, info


class SimEnvOptions(StrictModel):
    """The keywords of :func:`make_sim_env` besides the observation overrides, typed: scenario
    files (at least one), an ASET config file, the episode length (s, > 0), the load scale
    (validated as ``training.randomise.load_scale``) and ``immediate_reward`` (true or false)."""

    experiment: list[str] = Field(min_length=1)
    config: str | None = None
    episode_s: Num | None = Field(None, gt=0)
    load_scale: tuple[Num, Num] = (1.0, 1.0)
    immediate_reward: bool = False


def _validated(build: Callable[[], Any], what: str) -> Any:
    """What ``build`` (a pydantic validation) returns.

    Raises:
        ConfigError: each offending item located (``format_validation_error``), under ``what``.
    """
    from pydantic import ValidationError


    try:
        return build()
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "make_sim_env", what=what)) from None


def _as_names(value: Any) -> Any:
    """Paths as strings (a path or a list of them), anything else as it is (the model refuses it)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [str(v) if isinstance(v, Path) else v for v in value]
    return value


def make_sim_env(experiment: str | list[str], config: str | None = None, episode_s: float | None = None,
                 load_scale: tuple[float, float] = (1.0, 1.0), immediate_reward: bool = False,
                 **overrides: Any) -> AsetSimEnv:
    """The entry point of ``gymnasium.make("testbed/AsetSim-v0", experiment=...)``.

    Every keyword is validated before any scenario is planned.

    Args:
        experiment: a scenario file, or several (one drawn per episode).
        config: an ASET config file for the observation, action set and reward (default: the
            defaults of :class:`testbed.spec.aset.AsetConfig`).
        episode_s: episode length (default: the first experiment's duration).
        load_scale: every arrival rate x U(low, high) per episode.
        immediate_reward: settle each window at once (single-step learners; module docstring).
        overrides: keys of the observation spec (:class:`ObservationSpec`), a quantity in either
            form, as in the config file (``window="1s"`` or ``window_ms=1000``).

    Raises:
        ConfigError: a keyword of another type or out of range, an unknown keyword, an invalid
            config or scenario file, or a window that is not a whole multiple of a scenario's
            report interval; each named. PlanError, TopologyError: a scenario cannot be planned.
        ValueError: ``episode_s`` shorter than one window.
    """

    exps = [experiment] if isinstance(experiment, str | Path) else experiment
    opts = _validated(lambda: SimEnvOptions.model_validate({
        "experiment": _as_names(exps), "config": _as_names(config), "episode_s": episode_s,
        "load_scale": _as_names(load_scale), "immediate_reward": immediate_reward}), "keyword")
    cfg = load_aset(opts.config)[0] if opts.config else AsetConfig(name="gym")
    fields = list(ObservationSpec.model_fields)
    observed = [*fields, *(k.removesuffix("_ms") for k in fields if k.endswith("_ms"))]  # window: 1s
    what = "observation override" if set(overrides) <= set(observed) else (
        f"keyword: make_sim_env takes {', '.join(SimEnvOptions.model_fields)} and the observation's "
        f"{', '.join(observed)}")
    spec = _validated(lambda: cfg.observation.with_overrides(overrides), what)
    randomise = _validated(lambda: RandomiseSpec(load_scale=opts.load_scale), "load_scale")
    paths = [Path(p) for p in opts.experiment]
    sampler, plans = scenario_sampler(paths, randomise)
    for path, plan in zip(paths, plans, strict=True):
        try:
            window_of(plan, spec.window_ms / 1e3)
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc} (the observation window, window_ms)") from None
    return AsetSimEnv(sampler, spec, opts.episode_s or plans[0].experiment.duration_s, policies=aset_actions(cfg),
                      reward=cfg.reward, immediate_reward=opts.immediate_reward)
