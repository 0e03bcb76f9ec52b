"""The scenarios ASET trains on: the plan sampler over scenario files (load scaling), the shape
every scenario of one agent shares, the checks made before anything is trained or built, and
what the plan-based trainers share (their seeds, output folders and export).

The Gymnasium environment (:mod:`testbed.aset.envs`) and the trainers (:mod:`testbed.aset.dqn`,
:mod:`testbed.aset.rollout`) read these; this module imports none of them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from testbed.agent.checkpoint import checkpoint_files
from testbed.agent.npolicy import export_policy
from testbed.aset.episode import episode_windows, window_of
from testbed.core.errors import InputError, naming_file
from testbed.core.util import repo_path, scenarios_problem
from testbed.plan.build import Plan, PlanError, build_plan, check_load_bounds, runs_dir_problem
from testbed.spec.aset import AsetConfig, ObservationSpec, RandomiseSpec, RewardSpec, check_scenario_keys, plan_key
from testbed.spec.experiment import ConfigError, Experiment, format_validation_error, load_experiment
from testbed.spec.topology import load_topology

#: A function drawing the plan of the next episode (randomised scenario) from the env's rng.
PlanSampler = Callable[[np.random.Generator], Plan]

#: What :func:`space_shape` lists, in its order.
SHAPE_PARTS = ("sources", "applications", "clusters")

def space_shape(plan: Plan) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The names that fix the env's observation and action spaces (the rows, the features of each
    row, the one-hots): the plan's sources, applications and clusters, each sorted (the order of
    :func:`plan_contexts`). Every plan of one env has the same (:data:`SHAPE_PARTS`)."""
    return (tuple(sorted(h.name for h in plan.sources)), tuple(sorted(a.name for a in plan.experiment.applications)),
            tuple(sorted(c.name for c in plan.clusters)))


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
    unscaled plans. Every file is loaded, planned and checked against the others here
    (:func:`check_training_scenarios`), so a bad one fails before training.

    Raises:
        ConfigError, PlanError, TopologyError: a scenario file is invalid, or the files do not fit
            together (each named in the message).
    """
    loaded, plans = [], []
    for p in paths:
        exp = load_experiment(p)
        try:
            raw = load_topology(exp.topology.source, p.parent)
            plans.append(build_plan(exp, raw=raw, base_dir=p.parent))
        except InputError as exc:
            raise naming_file(exc, p) from None
        loaded.append((exp, raw, p.parent))
    check_training_scenarios(paths, plans)
    lo, hi = randomise.load_scale

    def sample(rng: np.random.Generator) -> Plan:
        k = int(rng.integers(len(loaded)))
        factor = float(rng.uniform(lo, hi)) if hi > lo else lo
        if factor == 1.0:
            return plans[k]
        exp, raw, base = loaded[k]
        return build_plan(scaled_experiment(exp, factor), raw=raw, base_dir=base)

    return sample, plans


def check_training_scenarios(paths: list[Path], plans: list[Plan]) -> None:
    """Refuse scenario files one agent cannot train on together, before anything is built.

    Each needs its own experiment ``name`` (``reward.baseline_mix``, the episode log and
    the trainers' outputs are keyed by it: two files of one name would share them), and the
    same sources, applications and clusters (names, :func:`testbed.aset.envs.space_shape`) as the
    first: they fix the observation and action spaces of the one network.

    Args:
        paths: the scenario files. plans: their plans, in the same order.

    Raises:
        ConfigError: names both files of one name (or the file listed twice), or each file of
            another shape with what differs from the first file.
    """
    problem = scenarios_problem("training.scenarios", paths, [p.experiment.name for p in plans],
                                "the reward's baseline_mix and the episode log")
    if problem:
        raise ConfigError(problem)
    ref = space_shape(plans[0])
    bad = []
    for path, plan in zip(paths[1:], plans[1:], strict=True):
        diffs = [f"{part} {', '.join(b) or '-'} (the first: {', '.join(a) or '-'})"
                 for part, a, b in zip(SHAPE_PARTS, ref, space_shape(plan), strict=True) if a != b]
        if diffs:
            bad.append(f"{path} has {'; '.join(diffs)}")
    if bad:
        raise ConfigError(f"training.scenarios: every scenario must have the sources, applications and clusters "
                          f"(by name) of the first, {paths[0]}: they fix the agent's observation and action "
                          f"spaces; " + "; ".join(bad))


def check_reward_baselines(reward: RewardSpec, plans: list[Plan], paths: list[Path] | None = None) -> None:
    """Refuse, before training, a ``reward.baseline_mix`` that does not fit the training scenarios.

    Args:
        reward: the reward settings. plans: the training scenarios' (unscaled) plans.
        paths: their files (same order), named in the messages.

    Raises:
        ConfigError: a ``baseline_mix`` key that names no training scenario, a mix with another
            number of policies than the scenario has sources, or (with ``baseline_mix`` and no
            ``baseline``) a training scenario without a mix; each named, with its file.
    """
    if not reward.baseline_mix:  # None; an empty {} is refused by RewardSpec
        return
    files = [f" ({p})" if p is not None else "" for p in (paths or [None] * len(plans))]
    known = {plan_key(p.experiment): f"{plan_key(p.experiment)}{f}" for p, f in zip(plans, files, strict=True)}
    check_scenario_keys("reward.baseline_mix", reward.baseline_mix, known)
    for plan, file in zip(plans, files, strict=True):
        name = plan_key(plan.experiment)
        if name not in reward.baseline_mix and reward.baseline is None:
            raise ConfigError(f"reward.baseline_mix: no mix for training scenario {name!r}{file}, and no "
                              f"reward.baseline to fall back on")
        try:
            reward.baseline_for(name, len(plan.sources))
        except ValueError as exc:
            srcs = ", ".join(sorted(h.name for h in plan.sources))
            raise ConfigError(f"{exc} of training scenario {name!r}{file}: {srcs}") from None


def training_scenarios(cfg: AsetConfig, base: Path) -> tuple[PlanSampler, list[Plan]]:
    """The training scenarios of ``cfg`` (``training.scenarios`` relative to ``base``) planned and
    checked, together and against ``reward`` (:func:`scenario_sampler`,
    :func:`check_reward_baselines`): what :func:`train_seeds` does before it writes anything.

    Raises:
        ConfigError, PlanError, TopologyError: named (the scenario file, the item).
    """
    paths = [resolve(base, s) for s in cfg.training.scenarios]
    sampler, plans = scenario_sampler(paths, cfg.training.randomise)
    check_reward_baselines(cfg.reward, plans, paths)
    check_plans(cfg.observation, plans, paths)
    check_episode_loads(cfg, plans, paths)
    return sampler, plans


def check_episode_loads(cfg: AsetConfig, plans: list[Plan], paths: list[Path]) -> None:
    """Refuse, before training, a scenario the training episodes cannot run: ``observation.window``
    not a whole multiple of its report interval (:func:`window_of`), or a load out of the bounds of
    :func:`testbed.plan.build.check_load_bounds` (e.g. fewer than 1 query expected) at the lowest or the
    highest factor of ``training.randomise.load_scale``, over the EFFECTIVE episode (``training.episode``
    in whole windows) and over the scenario's own duration (each episode's scaled plan is built at it).

    Raises:
        ConfigError: naming the scenario file, the item (``observation.window``, the load scale, the
            episode) and the bound.
    """
    tr = cfg.training
    for plan, path in zip(plans, paths, strict=True):
        try:
            window = window_of(plan, cfg.observation.window_ms / 1e3)
        except ValueError as exc:
            raise ConfigError(f"observation.window: {exc} (training scenario {path})") from None
        episode = episode_windows(window, tr.episode_s) * window
        for factor in sorted(set(tr.randomise.load_scale)):
            try:
                exp = scaled_experiment(plan.experiment, float(factor))
            except ValidationError as exc:
                raise ConfigError(format_validation_error(exc, f"{path} at load scale {factor:g} "
                                                               f"(training.randomise.load_scale)")) from None
            for what, duration in ((f"a training episode (training.episode {tr.episode_s:g} s in whole "
                                    f"{window * 1e3:g} ms windows)", episode),
                                   ("its own duration (each episode's scaled plan is built at it)",
                                    float(plan.experiment.duration_s))):
                if factor == 1 and duration == plan.experiment.duration_s:
                    continue  # planned so already
                try:
                    check_load_bounds(exp, plan.weights, duration, Path(plan.base_dir))
                except PlanError as exc:
                    raise ConfigError(f"{path}: at load scale {factor:g} (training.randomise.load_scale) over "
                                      f"{what}, {duration:g} s: {exc}") from None


def check_plans(obs: ObservationSpec, plans: list, paths: list[Path]) -> None:
    """Refuse, before training, ``observation.plans`` without a plan of the right size for every
    training scenario (it would fail when the episode that draws it starts).

    Raises:
        ConfigError: naming the scenario and its file.
    """
    for plan, path in zip(plans, paths, strict=True):
        try:
            obs.planned(plan_key(plan.experiment), sorted(h.name for h in plan.sources))
        except ValueError as exc:
            raise ConfigError(f"{exc} (training scenario {path})") from None


# ----------------------------------------------------------------------------- what every trainer shares
def training_seeds(cfg: AsetConfig) -> list[int]:
    """The seeds of ``cfg``'s training runs: ``training.seeds``, or ``[seed]`` when left out.

    Raises:
        ConfigError: ``training.seeds`` is an empty list (it would train nothing; a config built
            with ``model_copy``, which skips validation, can carry one).
    """
    seeds = cfg.training.seeds
    if seeds is not None and not seeds:
        raise ConfigError(f"training.seeds: an empty list trains nothing; list at least one seed, or leave it out "
                          f"for the config's seed ({cfg.seed})")
    return list(seeds) if seeds is not None else [cfg.seed]


def _file_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path``, or None (its folder: :func:`runs_dir_problem`)."""
    if path.is_dir():
        return f"{path} is a folder"
    return runs_dir_problem(path.parent)


def export_problem(export_to: str, base: Path) -> str | None:
    """Why a policy cannot be exported to ``export_to`` (its ``.npz`` and ``.json``), or None: a
    name that looks like a folder (a trailing ``/``, ``.``, ``..``, an existing folder: the files
    would be written beside it as ``<folder>.npz``), or a path that cannot be written."""

    if export_to.endswith(("/", os.sep)) or Path(export_to).name in ("", ".", ".."):
        return (f"{export_to!r} names a folder; give the policy's file name without suffix (e.g. models/aset/aset, "
                f"written as aset.npz and aset.json)")
    dst = resolve(base, export_to)
    if dst.is_dir():
        return (f"{dst} is a folder; give the policy's file name without suffix (e.g. {export_to.rstrip('/')}/aset, "
                f"written as .npz and .json)")
    return next((problem for f in checkpoint_files(dst) if (problem := _file_problem(f))), None)


def check_outputs(cfg: AsetConfig, base: Path, seeds: list[int], folders: tuple[tuple[str, Path], ...] = (),
                  exports: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, output paths training could not write (folders tried for real and
    left as they were, :func:`testbed.plan.build.runs_dir_problem`): ``training.out_dir/<name>``, each
    seed's folder (``seed-<k>``) and ``curves.png`` there, ``training.export_to``, and the caller's
    ``folders`` ((item, folder): e.g. the rollout cache) and ``exports``.

    Raises:
        InputError: naming the item (``training.out_dir``, ``training.export_to``) and the path.
    """
    tr = cfg.training
    root = resolve(base, tr.out_dir) / cfg.name
    out = f"training.out_dir {tr.out_dir}"
    checks = [(out, runs_dir_problem(p)) for p in (root, *(root / f"seed-{s}" for s in seeds))]
    checks += [(out, _file_problem(root / "curves.png"))]
    checks += [(item, runs_dir_problem(p)) for item, p in folders]
    checks += [(f"training.export_to {e}", export_problem(e, base))
               for e in ([tr.export_to] if tr.export_to else []) + list(exports)]
    for item, problem in checks:
        if problem:
            raise InputError(f"{item}: {problem}; choose another path (checked before training, which would "
                             f"fail to write there after its work)")


#: What a training run writes in its folder (``seed-<k>``), either method:
#: removed when a run starts there (:func:`clear_run_dir`).
RUN_OUTPUTS = ("checkpoints", "tb", "episodes.csv", "curve.png", "policy.npz", "policy.json", "data.npz",
               "epochs.csv", "rollout.json")


def clear_run_dir(out: Path) -> None:
    """Remove what an earlier training run wrote in ``out`` (:data:`RUN_OUTPUTS`; nothing else), so
    the new run starts from an empty folder: its ``checkpoints/`` hold its own steps only
    and ``tb/`` its own events."""
    for name in RUN_OUTPUTS:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


@dataclass
class TrainResult:
    """What a training run produced: output folder, exported policy path (no suffix), per-episode
    log rows (step, scenario, success_ratio, mean_reward, epsilon), wall time in s, ``updates``:
    the gradient steps the network took (0: nothing was exported, :func:`train`)."""

    out_dir: Path
    policy_path: Path
    seed: int = 0
    episodes: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    steps: int = 0
    agent: object = None
    updates: int = 0


def tf_one_thread() -> None:
    """TensorFlow on 1 intra-op and 1 inter-op thread: the 2 cores are shared (docs/aset.md). Only
    possible before TensorFlow's first op; later calls change nothing."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass


def export_weights(cfg: AsetConfig, env, weights: list[np.ndarray], path: Path, seed: int,
                   meta: dict) -> None:
    """Export a Q-network's weights trained on ``env``'s spaces as the deployable greedy policy
    (:func:`testbed.agent.npolicy.export_policy`, the decision rule of ``cfg.agent.plan_margin``);
    ``meta`` is stored with the config's name, the seed and the training scenarios."""

    ctx = env.contexts[0]
    meta = {"config": cfg.name, "seed": seed, "trained_on": list(cfg.training.scenarios), **meta}
    export_policy(weights, path, obs_spec=cfg.observation, applications=list(ctx.applications),
                  clusters=list(ctx.clusters), policies=list(env.policies), sources=list(ctx.sources),
                  provenance=meta, deadlines_ms=list(ctx.deadline_ms), plan_margin=cfg.agent.plan_margin)


def resolve(base: Path, p: str) -> Path:
    """``p`` relative to ``base`` unless absolute."""
    return repo_path(p, base)


__all__ = [
    "RUN_OUTPUTS", "SHAPE_PARTS", "PlanSampler", "TrainResult", "check_episode_loads", "check_outputs", "check_plans",
    "check_reward_baselines", "check_training_scenarios", "clear_run_dir", "export_problem", "export_weights",
    "resolve", "scale_rates", "scaled_experiment", "scenario_sampler", "space_shape", "tf_one_thread",
    "training_scenarios", "training_seeds",
]
