"""ASET trained on counterfactual rollout targets (``training.method: rollout``): one step of
approximate policy iteration (Bertsekas, "Rollout, Policy Iteration, and Distributed Reinforcement
Learning", 2020) from the per-source static mix.

Why (docs/history.md, "ASET rounds"): the DQN's reward of one window (its success ratio minus a
baseline run's) is too noisy for the network to tell a good deviation from the plan from noise.
The simulator is deterministic per seed and :meth:`Episode.clone` continues exactly, so the value
of a deviation can instead be MEASURED, paired on common random numbers, for every action at once.

**Data** (:func:`episode_data`, one episode per task, in parallel through
:mod:`testbed.core.distributed`): a scenario of ``training.scenarios`` with its load randomised
(:func:`testbed.aset.scenarios.scenario_sampler`, ``training.randomise``), a simulator seed drawn from
the training seed; the base schedule is each source's planned policy (``observation.plans``, the
scenario's per-source mix). An :class:`~testbed.aset.envs.AsetSimEnv` is driven with the base
actions, so every observation is the env's own. At each window w, before it runs, and for each
source i and action a: a clone of the episode runs window w with source i on a and every other
source on its plan, then ``horizon_windows`` - 1 windows of the base, and is settled
(:func:`testbed.aset.headroom.continuation_ok`, the oracle's measure). With ok_a the TEAM's
successes among the queries created in windows [w, w + H) and ok_base the same with every source
on its plan::

    target(obs_i(w), a) = (ok_a - ok_base) / (queries created in [w, w + H) by every source)

the team's success-ratio gain of deviating for one window (0 for the planned policy; when the
episode follows the plan, ok_base is checked to be what the episode itself did). Windows where
nothing was created in [w, w + H) give no sample. With ``behaviour_epsilon`` the episode itself
leaves the plan now and then (an action drawn uniformly), so that observations after a deviation,
whose current-policy one-hot is not the plan, are in the data; the targets are the same
measure from the states so reached. Each episode's data set is kept in ``cache_dir`` as npz, keyed by
:func:`testbed.aset.jobs.task_key` (the code, the scenario file and its inputs, the
observation, the actions, the horizon, the load randomisation, the seed), so a rerun does not
simulate it again.

**Learning** (:func:`fit`): the MLP of the DQN (``agent.hidden``, ReLU; Glorot init seeded by the
training seed) regresses Q(obs, .) on all actions' targets at once (Huber loss of
``agent.huber_delta``, Adam at ``agent.learning_rate``, minibatches, ``epochs`` passes). Whole
episodes (``validation_fraction`` of each scenario's) are held out; the weights of the epoch with
the lowest validation loss are exported. Q(obs, a) then estimates the expected gain of deviating
to a over the plan given what the source observes: an average over the futures consistent with
the observation, no clairvoyance at decision time (the oracle's ``max_a`` of the same targets
has it).

**Acting** is the sixth round's rule, :func:`testbed.agent.npolicy.plan_scores`: argmax of Q plus
``agent.plan_margin`` at the planned policy. The export is the DQN's (``aset-policy-v3``), so
``testbed evaluate``, the live selector and everything else load it unchanged.

What it gives up: the targets value one deviation followed by the plan (one step of policy
iteration), so deviating in consecutive windows is valued as if the plan followed each one.
"""

from __future__ import annotations

import csv
import json
import math
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import Field

from testbed.agent.checkpoint import checkpoint_files, copy_checkpoint
from testbed.agent.npolicy import plan_scores
from testbed.aset.curves import write_loss_curves
from testbed.aset.envs import AsetSimEnv, PlanSampler
from testbed.aset.episode import settle_s
from testbed.aset.headroom import continuation_ok
from testbed.aset.jobs import code_fingerprint, inputs_fingerprint, progress_bar, task_key
from testbed.aset.scenarios import (
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
from testbed.core.errors import EXIT_NOTHING_MEASURED, RunFailure
from testbed.core.util import replace_atomic
from testbed.plan.policy_resolution import aset_actions
from testbed.spec.aset import AsetConfig, ObservationSpec, RandomiseSpec
from testbed.spec.schema import StrictModel

#: The arrays of one data set, one row per (window, source) sample (:class:`RolloutData`).
FIELDS = ("obs", "targets", "queries", "window", "source", "plan", "episode", "scenario")


# ----------------------------------------------------------------------------- data (worker side)
class RolloutTaskSpec(StrictModel):
    """Everything an episode's data set depends on besides the code, the scenario file and the
    seed: the observation spec (with the plans, the base), the actions (``policies``), the
    horizon (windows), the episode length (s), the behaviour epsilon and the load randomisation
    (factor range). It crosses to the worker as JSON (:func:`data_spec`), a task argument, hence
    part of the task's cache key."""

    observation: ObservationSpec
    policies: tuple[str, ...] = Field(min_length=1)
    horizon_windows: int = Field(ge=1)
    episode_s: float = Field(gt=0)
    behaviour_epsilon: float = Field(ge=0, lt=1)
    load_scale: tuple[float, float]


def data_spec(cfg: AsetConfig) -> str:
    """The :class:`RolloutTaskSpec` of ``cfg``'s data episodes, as JSON."""
    tr = cfg.training
    return RolloutTaskSpec(observation=cfg.observation, policies=aset_actions(cfg),
                           horizon_windows=tr.rollout.horizon_windows, episode_s=float(tr.episode_s),
                           behaviour_epsilon=float(tr.rollout.behaviour_epsilon),
                           load_scale=tuple(float(x) for x in tr.randomise.load_scale)).model_dump_json()


def episode_seed(seed: int, scenario_index: int, episode: int) -> int:
    """The env seed of data episode ``episode`` of scenario ``scenario_index`` of training seed
    ``seed`` (it draws the load factor and the simulator seed): distinct and reproducible."""
    return int(np.random.SeedSequence([int(seed), int(scenario_index), int(episode)]).generate_state(1)[0])


_SAMPLERS: dict[tuple, PlanSampler] = {}


def _sampler(scenario: str, load_scale: tuple[float, float]) -> PlanSampler:
    """The training sampler of one scenario file (:func:`scenario_sampler`), kept per process."""
    key = (scenario, load_scale)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = scenario_sampler([Path(scenario)], RandomiseSpec(load_scale=load_scale))[0]
    return _SAMPLERS[key]


def episode_data(spec_json: str, scenario: str, seed: int) -> dict[str, np.ndarray]:
    """The rollout data of one episode (module docstring) of ``scenario`` (a file), env seed
    ``seed``; :data:`FIELDS` (``episode`` all 0) plus ``sim_seed`` and ``wall_s``."""
    t0 = time.perf_counter()
    spec = RolloutTaskSpec.model_validate_json(spec_json)
    sampler = _sampler(scenario, spec.load_scale)
    env = AsetSimEnv(sampler, spec.observation, spec.episode_s, policies=spec.policies)
    obs, info = env.reset(seed=seed)
    behaviour = np.random.default_rng([seed, 1])  # not the env's generator: the env draws nothing more
    out = window_targets(env, obs, spec.horizon_windows, spec.behaviour_epsilon, behaviour)
    out["scenario"] = np.full(len(out["obs"]), info["scenario"])
    out["sim_seed"] = np.int64(info["sim_seed"])
    out["wall_s"] = np.float64(time.perf_counter() - t0)
    return out


def _trials(env: AsetSimEnv, base: list[str], horizon: int) -> np.ndarray:
    """Successes (sources x actions) of the team's queries created in [w, w + horizon), w the
    env's next window, when source i runs window w on action a and everything else is the base."""
    ep, w = env.ep, env.ep.w
    ok = np.empty((len(base), len(env.policies)), np.int64)
    on_base = continuation_ok(ep, w, horizon, base, base)  # one trial: the same for every source
    for i, planned in enumerate(base):
        for a, name in enumerate(env.policies):
            ok[i, a] = on_base if name == planned else continuation_ok(ep, w, horizon, base,
                                                                      base[:i] + [name] + base[i + 1:])
    return ok


def window_targets(env: AsetSimEnv, obs: np.ndarray, horizon: int, epsilon: float = 0.0,
                   rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Drive ``env`` (just reset; ``obs`` its first observation) to the end of the episode, each
    source on its planned policy (or, with probability ``epsilon`` per window and source, on an
    action drawn uniformly by ``rng``), measuring every (window, source, action)'s trial on the
    way (:func:`_trials`); returns the samples of :data:`FIELDS` but ``scenario``.

    Raises:
        AssertionError: a clone of the base did not continue as the base episode did (its target
            would not be 0): the simulator is not deterministic per seed. Checked at every window
            w from which the episode itself followed the plan until the queries created in
            [w, w + horizon) were all resolved (:func:`_checkable`): all windows with ``epsilon`` 0.
    """
    base = [c.plan for c in env.contexts]
    planned = np.array([env.policies.index(p) for p in base])
    rng = rng or np.random.default_rng(0)
    seen, trials, left, done = [], [], [], False
    while not done:
        seen.append(obs)
        trials.append(_trials(env, base, horizon))
        off = rng.random(len(base)) < epsilon
        actions = np.where(off, rng.integers(0, len(env.policies), len(base)), planned)
        left.append(bool((actions != planned).any()))
        obs, _, _, done, _ = env.step(actions)
    ep = env.ep  # finished: every query resolved; the queries do not depend on the schedule
    ends = [min(ep.n_windows, w + horizon) for w in range(len(trials))]
    queries = np.array([ep.n[w:e].sum() for w, e in enumerate(ends)])
    ok = np.stack(trials)  # (windows, sources, actions)
    ref = ok[:, 0, planned[0]]  # the base's trial (every source on its plan)
    checked = _checkable(np.array(left), ends, math.ceil(settle_s(env.plan) / ep.window_s))
    _check_base(env, checked, ref, [ep.ok[w:e].sum() for w, e in enumerate(ends)])
    targets = (ok - ref[:, None, None]) / np.maximum(1, queries)[:, None, None]
    n_w, n_s = ok.shape[:2]
    keep = np.repeat(queries > 0, n_s)
    return {"obs": np.stack(seen).reshape(n_w * n_s, -1)[keep],
            "targets": targets.reshape(n_w * n_s, -1).astype(np.float32)[keep],
            "queries": np.repeat(queries, n_s)[keep], "window": np.repeat(np.arange(n_w), n_s)[keep],
            "source": np.tile(np.arange(n_s), n_w)[keep], "plan": np.tile(planned, n_w)[keep],
            "episode": np.zeros(int(keep.sum()), np.int64)}


def _checkable(left: np.ndarray, ends: list[int], settle_windows: int) -> np.ndarray:
    """The windows w whose base trial must equal the episode's own count: the episode left its
    plan (``left``, one bool per window) in none of the windows [w, ends[w] + settle_windows),
    the windows whose decisions can still touch the queries created in [w, ends[w]) (batching,
    queues) until they are resolved."""
    n = len(left)
    return np.array([w for w, e in enumerate(ends) if not left[w:min(n, e + settle_windows)].any()], dtype=np.int64)


def _check_base(env: AsetSimEnv, windows: np.ndarray, trial: np.ndarray, episode: list) -> None:
    """The trial of the base scored what the episode itself did, at each of ``windows``.

    Raises:
        AssertionError: naming the scenario and the first window where not.
    """
    bad = [int(w) for w in windows if trial[w] != episode[w]]
    if bad:
        w = bad[0]
        raise AssertionError(f"{env.plan.experiment.name}: the base's clone from window {w} scored {int(trial[w])} "
                             f"successes, the base episode {int(episode[w])}")


# ----------------------------------------------------------------------------- data sets
@dataclass
class RolloutData:
    """Samples of several episodes, one row per (episode, window, source): ``obs`` (n, obs_size),
    ``targets`` (n, actions; success-ratio gain over the base), ``queries`` (the targets'
    denominator), ``window``, ``source`` and ``plan`` (the planned action) indices, ``episode``
    (index of the episode in this set) and ``scenario`` (its experiment name)."""

    obs: np.ndarray
    targets: np.ndarray
    queries: np.ndarray
    window: np.ndarray
    source: np.ndarray
    plan: np.ndarray
    episode: np.ndarray
    scenario: np.ndarray
    wall_s: float = 0.0

    @classmethod
    def join(cls, episodes: list[dict[str, np.ndarray]]) -> RolloutData:
        """One data set of the episodes' data (:func:`episode_data`), numbered in their order."""
        cols = {f: np.concatenate([ep[f] for ep in episodes]) for f in FIELDS if f != "episode"}
        cols["episode"] = np.concatenate([np.full(len(ep["obs"]), k) for k, ep in enumerate(episodes)])
        return cls(**cols, wall_s=float(sum(float(ep["wall_s"]) for ep in episodes)))

    def __len__(self) -> int:
        return len(self.obs)

    def save(self, path: Path) -> None:
        """The data set as one npz (:meth:`load` reads it back): the episode cache's keys cover the
        whole package's code, so a change anywhere in it (another engineer's commit) makes the cache
        miss; this copy keeps what a seed was trained on."""
        _save(path, {**{f: getattr(self, f) for f in FIELDS}, "wall_s": np.float64(self.wall_s)})

    @classmethod
    def load(cls, path: Path) -> RolloutData:
        """A data set written by :meth:`save`."""
        with np.load(path) as z:
            return cls(**{f: z[f] for f in FIELDS}, wall_s=float(z["wall_s"]))

    def split(self, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(train rows, validation rows): of each scenario's episodes, ``fraction`` (at least one,
        at most all but one) held out whole, drawn with ``seed``. A scenario of one episode is
        all training."""
        rng = np.random.default_rng(seed)
        held: list[int] = []
        for name in sorted(set(self.scenario.tolist())):
            eps = np.unique(self.episode[self.scenario == name])
            if len(eps) >= 2:
                k = min(len(eps) - 1, max(1, round(fraction * len(eps))))
                held += rng.choice(eps, k, replace=False).tolist()
        val = np.isin(self.episode, held)
        return np.flatnonzero(~val), np.flatnonzero(val)


def _cache_file(cache: Path, task: tuple) -> Path:

    return cache / f"{task_key(episode_data, task)}.npz"


def _save(path: Path, data: dict[str, np.ndarray]) -> None:
    """``data`` as ``path`` (npz), atomically (:func:`testbed.core.util.replace_atomic`).

    Raises:
        OSError: the folder cannot be written (no temporary file is left)."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a bare path
            np.savez(f, **data)

    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomic(path, write)


def _load(path: Path) -> dict[str, np.ndarray] | None:
    """A cached episode, or None (none, unreadable, truncated, or without a field of
    :data:`FIELDS` but ``episode``, or ``wall_s``: computed again and overwritten)."""
    try:
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
    need = {f for f in FIELDS if f != "episode"} | {"wall_s"}
    return data if need <= data.keys() else None


def data_tasks(cfg: AsetConfig, base: Path, seed: int) -> list[tuple[str, str, int]]:
    """The :func:`episode_data` tasks of one training seed: ``episodes_per_scenario`` per
    scenario of ``training.scenarios``, in scenario order."""
    spec = data_spec(cfg)
    n = cfg.training.rollout.episodes_per_scenario
    return [(spec, str(resolve(base, s).resolve()), episode_seed(seed, k, j))
            for k, s in enumerate(cfg.training.scenarios) for j in range(n)]


def rollout_cache(cfg: AsetConfig, base: Path) -> Path:
    """The episode cache folder: ``training.rollout.cache_dir``, default ``<training.out_dir>/rollout-cache``."""
    return resolve(base, cfg.training.rollout.cache_dir or str(Path(cfg.training.out_dir) / "rollout-cache"))


def collect(cfg: AsetConfig, base: Path, seeds: list[int], *, workers: int | None = None, backend: str = "process",
            ray_address: str | None = None, cache_dir: Path | None = None, console=None,
            progress: bool = True) -> dict[int, RolloutData]:
    """The data set of every training seed (:func:`data_tasks`), each episode from ``cache_dir``
    when there, else simulated (``workers`` at a time, default ``training.rollout.workers``) and
    kept there; all seeds' episodes in one pool, so both cores stay busy."""

    code_fingerprint.cache_clear()  # the code as it is now (a long session may have changed it)
    inputs_fingerprint.cache_clear()
    ro = cfg.training.rollout
    cache = cache_dir or rollout_cache(cfg, base)
    tasks = [t for s in seeds for t in data_tasks(cfg, base, s)]
    files = [_cache_file(cache, t) for t in tasks]
    got: list[dict | None] = [_load(f) if f.is_file() else None for f in files]
    missing = [i for i, g in enumerate(got) if g is None]
    bar = progress_bar(console, len(tasks), "rollout data") if progress else None
    try:
        if bar is not None:
            bar[0].advance(bar[1], len(tasks) - len(missing))
        for k, r in imap_unordered(episode_data, [tasks[i] for i in missing], backend=backend,
                                   jobs=workers or ro.workers, ray_address=ray_address):
            _save(files[missing[k]], r)
            got[missing[k]] = r
            if bar is not None:
                bar[0].advance(bar[1])
    finally:
        if bar is not None:
            bar[0].stop()
    per = len(tasks) // len(seeds)
    return {s: RolloutData.join(got[j * per:(j + 1) * per]) for j, s in enumerate(seeds)}


# ----------------------------------------------------------------------------- learning
def decide(q: np.ndarray, obs: np.ndarray, margin: float) -> np.ndarray:
    """The greedy actions of the plan rule (:func:`plan_scores`, the exported policy's)."""
    return np.argmax(plan_scores(q, obs, margin, q.shape[1]), axis=1)


def held_out(q: np.ndarray, data: RolloutData, rows: np.ndarray, margin: float) -> dict[str, float]:
    """What the plan rule does on ``rows`` with the predictions ``q`` (one per row): ``deviate``
    (share of samples where it leaves the plan), ``gain`` (mean target of its action: the team's
    success-ratio gain of deviating one window where it does, in points), ``best`` (mean of the
    largest target: the same with hindsight, in points), ``samples``."""
    t = data.targets[rows]
    chosen = decide(q, data.obs[rows], margin)
    return {"samples": int(len(rows)), "deviate": float(np.mean(chosen != data.plan[rows])),
            "gain": 100 * float(np.mean(t[np.arange(len(rows)), chosen])), "best": 100 * float(np.mean(t.max(1)))}


@dataclass
class FitResult:
    """A fitted network: ``weights`` (the best validation epoch's), ``epochs`` (one row per
    epoch: train and validation loss, validation deviate / gain), ``best_epoch`` (1-based),
    ``validation`` (:func:`held_out` of the best weights, overall and per scenario, on the
    held-out episodes, which also chose the epoch: an optimistic figure), ``wall_s``."""

    weights: list[np.ndarray]
    epochs: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    validation: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0


def fit(data: RolloutData, cfg: AsetConfig, seed: int) -> FitResult:
    """Regress the Q-network on the data's targets (module docstring); the network is
    :func:`testbed.aset.dqn.build_q_network` of ``agent.hidden`` seeded by ``seed``, which also
    draws the validation episodes and the minibatches.

    Raises:
        ValueError: nothing to hold out, or nothing left to train on (:meth:`RolloutData.split`)."""
    import tensorflow as tf  # heavy: only when fitting

    from testbed.aset.dqn import build_q_network  # imports TensorFlow

    tf_one_thread()
    t0 = time.perf_counter()
    ro, ag = cfg.training.rollout, cfg.agent
    train_rows, val_rows = data.split(ro.validation_fraction, seed)
    if not len(val_rows) or not len(train_rows):
        raise ValueError(f"rollout data of seed {seed}: no scenario has two episodes with samples, so nothing can "
                         f"be held out to choose the epoch ({len(train_rows)} training rows, {len(val_rows)} held "
                         "out); raise training.rollout.episodes_per_scenario or the episode length")
    tf.random.set_seed(seed)
    model = build_q_network(data.obs.shape[1], data.targets.shape[1], ag.hidden, seed)
    opt = tf.keras.optimizers.Adam(learning_rate=ag.learning_rate)
    huber = tf.keras.losses.Huber(delta=ag.huber_delta)

    @tf.function(reduce_retracing=True, autograph=False)  # no Python control flow to convert
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = huber(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    rng = np.random.default_rng(seed)
    x_val, y_val = data.obs[val_rows], data.targets[val_rows]
    best = FitResult(model.get_weights())
    for epoch in range(1, ro.epochs + 1):
        perm = rng.permutation(train_rows)
        total = 0.0
        for b in range(0, len(perm), ro.batch_size):
            idx = perm[b:b + ro.batch_size]
            total += float(step(data.obs[idx], data.targets[idx])) * len(idx)
        q_val = model(x_val, training=False).numpy()
        row = {"epoch": epoch, "train_loss": total / max(1, len(perm)), "val_loss": float(huber(y_val, q_val)),
               **{f"val_{k}": v for k, v in held_out(q_val, data, val_rows, ag.plan_margin).items()
                  if k != "samples"}}
        best.epochs.append(row)
        if not best.best_epoch or row["val_loss"] < best.epochs[best.best_epoch - 1]["val_loss"]:
            best.best_epoch, best.weights = epoch, [np.array(w) for w in model.get_weights()]
    model.set_weights(best.weights)
    best.validation = _validation(model(x_val, training=False).numpy(), data, val_rows, ag.plan_margin)
    best.wall_s = time.perf_counter() - t0
    return best


def _validation(q: np.ndarray, data: RolloutData, rows: np.ndarray, margin: float) -> dict[str, dict]:
    """:func:`held_out` over all validation rows (``all``) and per scenario."""
    out = {"all": held_out(q, data, rows, margin)}
    names = data.scenario[rows]
    for name in sorted(set(names.tolist())):
        sel = names == name
        out[name] = held_out(q[sel], data, rows[sel], margin)
    return out


# ----------------------------------------------------------------------------- the training run
@dataclass
class RolloutResult(TrainResult):
    """One seed of a rollout training: the :class:`TrainResult` fields (``episodes`` empty,
    ``steps`` 0), plus the data set's size, the fit (:class:`FitResult` without weights)."""

    samples: int = 0
    data_episodes: int = 0
    data_cpu_s: float = 0.0
    fit: FitResult | None = None


def train_rollout(cfg: AsetConfig, base: Path, *, workers: int | None = None, backend: str = "process",
                  ray_address: str | None = None, console=None, progress: bool = True,
                  cache_dir: Path | None = None,
                  scenarios: tuple[PlanSampler, list] | None = None) -> list[RolloutResult]:
    """``testbed train`` for ``training.method: rollout``: the data of every seed of
    ``training.seeds`` (:func:`collect`), one network per seed (:func:`fit`) exported to
    ``training.out_dir/<name>/seed-<k>/policy`` with its ``epochs.csv``, ``curve.png``,
    ``rollout.json`` and data set (``data.npz``, :meth:`RolloutData.save`); ``curves.png`` of
    every seed; the policy of ``export_seed`` (default the first seed) copied to
    ``training.export_to``. ``scenarios``: :func:`~testbed.aset.scenarios.training_scenarios` of
    ``cfg`` when the caller has them. Each seed's folder is emptied of an earlier run's outputs
    (:func:`testbed.aset.scenarios.clear_run_dir`) before its own are written.

    Raises:
        ValueError: no ``training:`` section, or not ``method: rollout``. Before anything is
            simulated: the scenarios' errors (:func:`testbed.aset.scenarios.training_scenarios`),
            ``training.seeds`` and an output path that cannot be written (the cache, ``out_dir``,
            ``export_to``: InputError, :func:`testbed.aset.scenarios.check_outputs`). RunFailure: a
            seed's data leaves nothing to fit (:func:`fit`'s ValueError; nothing copied).
    """

    tr = cfg.training
    if tr is None or tr.method != "rollout":
        raise ValueError(f"ASET config {cfg.name!r}: train_rollout needs training.method: rollout")
    sampler = (scenarios or training_scenarios(cfg, base))[0]  # every scenario and plan checked first
    seeds = training_seeds(cfg)
    cache = cache_dir or rollout_cache(cfg, base)
    item = "training.rollout.cache_dir" + (f" {tr.rollout.cache_dir}" if tr.rollout.cache_dir else " (default)")
    check_outputs(cfg, base, seeds, folders=((item, cache),))
    env = AsetSimEnv(sampler, cfg.observation, tr.episode_s, policies=aset_actions(cfg))  # the spaces, for the export
    root = resolve(base, tr.out_dir) / cfg.name
    t0 = time.perf_counter()
    sets = collect(cfg, base, seeds, workers=workers, backend=backend, ray_address=ray_address,
                   cache_dir=cache, console=console, progress=progress)
    data_wall = time.perf_counter() - t0
    results = []
    for s in seeds:
        out = root / f"seed-{s}"
        out.mkdir(parents=True, exist_ok=True)
        clear_run_dir(out)
        sets[s].save(out / "data.npz")
        try:
            fitted = fit(sets[s], cfg, s)
        except ValueError as exc:  # the data held nothing to fit (after the checks: chance)
            raise RunFailure(f"{exc}: nothing exported, no policy copied", EXIT_NOTHING_MEASURED) from None
        res = RolloutResult(out, out / "policy", s, wall_s=data_wall / len(seeds) + fitted.wall_s,
                            samples=len(sets[s]), data_episodes=int(sets[s].episode.max()) + 1,
                            data_cpu_s=sets[s].wall_s, fit=fitted)
        export_weights(cfg, env, fitted.weights, res.policy_path, s, _meta(cfg, res))
        _write_seed(out, res, cfg)
        results.append(res)
    write_loss_curves(root / "curves.png", {f"seed {r.seed}": r.fit.epochs for r in results},
                      f"ASET rollout regression ({len(results)} seeds)")
    chosen = tr.export_seed if tr.export_seed is not None else seeds[0]
    if tr.export_to:
        copy_checkpoint(next(r for r in results if r.seed == chosen).policy_path, resolve(base, tr.export_to))
    return results


def _meta(cfg: AsetConfig, res: RolloutResult) -> dict:
    """What the exported policy's JSON says of its training."""
    ro = cfg.training.rollout
    return {"method": "rollout", "horizon_windows": ro.horizon_windows,
            "episodes_per_scenario": ro.episodes_per_scenario, "samples": res.samples,
            "best_epoch": res.fit.best_epoch, "epochs": ro.epochs,
            "val_loss": res.fit.epochs[res.fit.best_epoch - 1]["val_loss"]}


def _write_seed(out: Path, res: RolloutResult, cfg: AsetConfig) -> None:
    """``epochs.csv``, ``curve.png`` and ``rollout.json`` of one seed."""
    rows = res.fit.epochs
    with open(out / "epochs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_loss_curves(out / "curve.png", {f"seed {res.seed}": rows}, "ASET rollout regression")
    summary = {"seed": res.seed, "samples": res.samples, "episodes": res.data_episodes,
               "data_cpu_s": round(res.data_cpu_s, 1), "fit_s": round(res.fit.wall_s, 1),
               "best_epoch": res.fit.best_epoch, "plan_margin": float(cfg.agent.plan_margin),
               "rollout": cfg.training.rollout.model_dump(), "validation": res.fit.validation}
    (out / "rollout.json").write_text(json.dumps(summary, indent=1))


def written_lines(cfg: AsetConfig, base: Path, results: list[RolloutResult]) -> list[str]:
    """``testbed train``'s report of a rollout training: one line per seed (the data, the fit,
    what the plan rule does on the held-out episodes) and the files written."""
    lines = []
    for r in results:
        v = r.fit.validation["all"]
        e = r.fit.epochs[r.fit.best_epoch - 1]
        lines.append(f"seed {r.seed}: {r.samples} samples of {r.data_episodes} episodes ({r.data_cpu_s:.0f} s of "
                     f"simulation), fit {r.fit.wall_s:.0f} s, best epoch {r.fit.best_epoch}/{len(r.fit.epochs)}: "
                     f"train loss {e['train_loss']:.3g}, validation loss {e['val_loss']:.3g}; on the held-out "
                     f"episodes the plan rule deviates in {100 * v['deviate']:.1f} % of the decisions, gain "
                     f"{v['gain']:+.3f} pts (with hindsight {v['best']:+.3f})")
    lines.append("written:")
    for r in results:
        lines.append(f"  {r.policy_path}.npz/.json, {r.out_dir / 'epochs.csv'}, {r.out_dir / 'curve.png'}, "
                     f"{r.out_dir / 'rollout.json'}")
    lines.append(f"  {resolve(base, cfg.training.out_dir) / cfg.name / 'curves.png'} (the loss curves)")
    if cfg.training.export_to:

        stem = str(checkpoint_files(cfg.training.export_to)[0]).removesuffix(".npz")
        lines.append(f"  {stem}.npz/.json (the policy, exported)")
    return lines


__all__ = ["FitResult", "RolloutData", "RolloutResult", "collect", "data_spec", "data_tasks", "decide",
           "episode_data", "episode_seed", "fit", "held_out", "train_rollout", "window_targets", "write_loss_curves",
           "written_lines"]
