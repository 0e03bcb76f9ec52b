"""``testbed train CONFIG``: train the ASET double DQN in the simulator over randomised scenarios.

Per episode a scenario is drawn from ``training.scenarios`` (bursts, hotspot moves, link changes,
cluster failures...) and its load scaled by a factor from ``training.randomise.load_scale``; the
simulator is seeded from the training seed, so a run is reproducible on the same machine. One run
per seed of ``training.seeds`` (default: the config's seed). Outputs in
``training.out_dir/<name>/seed-<k>/``:

- ``tb/``: TensorBoard logs (``tf.summary``: loss, epsilon, mean reward, episode success ratio);
- ``checkpoints/ckpt-<step>``: TensorFlow checkpoints (online + target network + optimizer);
- ``policy.npz`` / ``policy.json``: the exported greedy policy;
- ``episodes.csv`` and ``curve.png``: the training curve (episode success ratio vs step);

and in ``training.out_dir/<name>/``: ``curves.png`` (every seed's curve, smoothed) and the policy
of ``export_seed`` copied to ``training.export_to`` when set (e.g. ``models/aset/aset``).

Rollout workers (``training.rollout_workers`` N >= 1): episodes are simulated N at a time in
worker processes (:func:`testbed.core.distributed.imap_unordered`, process pool or Ray) by the numpy
copy of the current online network with the current epsilon; the learner then stores their
transitions and runs the gradient steps those windows are due (``agent.train_every``). Our choice
against RLlib: the agent is ~200 lines of TensorFlow whose transitions settle windows late (the
reward of a window is known only once its queries resolved), which RLlib's DQN has no notion of;
RLlib would also bring its own torch/TF stack. Ray is used as it is elsewhere in the testbed, as
the backend that runs the workers.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testbed.agent.npolicy import NumpyPolicy, copy_policy, export_policy, policy_files
from testbed.aset.curves import plot_curves, write_curve  # noqa: F401 - write_curve importable from here too
from testbed.aset.envs import AsetSimEnv
from testbed.aset.scenarios import (  # noqa: F401 - importable from here too (cli, tests)
    PlanSampler,
    check_episode_loads,
    check_plans,
    check_reward_baselines,
    check_training_scenarios,
    resolve,
    scale_rates,
    scaled_experiment,
    scenario_sampler,
    training_scenarios,
)
from testbed.core.distributed import imap_unordered
from testbed.core.errors import EXIT_NOTHING_MEASURED, InputError, RunFailure, counted
from testbed.plan.build import Plan, runs_dir_problem
from testbed.plan.policies import aset_actions
from testbed.spec.aset import AsetConfig, TrainingSpec
from testbed.spec.experiment import ConfigError


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
    return next((problem for f in policy_files(dst) if (problem := _file_problem(f))), None)


def check_outputs(cfg: AsetConfig, base: Path, seeds: list[int], folders: tuple[tuple[str, Path], ...] = (),
                  exports: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, output paths training could not write (folders tried for real and
    left as they were, :func:`testbed.plan.build.runs_dir_problem`): ``training.out_dir/<name>``, each
    seed's folder (``seed-<k>``) and ``curves.png`` there, ``training.export_to``, and the caller's
    ``folders`` ((item, folder): e.g. the rollout cache) and ``exports`` (e.g. the
    specialised policies).

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


#: What a training run writes in its folder (``seed-<k>``, ``specialised/<scenario>``), either method:
#: removed when a run starts there (:func:`clear_run_dir`).
RUN_OUTPUTS = ("checkpoints", "tb", "episodes.csv", "curve.png", "policy.npz", "policy.json", "data.npz",
               "epochs.csv", "rollout.json")


def clear_run_dir(out: Path) -> None:
    """Remove what an earlier training run wrote in ``out`` (:data:`RUN_OUTPUTS`; nothing else), so
    the new run starts from an empty folder: its ``checkpoints/`` hold its own steps only
    (:func:`last_checkpoint`, hence ``--specialise``, takes this run's) and ``tb/`` its own events."""
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


def _scalar(tag: str, value: float, step: int) -> None:
    """Write one TensorBoard scalar with ``tf.summary.write`` (TensorFlow core: the TensorBoard
    package is not needed to write the event files, only to view them)."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = "scalars"
    md.data_class = summary_pb2.DATA_CLASS_SCALAR
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=md.SerializeToString())


def tf_one_thread() -> None:
    """TensorFlow on 1 intra-op and 1 inter-op thread: the 2 cores are shared (docs/aset.md). Only
    possible before TensorFlow's first op; later calls change nothing."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass


class _Run:
    """The state of one training run (one seed): env, agent, log writer, progress bar."""

    def __init__(self, cfg: AsetConfig, base: Path, seed: int, out: Path, plans, simulator_factory):
        import tensorflow as tf  # heavy: only when training

        from testbed.aset.agent import DQNAgent  # imports TensorFlow

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


def export_weights(cfg: AsetConfig, env: AsetSimEnv, weights: list[np.ndarray], path: Path, seed: int,
                   meta: dict) -> None:
    """Export a Q-network's weights trained on ``env``'s spaces as the deployable greedy policy
    (:func:`testbed.agent.npolicy.export_policy`, the decision rule of ``cfg.agent.plan_margin``);
    ``meta`` is stored with the config's name, the seed and the training scenarios."""

    ctx = env.contexts[0]
    meta = {"config": cfg.name, "seed": seed, "trained_on": list(cfg.training.scenarios), **meta}
    export_policy(weights, path, obs_spec=cfg.observation, applications=list(ctx.applications),
                  clusters=list(ctx.clusters), policies=list(env.policies), sources=list(ctx.sources),
                  meta=meta, deadlines_ms=list(ctx.deadline_ms), plan_margin=cfg.agent.plan_margin)


def train(cfg: AsetConfig, base: Path, *, steps: int | None = None, progress: bool = True,
          simulator_factory=None, plans=None, console=None, seed: int | None = None,
          out_dir: Path | None = None, backend: str = "process", ray_address: str | None = None,
          init_checkpoint: Path | None = None) -> TrainResult:
    """One training run (one seed) per ``cfg`` (``cfg.training`` required) in ``out_dir``, emptied
    first of what an earlier run wrote there (:func:`clear_run_dir`); exports its policy unless the
    network took no gradient step (``updates`` 0 in the result: nothing exported, the caller says so).

    Args:
        cfg: the ASET config. base: folder for relative paths (the repository).
        steps: override ``training.steps``. progress: show a rich progress bar.
        simulator_factory / plans: for tests (a fake simulator; a Plan or PlanSampler).
        seed: the run's seed (default the config's). out_dir: the run's folder (default
            ``training.out_dir/<name>``). backend / ray_address: where rollout workers run.
        init_checkpoint: start from this :meth:`DQNAgent.save` checkpoint (online and target
            network, optimizer) instead of a fresh network (:func:`specialise`).

    Raises:
        ValueError: ``cfg.training`` is missing.
    """
    tr = _dqn_training(cfg)
    steps = steps or tr.steps
    seed = cfg.seed if seed is None else int(seed)
    out = out_dir or resolve(base, tr.out_dir) / cfg.name
    run = _Run(cfg, base, seed, out, plans, simulator_factory)
    if init_checkpoint is not None:
        run.agent.load(init_checkpoint)
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


def _train_seed(cfg_json: str, base: str, seed: int, steps: int | None, out: str, init: str | None = None) -> dict:
    """One seed's training run in a worker process; returns what the parent needs."""
    cfg = AsetConfig.model_validate_json(cfg_json)
    res = train(cfg, Path(base), steps=steps, progress=False, seed=seed, out_dir=Path(out),
                init_checkpoint=Path(init) if init else None)
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
        copy_policy(src, resolve(base, tr.export_to))
    return results


def specialised_path(checkpoint: str | Path, scenario: str) -> Path:
    """Where the checkpoint specialised to ``scenario`` (its experiment name) lives:
    ``<checkpoint>-<scenario>`` (``.npz`` / ``.json``), a ``.`` of the name written ``_`` (the
    policy files are named by suffix)."""
    p = Path(checkpoint)
    return p.with_name(f"{p.name}-{scenario.replace('.', '_')}")


def last_checkpoint(seed_dir: Path) -> Path:
    """The newest ``checkpoints/ckpt-<step>`` (highest step) of one seed's training run: that of
    the latest run, as each run starts from an emptied folder (:func:`clear_run_dir`).

    Raises:
        FileNotFoundError: the run has no checkpoint (train first).
    """
    found = sorted((int(c.stem.split("-")[-1]), c.with_suffix(""))
                   for c in (seed_dir / "checkpoints").glob("ckpt-*.index"))
    if not found:
        raise FileNotFoundError(f"{seed_dir / 'checkpoints'}: no training checkpoint (run testbed train first)")
    return found[-1][1]


def specialise(cfg: AsetConfig, base: Path, *, jobs: int = 1, backend: str = "process",
               ray_address: str | None = None, console=None, steps: int | None = None,
               scenarios: tuple[PlanSampler, list[Plan]] | None = None) -> list[TrainResult]:
    """Per-scenario fine-tuning (:class:`testbed.spec.aset.SpecialiseSpec`): for each scenario of
    ``training.scenarios``, the export seed's last checkpoint trained on that scenario alone
    (load randomised as in training), ``jobs`` scenarios at a time; output in
    ``training.out_dir/<name>/specialised/<scenario>/``, the policy exported to
    :func:`specialised_path` of ``training.export_to``.

    ``scenarios``: :func:`training_scenarios` of ``cfg`` when the caller has them. Each
    scenario's folder is emptied first of an earlier run's outputs.

    Raises:
        ValueError: no ``training:`` section or no ``export_to``; ConfigError (a ValueError) and
            the plan's errors: the scenarios as :func:`training_scenarios`. FileNotFoundError: the
            general training has not run (no checkpoint of the export seed). InputError: steps too
            few to train (:func:`check_can_train`), an output path that cannot be written
            (:func:`check_outputs`). RunFailure: a scenario's network took no gradient step
            (nothing exported for any scenario, :func:`refuse_untrained`).
    """

    tr = cfg.training
    if tr is None or not tr.export_to:
        raise ValueError(f"ASET config {cfg.name!r}: --specialise needs 'training:' with 'export_to'")
    plans = (scenarios or training_scenarios(cfg, base))[1]  # distinct names: each names its own folder
    sp = tr.specialise
    seed = tr.export_seed if tr.export_seed is not None else training_seeds(cfg)[0]
    root = resolve(base, tr.out_dir) / cfg.name
    init = last_checkpoint(root / f"seed-{seed}")
    check_can_train(cfg, plans, steps or sp.steps, "--steps" if steps else "training.specialise.steps")
    names = [p.experiment.name for p in plans]
    check_outputs(cfg, base, [], folders=tuple((f"training.out_dir {tr.out_dir}", root / "specialised" / n)
                                               for n in names),
                  exports=tuple(str(specialised_path(tr.export_to, n)) for n in names))
    agent = cfg.agent.model_copy(update={"epsilon_start": sp.epsilon_start,
                                         "epsilon_decay_steps": sp.epsilon_decay_steps})
    steps = steps or sp.steps
    tasks = []
    for scenario, name in zip(tr.scenarios, names, strict=True):
        mix = (cfg.reward.baseline_mix or {}).get(name)  # this scenario's mix only: the run has no other
        reward = cfg.reward.model_copy(update={"baseline_mix": {name: mix} if mix is not None else None})
        sub = cfg.model_copy(update={"agent": agent, "reward": reward, "training": tr.model_copy(update={
            "scenarios": [scenario], "steps": steps, "seeds": [seed]})})
        tasks.append((sub.model_dump_json(), str(base), seed, steps, str(root / "specialised" / name), str(init)))
    results: list[TrainResult] = []
    curves: dict[str, list[dict]] = {}
    for i, r in imap_unordered(_train_seed, tasks, backend=backend, jobs=max(1, jobs), ray_address=ray_address):
        results.append(_from_worker(r))
        curves[names[i]] = r["episodes"]
        if console is not None:
            console.print(f"{names[i]}: {counted(r['steps'], 'step')} in {r['wall_s']:.0f} s from {init}")
    if any(curves.values()):
        plot_curves(root / "specialised" / "curves.png", {n: e for n, e in curves.items() if e},
                     f"ASET specialised per scenario (seed {seed})")
    refuse_untrained(results, lambda r: f"specialised {r.out_dir.name}")
    results.sort(key=lambda r: names.index(r.out_dir.name))
    for res in results:
        copy_policy(res.policy_path, resolve(base, str(specialised_path(tr.export_to, res.out_dir.name))))
    return results


def write_curves(root: Path, results: list[TrainResult]) -> None:
    """``curves.png``: every seed's learning curve (moving mean of the episode success ratio and,
    with a reward baseline, of the success ratio above the baseline run)."""
    root.mkdir(parents=True, exist_ok=True)
    runs = {f"seed {r.seed}": r.episodes for r in results if r.episodes}
    if runs:
        plot_curves(root / "curves.png", runs, f"ASET learning curves ({len(runs)} seeds)")
