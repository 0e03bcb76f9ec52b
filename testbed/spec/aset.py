"""The ASET configuration (``experiments/aset-*.yaml``): every constant of the agent in one file.

The defaults (``docs/system-model.md``, "ASET"): K = 4 windows of arrival history, an MLP 2 x 64
ReLU trained by double DQN with a target network, experience replay, epsilon-greedy and the Huber
loss, Adam. The decision window is 500 ms, one report interval: a window is a whole number of
report intervals, since a shorter one would only see the same stale report several times. The
normalisation scales are our choice (they only keep the features near [0, 1]); each is a config
value. Quantities carry their unit (``window: 100ms`` or ``window_ms: 100``), as everywhere in the
testbed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from testbed.core.errors import counted
from testbed.core.util import repeated
from testbed.spec.experiment import MAX_SEED, ConfigError, PolicyName, load_yaml_model
from testbed.spec.schema import Num, StrictModel
from testbed.spec.units import parse_delay_ms, parse_duration_s


def plan_key(experiment, name: str | None = None) -> str:
    """The scenario name an experiment's plans and baseline mixes are looked up by: its
    ``aset.plan`` when set (a renamed copy of a suite scenario), else its name (``name``, or
    ``experiment.name``). ``experiment``: anything with ``aset`` (an ``Experiment``, or a source's
    ``SourceConfig`` with ``name`` its ``experiment``)."""
    aset = getattr(experiment, "aset", None)
    return aset.plan if aset is not None and aset.plan else (experiment.name if name is None else name)


def _nonempty(v: dict[str, list[str]] | None, what: str, why: str) -> dict[str, list[str]] | None:
    """Refuse an empty per-scenario assignment table (``{}``): it names no scenario."""
    if v is not None and not v:
        raise ValueError(f"{{}} names no scenario{why}: give each {what} (its experiment name: one policy per "
                         f"source, sources sorted by name), or leave it out")
    return v


#: A seed of the ASET config: the range ``testbed ... --seeds`` accepts (numpy's and TensorFlow's seeds).
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


def check_scenario_keys(item: str, table: Mapping[str, Any] | None, known: Mapping[str, str]) -> None:
    """Refuse a key of a per-scenario table (``reward.baseline_mix``, ``observation.plans``) that
    names no training scenario: ONE rule for every such table (``testbed.aset.scenarios.check_reward_baselines``
    applies it to ``reward.baseline_mix``; ``observation.plans`` may also plan evaluation-only
    scenarios, so training does not apply it there).

    Args:
        item: the table's key in the config (``observation.plans``). table: the table (None: not set).
        known: each training scenario's name (:func:`plan_key`) -> how the message shows it (e.g.
            with its file).

    Raises:
        ConfigError: ``<item>.<key>: no training scenario has that name (known: ...)``.
    """
    for key in table or {}:
        if key not in known:
            raise ConfigError(f"{item}.{key}: no training scenario has that name "
                              f"(known: {', '.join(sorted(known.values()))})")


def _set_away_from_default(model: StrictModel, keys: tuple[str, ...]) -> list[str]:
    """Those of ``keys`` that ``model``'s input set to something else than the field's default
    (a ``model_dump_json`` round trip sets every key, to its value: not counted)."""
    defaults = type(model).model_fields
    return [k for k in keys if k in model.model_fields_set and getattr(model, k) != defaults[k].default]


def _fits(assignment: list[str], where: str, n_sources: int, names: str = "") -> list[str]:
    """``assignment`` (one policy per source) if it has ``n_sources`` entries.

    Raises:
        ValueError: another length, naming ``where`` and both counts.
    """
    if len(assignment) != n_sources:
        raise ValueError(f"{where}: {counted(len(assignment), 'policy', 'policies')} for "
                         f"{counted(n_sources, 'source')}{names}")
    return list(assignment)


class ObservationSpec(StrictModel):
    """How the per-window observation is built and normalised (see :mod:`testbed.agent.observation`).

    ``history_windows``: K, windows of per-application arrival rate (``docs/system-model.md``: K = 4).
    ``rate_scale_qps``: arrival rates are divided by this (queries/s). ``queue_scale``: queue
    length per worker is divided by this. ``rtt_scale_ms``: RTTs are divided by this (ms).
    ``clip``: every feature is clipped to [0, clip] so the Gymnasium Box is bounded.

    ``plans`` (docs/history.md, "ASET rounds"): per scenario (its experiment ``name``), the planned
    policy of each source (sources sorted by name): the per-source static mix that
    ``testbed evaluate --headroom`` finds in the simulator (``oracle.json``'s ``mixes``). When set,
    the observation ends with a one-hot of the source's planned policy, and the agent's
    ``plan_margin`` makes the plan its default decision. A scenario without a plan cannot be
    observed (:meth:`planned` raises).
    """

    window_ms: Num = Field(500.0, gt=0)
    history_windows: int = Field(4, ge=1, le=64)
    rate_scale_qps: Num = Field(20.0, gt=0)
    queue_scale: Num = Field(4.0, gt=0)
    rtt_scale_ms: Num = Field(100.0, gt=0)
    clip: Num = Field(5.0, gt=0)
    plans: dict[str, list[PolicyName]] | None = None

    unit_keys = (("window", parse_delay_ms, "ms"), ("rtt_scale", parse_delay_ms, "ms"))

    @field_validator("plans")
    @classmethod
    def _some_plan(cls, v: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        return _nonempty(v, "scenario's planned per-source policies", "")

    def with_overrides(self, overrides: Mapping[str, Any]) -> ObservationSpec:
        """This spec with ``overrides`` applied and the whole validated again, a quantity in either
        form (``window="1s"`` replaces ``window_ms``, as in the config file).

        Raises:
            pydantic.ValidationError: an unknown key (``extra_forbidden``) or a bad value, each
                located by its key.
        """
        base = {k: v for k, v in self.model_dump().items()
                if k not in overrides and k.rsplit("_", 1)[0] not in overrides}
        return ObservationSpec.model_validate({**base, **overrides})

    def planned(self, scenario: str, sources: list[str] | tuple[str, ...]) -> list[str] | None:
        """The planned policy of each source (in the order of ``sources``, sorted by name) for an
        episode of ``scenario``, or None when this spec has no ``plans`` (no plan block).

        Raises:
            ValueError: ``plans`` is set but has no entry for ``scenario``, or its entry has
                another number of policies than ``sources``; the message names the scenario.
        """
        if self.plans is None:
            return None
        plan = self.plans.get(scenario)
        if plan is None:
            raise ValueError(f"observation.plans: no plan for scenario {scenario!r} (planned: "
                             f"{', '.join(sorted(self.plans))}); this plan-based checkpoint needs one: add the "
                             f"scenario's per-source mix to observation.plans and train again (testbed evaluate "
                             f"--headroom writes it to oracle.json's mixes), or set aset.plan to a planned scenario "
                             f"of the same sources, or use the general agent (policy: aset with no checkpoint: "
                             f"models/aset/general), which needs no plan")
        return _fits(plan, f"observation.plans.{scenario}", len(sources), f" ({', '.join(sources)})")


#: The agent keys only the double DQN reads (:mod:`testbed.aset.dqn`); ``training.method:
#: rollout`` refuses them set away from their defaults.
DQN_ONLY_AGENT_KEYS = ("gamma", "batch_size", "replay_size", "train_start", "train_every", "target_update_steps",
                       "epsilon_start", "epsilon_end", "epsilon_decay_steps")


class AgentSpec(StrictModel):
    """Double DQN hyper-parameters (van Hasselt et al. 2016; Mnih et al. 2015 for the rest).

    ``hidden``: MLP layer widths (``docs/system-model.md``: [64, 64], ReLU). ``gamma``: discount per window.
    Epsilon decays linearly from ``epsilon_start`` to ``epsilon_end`` over ``epsilon_decay_steps``
    agent decisions. Training starts after ``train_start`` transitions and runs one gradient step
    of ``batch_size`` every ``train_every`` decisions; the target network is copied every
    ``target_update_steps`` gradient steps. ``huber_delta``: the Huber loss threshold.

    ``plan_margin`` (docs/history.md, "ASET rounds"; needs ``observation.plans``): the greedy decision
    is ``argmax_a Q(s, a) + plan_margin * [a is the source's planned policy]``, in acting, in the
    double-DQN target's argmax and in the exported policy alike: the agent leaves its plan only
    where it estimates another policy better by more than the margin (a reward unit: success
    ratio, minus the baseline run's). 0 = the plain greedy rule.
    """

    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    learning_rate: Num = Field(1e-3, gt=0)
    gamma: Num = Field(0.9, ge=0, lt=1)
    batch_size: int = Field(64, ge=1)
    replay_size: int = Field(50_000, ge=1)
    train_start: int = Field(500, ge=1)
    train_every: int = Field(1, ge=1)
    target_update_steps: int = Field(250, ge=1)
    epsilon_start: Num = Field(1.0, ge=0, le=1)
    epsilon_end: Num = Field(0.05, ge=0, le=1)
    epsilon_decay_steps: int = Field(5_000, ge=1)
    huber_delta: Num = Field(1.0, gt=0)
    plan_margin: Num = Field(0.0, ge=0)


class RewardSpec(StrictModel):
    """The reward of one (source, window) decision (docs/aset.md, "The plan-based agents").

    ``baseline``: None, or a static policy name: the reward is then the window's success ratio
    minus the success ratio the same source had in the same window of a run where every source
    applies ``baseline`` all the time, on the same seed (common random numbers: the same
    arrivals). The baseline run does not depend on the agent's actions, so subtracting it leaves
    the optimal policy unchanged; it removes the part of the window's outcome due to the arrivals
    (a burst fails under every policy), which otherwise dominates the reward's variance.

    ``team_weight`` (0..1, default 0): the share of the reward that is the TEAM's figure, i.e.
    the same difference over the queries of every source created in that window (each
    window's successes over its queries), the rest being the source's own figure:
    ``r = (1 - team_weight) * own + team_weight * team``. Why (docs/history.md, "ASET rounds"): the
    sources share the clusters, so one source's choice changes the others' outcomes (two sources
    leaving the edges to the cloud lift the other two); a reward of its own queries only cannot
    see that gain. The evaluation's figure is the success ratio over all queries, which is the
    team figure weighted by each window's queries.

    ``baseline_mix`` (fifth round): per scenario (its experiment ``name``), a per-source
    assignment (one policy per source, sources sorted by name: the order of ``oracle.json``'s
    ``mixes``, written by ``testbed evaluate --headroom``). The baseline run of an episode of that
    scenario then applies the assignment instead of ``baseline``. Why (docs/history.md, "ASET rounds"):
    the gap left is between ASET and the mix; a baseline run that is the mix's own run is the
    closest to the agent's, so the difference keeps less of the arrivals' noise where the decision
    matters. Scenarios not listed use ``baseline``; :func:`testbed.aset.scenarios.check_reward_baselines`
    refuses, before training, a training scenario that has neither, or a key naming none; an
    empty ``baseline_mix: {}`` (it would change nothing) is refused here.
    """

    baseline: PolicyName | None = None
    baseline_mix: dict[str, list[PolicyName]] | None = None
    team_weight: Num = Field(0.0, ge=0, le=1)

    def baseline_for(self, scenario: str, n_sources: int) -> list[str] | None:
        """The baseline run's per-source policies for an episode of ``scenario`` with
        ``n_sources`` sources (sorted), or None (no baseline run).

        Raises:
            ValueError: the scenario's mix has another number of sources, naming both.
        """
        mix = (self.baseline_mix or {}).get(scenario)
        if mix is None:
            return None if self.baseline is None else [self.baseline] * n_sources
        return _fits(mix, f"reward.baseline_mix.{scenario}", n_sources)

    @field_validator("baseline_mix")
    @classmethod
    def _some_mix(cls, v: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        return _nonempty(v, "training scenario's mix", ", so it would change nothing")


class RandomiseSpec(StrictModel):
    """Per training episode: a scenario drawn uniformly from ``scenarios`` and its arrival rates
    (every ``rate_qps`` in its workload) scaled by a factor drawn uniformly from ``load_scale``.
    The scenario files carry the bursts (MMPP), hotspot moves, link delay changes and failures."""

    load_scale: tuple[Num, Num] = (0.6, 1.4)

    @model_validator(mode="after")
    def _order(self) -> RandomiseSpec:
        lo, hi = self.load_scale
        if not 0 < lo <= hi:
            raise ValueError(f"load_scale: need 0 < low <= high, got {list(self.load_scale)}")
        return self


class RolloutSpec(StrictModel):
    """``training.method: rollout`` (:mod:`testbed.aset.rollout`): the Q-network regressed on
    counterfactual rollout targets instead of trained by double DQN.

    Per training seed, ``episodes_per_scenario`` episodes of every scenario of
    ``training.scenarios`` (load randomised by ``training.randomise``, simulator seeds drawn from
    the training seed) run the base schedule (each source on its planned policy,
    ``observation.plans``); at every window and for every source and action, a clone of the
    simulator runs that window with the source on the action (the others on the base) and
    ``horizon_windows`` - 1 more windows of the base. The target of (observation, action) is the
    team's success-ratio gain over the base on the queries created in those windows.
    ``behaviour_epsilon``: the share of (window, source) decisions where the episode itself leaves
    the plan for an action drawn uniformly (the targets still measure one deviation followed by the
    plan): without it, every observation's current-policy one-hot is the plan (window 0 excepted),
    and the first-layer weights of the others keep their random initial values, which then decide
    after every deviation the network makes.

    ``epochs`` passes over the data in minibatches of ``batch_size`` (Huber loss of
    ``agent.huber_delta``, Adam at ``agent.learning_rate``, network ``agent.hidden``); whole
    episodes, a ``validation_fraction`` of each scenario's (at least one, hence
    ``episodes_per_scenario`` >= 2), are held out and the weights of the epoch with the lowest
    validation loss are exported. ``workers``: data episodes simulated at once
    (:mod:`testbed.core.distributed`; ``testbed train --jobs`` overrides). ``cache_dir``: where each
    episode's data set is kept (npz, keyed by everything it depends on; default
    ``<training.out_dir>/rollout-cache``), so a rerun does not simulate it again.
    """

    horizon_windows: int = Field(2, ge=1, le=80)
    behaviour_epsilon: Num = Field(0.0, ge=0, lt=1)
    episodes_per_scenario: int = Field(8, ge=2, le=10_000)
    epochs: int = Field(40, ge=1, le=10_000)
    batch_size: int = Field(128, ge=1, le=1_000_000)
    validation_fraction: Num = Field(0.15, gt=0, lt=1)
    workers: int = Field(2, ge=1, le=64)
    cache_dir: str | None = None


class TrainingSpec(StrictModel):
    """``testbed train``: ``steps`` environment steps (windows; each gives one decision per
    dispatcher), episodes of ``episode_s`` simulated seconds, a checkpoint every
    ``checkpoint_every`` steps, output in ``out_dir`` (relative to the config file's folder's
    parent, i.e. the repository). ``seeds``: one training run per seed (learning curves of each;
    the exported policy is the one of ``export_seed``, default the first); at least one, each in
    0 .. :data:`testbed.spec.experiment.MAX_SEED` like ``seed`` (left out: ``[seed]``). ``rollout_workers``:
    0 = episodes simulated in the learner's process; N >= 1 = N episodes at a time in parallel
    workers (:mod:`testbed.core.distributed`) with the current greedy weights and epsilon, their
    transitions then replayed by the learner.

    ``method``: ``dqn`` (default: the double DQN of :mod:`testbed.aset.dqn`) or ``rollout``
    (regression on counterfactual rollout targets, :class:`RolloutSpec` in ``rollout``; needs
    ``observation.plans``, the rollout's base). ``steps``, ``checkpoint_every`` and
    ``rollout_workers`` are the DQN's, ``rollout`` the rollout's: a key of the
    other method set to anything but its default is refused, naming it (it would be ignored)."""

    method: Literal["dqn", "rollout"] = "dqn"
    rollout: RolloutSpec = RolloutSpec()
    scenarios: list[str] = Field(min_length=1)
    seeds: list[Seed] | None = Field(None, min_length=1)
    export_seed: Seed | None = None
    rollout_workers: int = Field(0, ge=0, le=64)
    steps: int = Field(20_000, ge=1)
    episode_s: Num = Field(30.0, gt=0)
    checkpoint_every: int = Field(5_000, ge=1)
    out_dir: str = "runs/aset-train"
    export_to: str | None = None
    randomise: RandomiseSpec = RandomiseSpec()

    unit_keys = (("episode", parse_duration_s, "s"),)

    @model_validator(mode="after")
    def _one_method(self) -> TrainingSpec:
        other = (("steps", "checkpoint_every", "rollout_workers") if self.method == "rollout"
                 else ("rollout",))
        given = _set_away_from_default(self, other)
        if given:
            raise ValueError(f"{', '.join(given)}: not used by training.method {self.method} (would be ignored); "
                             "remove it, or set the method it belongs to")
        return self


class GeneralTrainingSpec(StrictModel):
    """The general agent's training (:mod:`testbed.aset.general`; docs/aset.md, "The general
    agent"). Per training seed (``seeds``; the export is ``export_seed``'s, default the first),
    ``episodes`` data episodes, each a scenario of the generator's ``train`` split (a generator seed
    drawn from ``scenario_seeds``, inclusive) on a simulator seed drawn from the training seed,
    ``episode_s`` long. In each, a base static policy is drawn and every ``probe_every``-th window one
    source is probed: every policy for that window, then ``horizon_windows`` - 1 windows of the
    base (:func:`testbed.aset.general.episode_data`); the episode leaves the base for a random policy
    with probability ``behaviour_epsilon`` per (window, source). The scorer (``hidden`` widths, ReLU)
    is fitted ``epochs`` passes of ``batch_size`` (Adam at ``learning_rate``, Huber ``huber_delta``),
    whole episodes (``validation_fraction``) held out; the epoch of the lowest validation loss is
    exported. ``workers``: data episodes simulated at once (``testbed train --jobs`` overrides).
    ``ensemble`` B >= 2: the export is instead a gated checkpoint (:mod:`testbed.agent.gate`) of B
    scorers, each fitted on a bootstrap resample of every seed's training episodes, that leaves its
    default policy only where the ensemble's lower bound of the gain beats its margin; 0: one scorer."""

    seeds: list[Seed] = Field(default_factory=lambda: [1, 2, 3], min_length=1)
    export_seed: Seed | None = None
    scenario_seeds: tuple[int, int] = (1, 500)
    episodes: int = Field(60, ge=2, le=100_000)
    episode_s: Num = Field(20.0, gt=0, le=600)
    horizon_windows: int = Field(2, ge=1, le=80)
    probe_every: int = Field(2, ge=1, le=1000)
    behaviour_epsilon: Num = Field(0.15, ge=0, lt=1)
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    learning_rate: Num = Field(1e-3, gt=0)
    huber_delta: Num = Field(1.0, gt=0)
    epochs: int = Field(60, ge=1, le=10_000)
    batch_size: int = Field(128, ge=1)
    validation_fraction: Num = Field(0.2, gt=0, lt=1)
    workers: int = Field(2, ge=1, le=64)
    ensemble: int = Field(0, ge=0, le=64)
    out_dir: str = "runs/aset-train"
    export_to: str = "models/aset/general"

    unit_keys = (("episode", parse_duration_s, "s"),)

    @model_validator(mode="after")
    def _check(self) -> GeneralTrainingSpec:
        lo, hi = self.scenario_seeds
        if not 0 <= lo <= hi:
            raise ValueError(f"scenario_seeds: need 0 <= first <= last, got {list(self.scenario_seeds)}")
        if self.export_seed is not None and self.export_seed not in self.seeds:
            raise ValueError(f"export_seed: {self.export_seed} is not among the seeds {self.seeds}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed is given twice")
        if self.ensemble == 1:
            raise ValueError("ensemble: 0 (one scorer) or at least 2 members (the gate's lower bound needs a spread)")
        return self


#: Longest simulated episode of an evaluation (s): ``evaluation.duration`` and ``testbed evaluate
#: --duration`` (the simulator holds every query of an episode in memory).
MAX_EPISODE_S = 3600.0

#: Most sampled futures per decision of the causal planner (our bound: 8 take about 5 min per
#: scenario and seed on one core, and the cost grows linearly).
MAX_CAUSAL_SAMPLES = 64


#: The evaluation protocol's defaults (docs/aset.md, "Evaluation"): tuning seeds (everything chosen
#: is chosen on them), evaluation seeds (everything reported is scored on them; disjoint), the
#: fewest evaluation seeds of a full-strength claim, and the fewest seeds of the costly references.
DEFAULT_TUNING_SEEDS = tuple(range(1, 6))
DEFAULT_EVALUATION_SEEDS = tuple(range(101, 121))
MIN_EVALUATION_SEEDS = 20
MIN_REFERENCE_SEEDS = 5


def parse_seeds(value: Any, *, count_from: int = 1) -> list[int]:
    """Seeds written as a list (``[1, 2]``), ranges and lists in a string (``"101-120"``,
    ``"1,4,9"``), or a count (``20``: ``count_from`` .. ``count_from + 19``).

    Raises:
        ValueError: not one of those forms, an empty or negative set, or a seed given twice.
    """
    if isinstance(value, bool):
        raise ValueError(f"seeds {value!r}: give a list, a range such as 101-120, or a count")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"seeds {value}: a count must be >= 1")
        out = list(range(count_from, count_from + value))
    elif isinstance(value, str):
        out = []
        try:
            for part in value.replace(" ", "").split(","):
                lo, _, hi = part.partition("-")
                out += list(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"seeds {value!r}: expected e.g. 101-120, 1,4,9 or a count") from None
        if value.strip().isdigit():  # a bare number is a count
            return parse_seeds(int(value), count_from=count_from)
    elif isinstance(value, list | tuple):
        out = [int(v) for v in value]
    else:
        raise ValueError(f"seeds {value!r}: give a list, a range such as 101-120, or a count")
    if not out or min(out) < 0 or max(out) > MAX_SEED:
        raise ValueError(f"seeds {value!r}: need at least one seed in [0, {MAX_SEED}]")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds {value!r}: a seed is given twice")
    return out


class EvaluationSpec(StrictModel):
    """``testbed evaluate``'s protocol for an ASET config (the same as on experiment files;
    docs/aset.md, "Evaluation"): on ``scenarios``, everything that is chosen (the best static
    policy, the per-source mix, the fresh-state reference) is chosen on ``tuning_seeds``, and
    everything reported (every static policy, the mix, the references, ASET = ``checkpoint``) is
    scored on ``seeds``, disjoint from them (common random numbers, paired per seed; at least
    :data:`MIN_EVALUATION_SEEDS` for a full-strength claim). ``mix``: search the per-source mix.
    ``reference_seeds`` N: the clairvoyant oracle and, with ``causal_samples`` K > 0, the causal
    planner on the first N evaluation seeds (0: neither; else at least :data:`MIN_REFERENCE_SEEDS`);
    ``oracle_horizon``: their windows of look-ahead; ``causal_min_t``: the planner's paired t to
    leave the mix. ``duration_s``: simulated seconds per run (default each experiment's)."""

    scenarios: list[str] = Field(min_length=1)
    tuning_seeds: list[int] = list(DEFAULT_TUNING_SEEDS)
    seeds: list[int] = list(DEFAULT_EVALUATION_SEEDS)
    mix: bool = True
    fresh: bool = True
    reference_seeds: int = Field(0, ge=0)
    oracle_horizon: int | None = Field(2, ge=1)
    causal_samples: int = Field(0, ge=0, le=MAX_CAUSAL_SAMPLES)
    causal_min_t: float = Field(1.64, ge=0)
    duration_s: Num | None = Field(None, gt=0, le=MAX_EPISODE_S)
    checkpoint: str = "models/aset/general"
    out_dir: str = "runs/aset-eval"

    unit_keys = (("duration", parse_duration_s, "s"),)

    @field_validator("tuning_seeds", mode="before")
    @classmethod
    def _tuning(cls, v: Any) -> list[int]:
        return parse_seeds(v, count_from=DEFAULT_TUNING_SEEDS[0])

    @field_validator("seeds", mode="before")
    @classmethod
    def _evaluation(cls, v: Any) -> list[int]:
        return parse_seeds(v, count_from=DEFAULT_EVALUATION_SEEDS[0])

    @field_validator("reference_seeds")
    @classmethod
    def _references(cls, v: int) -> int:
        if 0 < v < MIN_REFERENCE_SEEDS:
            raise ValueError(f"{v}: the oracle and the causal planner run on at least {MIN_REFERENCE_SEEDS} seeds "
                             f"(their CIs), or 0 (off)")
        return v


class AsetConfig(StrictModel):
    """One ``experiments/aset-*.yaml`` file. ``actions``: the policy names ASET chooses from, in
    action-index order (default: every registered policy, :data:`testbed.model.policies.CATALOGUE`).
    A policy is a name here; the names (``actions``, the reward's baselines, the observation's
    plans) are checked against the policy registry where the config is loaded for use
    (:func:`testbed.plan.policy_resolution.load_aset`), and the action set is
    :func:`testbed.plan.policy_resolution.aset_actions`."""

    @model_validator(mode="after")
    def _consistent(self) -> AsetConfig:
        if self.general is not None and (self.training is not None or self.observation.plans is not None):
            raise ValueError("general: the general agent's training; it goes without training: (the plan-based "
                             "agents') and without observation.plans (its observation has no plan)")
        if self.training is not None and self.training.method == "rollout" and self.observation.plans is None:
            raise ValueError("training.method: rollout needs observation.plans: each source's planned policy is the "
                             "base schedule the rollout targets are measured against")
        if self.training is not None and self.training.method == "rollout":
            dqn_only = _set_away_from_default(self.agent, DQN_ONLY_AGENT_KEYS)
            if dqn_only:
                raise ValueError(f"agent.{', agent.'.join(dqn_only)}: not used by training.method rollout (would be "
                                 f"ignored: the rollout fit uses agent.hidden, learning_rate, huber_delta and "
                                 f"plan_margin, and training.rollout's batch_size); remove it, or use method dqn")
        if self.agent.plan_margin and self.observation.plans is None:
            raise ValueError(f"agent.plan_margin {self.agent.plan_margin:g}: the margin favours each source's planned "
                             f"policy, but observation.plans is not set (no plan to favour)")
        if self.actions is not None and len(set(self.actions)) != len(self.actions):
            raise ValueError("actions: a policy is listed twice")
        if self.actions is not None and len(self.actions) < 2:
            raise ValueError(f"actions: {counted(len(self.actions), 'policy', 'policies')}: ASET "
                             f"needs at least 2 to choose from (leave actions out for the whole catalogue)")
        training_problem = self.training_problem()
        if training_problem:
            raise ValueError(training_problem)
        return self

    def training_problem(self) -> str | None:
        """What makes the training section unrunnable, named (None: nothing): a seed given twice
        (two runs would write one folder), ``export_seed`` not among the seeds (``training.seeds``,
        default ``[seed]``), an episode shorter than one decision window. Checked on load and again
        after the command line's overrides (``testbed train --seeds``)."""
        tr = self.training
        if tr is None:
            return None
        seeds = tr.seeds or [self.seed]
        twice = repeated(seeds)
        if twice:
            return f"training.seeds: seed {twice[0]} given twice (each seed is one training run and folder)"
        if tr.export_seed is not None and tr.export_seed not in seeds:
            return f"training.export_seed: {tr.export_seed} is not among the training seeds {seeds}"
        if tr.episode_s * 1e3 < self.observation.window_ms:
            return (f"training.episode: {tr.episode_s:g} s is shorter than one decision window "
                    f"(observation.window, {self.observation.window_ms:g} ms)")
        return None

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seed: Seed = 1
    actions: list[PolicyName] | None = None
    observation: ObservationSpec = ObservationSpec()
    agent: AgentSpec = AgentSpec()
    reward: RewardSpec = RewardSpec()
    training: TrainingSpec | None = None
    general: GeneralTrainingSpec | None = None
    evaluation: EvaluationSpec | None = None


def load_aset_config(path: str | Path) -> tuple[AsetConfig, Path]:
    """Read and validate an ASET config; returns it and the base folder for its relative paths
    (the repository root: the parent of the config file's folder).

    Raises:
        ConfigError: missing file, bad YAML (a duplicate key, an integer too long to read), or a
            validation error naming the item
            (e.g. ``agent.gamma: Input should be less than 1``).
    """
    path = Path(path)
    cfg = load_yaml_model(path, AsetConfig, "ASET config")
    return cfg, path.resolve().parent.parent
