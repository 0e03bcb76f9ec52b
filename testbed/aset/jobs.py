"""The jobs of ``testbed evaluate`` (:mod:`testbed.aset.evaluate`), each run in a worker process on
one scenario file and seed (plans are loaded in the worker), and the ONE result cache of the
evaluation and the trainers' data episodes.

Jobs: every static policy (:func:`static_job`), one per-source assignment (:func:`assignment_job`),
the mix search (:func:`mix_job`), the oracle (:func:`oracle_job`), the causal planner
(:func:`causal_job`) and an agent (:func:`agent_job`: the SAME loop as ``testbed simulate``,
:func:`testbed.sim.run.drive`, so the same seed gives the same decisions). Every figure is counted
by :class:`testbed.aset.episode.Episode` (the queries created in the run's duration, on common
random numbers).

Cache: a job's result is kept as JSON under :func:`task_key`: the job, its arguments, the
simulation's code (:func:`code_fingerprint`), a scenario's file and inputs
(:func:`inputs_fingerprint`), and a checkpoint's files.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from testbed.agent.checkpoint import checkpoint_files, checkpoint_path
from testbed.agent.selector import initial_policy
from testbed.aset.episode import Episode, run_static
from testbed.aset.headroom import best_mix, causal_planner, rollout_oracle, static_ratio
from testbed.core.distributed import imap_unordered
from testbed.core.util import repo_path, write_json_atomic
from testbed.plan.build import Plan, plan_experiment
from testbed.sim.run import drive
from testbed.spec.experiment import AsetSpec, load_experiment

#: The code a simulated figure depends on (folders and files under ``testbed/``): the model, the
#: simulator, the plan, the specs, the agents, the episodes, the references' rollouts, the
#: generator. Not the orchestration (evaluate, the trainers), the docs nor the command line.
SIM_CODE = ("core", "model", "sim", "plan", "spec", "agent", "aset/episode.py", "aset/headroom.py",
            "aset/generator.py", "aset/envs.py", "aset/scenarios.py", "aset/jobs.py")


def plan_of(scenario: str) -> Plan:
    """The plan of a scenario file (each worker plans its own)."""
    return plan_experiment(scenario)


def static_job(scenario: str, seed: int, actions: Sequence[str], duration_s: float | None,
               view: str = "reports") -> dict[str, list[int]]:
    """Every static policy on one seed, the dispatchers' ``view`` (``reports`` or ``fresh``):
    ``{policy: [ok, n]}``."""
    plan = plan_of(scenario)
    out = {}
    for a in actions:
        ep = run_static(plan, seed, [a] * len(plan.sources), None, duration_s, view=view)
        out[a] = [int(ep.ok.sum()), int(ep.n.sum())]
    return out


def assignment_job(scenario: str, seed: int, assignment: Sequence[str], duration_s: float | None) -> list[int]:
    """One constant per-source assignment (sorted source order) on one seed: [ok, n]."""
    return list(static_ratio(plan_of(scenario), seed, assignment, None, duration_s))


def mix_job(scenario: str, seeds: Sequence[int], actions: Sequence[str], duration_s: float | None,
            known: dict[str, float]) -> list:
    """The per-source mix of one scenario chosen on ``seeds`` by coordinate ascent from the best
    of ``known`` (static policy -> mean on those seeds): [mix, its mean]."""
    plan = plan_of(scenario)
    n = len(plan.sources)
    start = max(known, key=lambda p: (known[p], p))
    mix, v, _ = best_mix(plan, seeds, actions, start, None, duration_s, {tuple([p] * n): m for p, m in known.items()})
    return [mix, v]


def oracle_job(scenario: str, seed: int, bases: Sequence[Sequence[str]], actions: Sequence[str],
               duration_s: float | None, horizon: int | None) -> dict:
    """The clairvoyant oracle on one seed (:func:`testbed.aset.headroom.rollout_oracle`)."""
    r = rollout_oracle(plan_of(scenario), seed, bases, actions, None, duration_s, horizon)
    return {"ok": r.ok, "n": r.n, "fallback": r.fallback, "schedule": r.schedule}


def causal_job(scenario: str, seed: int, base: Sequence[str], actions: Sequence[str], samples: int,
               duration_s: float | None, horizon: int | None, min_t: float) -> dict:
    """The causal planner on one seed (:func:`testbed.aset.headroom.causal_planner`, over ``base``)."""
    r = causal_planner(plan_of(scenario), seed, base, actions, samples, None, duration_s, horizon, min_t)
    moved = sum(a != b for row in r.schedule for a, b in zip(row, base, strict=True))
    return {"ok": r.ok, "n": r.n, "schedule": r.schedule, "deviations": moved / max(1, len(r.schedule) * len(base))}


def agent_job(scenario: str, seed: int, agent: str, duration_s: float | None) -> dict:
    """An agent (``agent``: an ``aset:`` section as JSON, :class:`testbed.spec.experiment.AsetSpec`)
    driving every source on one seed, through :func:`testbed.sim.run.drive` (``testbed simulate``'s
    loop): ``{"ok", "n", "shares": {policy: share of the decisions}, "schedule": {source: [policy per
    window]}}``."""
    plan = plan_of(scenario)
    aset = AsetSpec.model_validate_json(agent)
    srcs = sorted(h.name for h in plan.sources)
    ep = Episode(plan, seed, dict.fromkeys(srcs, initial_policy(aset)), None, duration_s)
    schedule = drive(ep.sim, plan, srcs, aset, ep.duration_s, on_resolved=ep.count)
    ep.finish()
    counts: dict[str, int] = {}
    for names in schedule.values():
        for p in names:
            counts[p] = counts.get(p, 0) + 1
    total = max(1, sum(counts.values()))
    return {"ok": int(ep.ok.sum()), "n": int(ep.n.sum()), "shares": {p: c / total for p, c in sorted(counts.items())},
            "schedule": schedule}


# ----------------------------------------------------------------------------- the cache
def _hash_files(files: Sequence[Path], root: Path) -> str:
    """sha256 over each file's path relative to ``root`` and its bytes, in sorted order."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


@functools.cache
def code_fingerprint() -> str:
    """sha256 of :data:`SIM_CODE`'s Python files (paths and bytes): the ONE key of every cached
    simulation (evaluation jobs, the trainers' data episodes)."""
    pkg = Path(__file__).resolve().parents[1]
    files: list[Path] = []
    for part in SIM_CODE:
        p = pkg / part
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return _hash_files([f for f in files if "__pycache__" not in f.parts], pkg)


@functools.cache
def inputs_fingerprint(scenario: str) -> str:
    """sha256 of what a scenario's simulation reads besides its own file: every file of its
    profiles folder, its zoo's ``manifest.json`` and its topology file (a ``topohub:`` source is
    fixed by the pinned package). A missing folder hashes as empty; planning reports it."""
    exp = load_experiment(scenario)
    profiles, zoo = repo_path(exp.profiles_dir), repo_path(exp.zoo_dir)
    files = [f for f in profiles.rglob("*") if f.is_file()] if profiles.is_dir() else []
    manifest = zoo / "manifest.json"
    out = _hash_files(files, profiles) + (_hash_files([manifest], zoo) if manifest.is_file() else "")
    src = str(exp.topology.source)
    if not src.startswith("topohub:"):
        for cand in (Path(scenario).parent / src, repo_path("topologies") / src, Path(src)):
            if cand.is_file():
                out += _hash_files([cand.resolve()], cand.resolve().parent)
                break
    return out


def task_key(fn: Callable, task: tuple) -> str:
    """The cache key of one job (module docstring)."""
    h = hashlib.sha256(f"{fn.__name__}\0{code_fingerprint()}".encode())
    for a in task:
        h.update(json.dumps(a, sort_keys=True, default=str).encode())
        if isinstance(a, str) and a.endswith((".yaml", ".yml")) and Path(a).is_file():
            h.update(Path(a).read_bytes())
            h.update(inputs_fingerprint(str(Path(a).resolve())).encode())
    if fn is agent_job:
        ckpt = AsetSpec.model_validate_json(task[2]).checkpoint
        for f in checkpoint_files(checkpoint_path(ckpt)) if ckpt else ():
            h.update(f.read_bytes() if f.is_file() else b"")
    return h.hexdigest()[:24]


def run_jobs(fn: Callable, tasks: list[tuple], *, cache: Path | None, workers: int = 2, backend: str = "process",
             ray_address: str | None = None, advance: Callable[[], None] | None = None,
             warn: Callable[[str], None] | None = None) -> list:
    """``fn(*task)`` for every task, in task order, in parallel (:mod:`testbed.core.distributed`),
    each result kept in ``cache`` (a folder; None: no cache) under :func:`task_key` and reused; a
    cache file that cannot be read is a miss (said by ``warn``) and is written again.
    ``advance`` is called once per task done (a progress bar)."""
    keys = [cache / f"{task_key(fn, t)}.json" if cache is not None else None for t in tasks]
    out: list = [None] * len(tasks)
    todo = []
    for i, f in enumerate(keys):
        if f is not None and f.is_file():
            try:
                out[i] = json.loads(f.read_text())
                if advance is not None:
                    advance()
                continue
            except (OSError, ValueError) as exc:
                if warn is not None:
                    warn(f"evaluation cache file {f} is unreadable ({type(exc).__name__}: {exc}); computing it again")
        todo.append(i)
    for k, r in imap_unordered(fn, [tasks[i] for i in todo], backend=backend, jobs=workers, ray_address=ray_address):
        i = todo[k]
        out[i] = json.loads(json.dumps(r))  # the same types as a cached result
        if keys[i] is not None:
            keys[i].parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(keys[i], r, indent=None)
        if advance is not None:
            advance()
    return out


def progress_bar(console, total: int, label: str):
    """A started rich progress bar of ``total`` jobs: ``(bar, task)``; its description is the
    phase, with done / total, elapsed time and the estimated time left."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn(f"[bold]{label}[/bold] {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
    task = bar.add_task("", total=total)
    bar.start()
    return bar, task


__all__ = ["SIM_CODE", "agent_job", "assignment_job", "causal_job", "code_fingerprint", "inputs_fingerprint",
           "mix_job", "oracle_job", "plan_of", "progress_bar", "run_jobs", "static_job", "task_key"]
