"""``testbed evaluate CONFIG``: headroom first (every static policy, the per-source static mix, the
clairvoyant switching oracle), then ASET, per scenario, over seeds; fresh seeds confirm.

For each scenario file of ``evaluation.scenarios`` (all on common random numbers: seed k gives
every schedule the same arrivals; every figure is counted by :class:`testbed.aset.episode.Episode`:
success ratio = successful / created queries):

1. every static policy of the action set on seeds 1..N (tuning seeds); the best static policy is
   the one with the highest mean;
2. the per-source static mix, chosen on the tuning seeds (coordinate ascent,
   :func:`testbed.aset.headroom.best_mix`);
3. the oracle on every tuning seed (multiagent rollout over the better of the mix and the best
   static policy on that seed, :func:`testbed.aset.headroom.rollout_oracle`); headroom = oracle -
   best static, paired per seed (``evaluation.oracle_seeds``: on the first N tuning seeds only);
   with ``evaluation.causal_samples`` K > 0 (``--causal K``), the causal planner on the oracle's
   seeds too (:func:`testbed.aset.headroom.causal_planner` over the mix: what a selector that sees
   the whole present but none of the future's draws gains with the same look-ahead);
4. ASET (``evaluation.checkpoint``, greedy) on the same seeds, when the checkpoint exists;
5. with ``fresh_seeds`` M > 0: steps 1 (all statics), 3 (and the planner) and 4 again on seeds fresh_from ..
   fresh_from + M - 1 with the best static policy and the mix chosen in 1-2: the headroom and ASET's
   figures confirmed on seeds nothing was chosen on.

Statistics: mean and 95 % CI half-width (Student's t, :func:`testbed.core.util.ci95`) over the seeds, and
paired differences per seed with their CI. Verdicts (the targets of docs/aset.md): within 1 pt = mean(ASET - best
static) >= -1 pt; above = the paired difference's lower CI bound > 0, against the best static and
against the mix; captured = mean(ASET - best static) / mean(headroom), required >= 0.5 where the
headroom is >= 3 points.

Also the decision agreement of every pair of actions (:func:`agreement`): two actions that decide
the same in every state met are duplicates (to be merged or made distinct).

Before any run, the input is checked (:func:`evaluate`'s Raises): each scenario file once and of its
own name, a duration of whole decision windows that expects queries, readable checkpoints that fit
the scenarios, writable results folders. A seed on which no query was created has no success ratio:
it is left out of every mean and seed count.

Outputs in ``evaluation.out_dir/<name>/``: ``runs.csv`` (one row per scenario x kind x policy x
seed), ``results.csv`` / ``results.md`` (the tables), ``results.png`` (bars with 95 % CI),
``oracle.json`` (the oracle's schedules, and the planner's under ``causal``), ``agreement.md``.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.agent.npolicy import policy_files
from testbed.aset.episode import window_of
from testbed.aset.jobs import (  # noqa: F401 - the jobs are importable from here too
    agreement_job,
    aset_job,
    assignment_job,
    causal_job,
    check_checkpoint,
    mix_job,
    oracle_job,
    plan_of,
    static_job,
)
from testbed.aset.tables import (  # noqa: F401 - importable from here too
    ASET,
    CAUSAL,
    MIX,
    NOT_STATIC,
    ORACLE,
    agreement_markdown,
    results_markdown,
    summarise,
    summary_markdown,
    write_results,
)
from testbed.aset.train import specialised_path
from testbed.core.distributed import imap_unordered
from testbed.core.errors import EXIT_BRINGUP, EXIT_NOTHING_MEASURED, InputError, RunFailure, naming_file
from testbed.core.util import ci95, repo_path, scenarios_problem, write_json_atomic
from testbed.plan.build import Plan, check_load_bounds, runs_dir_problem
from testbed.plan.policies import aset_actions
from testbed.spec.aset import AsetConfig, EvaluationSpec, ObservationSpec
from testbed.spec.experiment import Experiment, load_experiment


# ----------------------------------------------------------------------------- orchestration
@dataclass
class EvalResult:
    out_dir: Path
    runs: list[dict]
    table: list[dict]
    mixes: dict[str, list[str]] = field(default_factory=dict)
    agreement: dict[str, list[int]] = field(default_factory=dict)


def _hash_files(files: Sequence[Path], root: Path) -> str:
    """sha256 over each file's path relative to ``root`` and its bytes, in sorted order."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 of the ``testbed`` package's Python source: any change to the model, the simulator,
    the policies or ASET gives every cached result a new key (conservative: a change of a docstring
    does too)."""
    pkg = Path(__file__).resolve().parents[1]
    return _hash_files([f for f in pkg.rglob("*.py") if "__pycache__" not in f.parts], pkg)


@functools.cache
def inputs_fingerprint(scenario: str) -> str:
    """sha256 of what a scenario's simulation reads besides its own file: every file of its
    profiles folder (service times, ``handling.json``), its zoo's ``manifest.json`` and its
    topology file (not a ``topohub:`` source: fixed by the pinned package)
    (``models.zoo_dir`` / ``models.profiles_dir``, resolved as :func:`testbed.plan.build.build_plan` does).
    A missing folder hashes as empty; planning the scenario reports it."""

    exp = load_experiment(scenario)
    profiles, zoo = repo_path(exp.profiles_dir), repo_path(exp.zoo_dir)
    files = [f for f in profiles.rglob("*") if f.is_file()] if profiles.is_dir() else []
    manifest = zoo / "manifest.json"
    out = _hash_files(files, profiles) + (_hash_files([manifest], zoo) if manifest.is_file() else "")
    src = str(exp.topology.source)
    if not src.startswith("topohub:"):  # a topology file: its links' delays and bandwidths
        for cand in (Path(scenario).parent / src, repo_path("topologies") / src, Path(src)):
            if cand.is_file():
                out += _hash_files([cand.resolve()], cand.resolve().parent)
                break
    return out


def task_key(fn, task: tuple) -> str:
    """A stable key of one job: the function, its arguments, the package's code
    (:func:`code_fingerprint`) and, for a scenario argument, its content and its profiles and zoo
    manifest (:func:`inputs_fingerprint`), for a checkpoint argument its content. So re-measured
    profiles, a changed model or a retrained policy are never served from the cache."""
    import hashlib

    h = hashlib.sha256(fn.__name__.encode())
    h.update(code_fingerprint().encode())
    for a in task:
        h.update(json.dumps(a, sort_keys=True, default=str).encode())
        if isinstance(a, str) and fn is aset_job and policy_files(a)[0].is_file():
            for f in policy_files(a):  # the weights and the JSON (decision rule, plans, observation spec)
                h.update(f.read_bytes() if f.is_file() else b"")
        if isinstance(a, str) and a.endswith((".yaml", ".yml")) and Path(a).is_file():
            h.update(Path(a).read_bytes())
            h.update(inputs_fingerprint(str(Path(a).resolve())).encode())
    return h.hexdigest()[:24]


def _read_cached(f: Path, warn: Callable[[str], None]) -> tuple[bool, object]:
    """``(True, result)`` of a cache file, or ``(False, None)``: no file, or one that cannot be read
    or is not JSON (a run killed while writing, a full disk): then a cache miss, said by ``warn``,
    whose result is computed again and overwrites the file."""
    if not f.is_file():
        return False, None
    try:
        return True, json.loads(f.read_text())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        warn(f"evaluation cache file {f} is unreadable or corrupt ({type(exc).__name__}: {exc}); "
             f"computing that result again")
        return False, None


def _warn(msg: str) -> None:
    warnings.warn(msg, stacklevel=3)


def _parallel(fn, tasks: list[tuple], backend: str, jobs: int, ray_address: str | None, bar,
              cache: Path | None = None, warn: Callable[[str], None] = _warn) -> list:
    """``fn(*task)`` for every task, in task order (parallel per :mod:`testbed.core.distributed`).
    With ``cache`` (a folder), each result is kept as JSON under its :func:`task_key` and reused
    by a later evaluation (the headroom measured before training serves the one after it); a
    corrupt cache file is a miss (:func:`_read_cached`)."""

    out: list = [None] * len(tasks)
    keys = [cache / f"{task_key(fn, t)}.json" if cache is not None else None for t in tasks]
    uncached = []
    for i, f in enumerate(keys):
        hit, value = _read_cached(f, warn) if f is not None else (False, None)
        if hit:
            out[i] = value
            if bar is not None:
                bar[0].advance(bar[1])
        else:
            uncached.append(i)

    def done(i: int, r) -> None:
        out[i] = r
        if keys[i] is not None:
            keys[i].parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(keys[i], r, indent=None)
            out[i] = json.loads(json.dumps(r))  # the same types as a cached result
        if bar is not None:
            bar[0].advance(bar[1])

    for k, r in imap_unordered(fn, [tasks[i] for i in uncached], backend=backend, jobs=jobs, ray_address=ray_address):
        done(uncached[k], r)
    return out


def _row(scenario: str, kind: str, policy: str, seed: int, ok: int, n: int, **extra) -> dict:
    return {"scenario": scenario, "kind": kind, "policy": policy, "seed": seed, "ok": ok, "n": n,
            "success_ratio": ok / n if n else math.nan, **extra}


def _statics_and_mix(scenarios, names, seeds, actions, dur, run, kind) -> tuple[dict, dict]:
    """Steps 1-2 on the tuning seeds: static runs, then the mix per scenario. A seed on which no
    query was created has no success ratio (NaN): the means leave it out, as :func:`summarise` does.

    Raises:
        RunFailure: (exit code 5) a scenario created no query on any tuning seed: every success
            ratio is undefined, so there is no best static policy nor mix to choose.
    """
    runs: list[dict] = []
    res = run(static_job, [(s, k, actions, dur) for s in scenarios for k in seeds])
    it = iter(res)
    for s in scenarios:
        for k in seeds:
            for p, (ok, n) in next(it).items():
                runs.append(_row(names[s], kind, p, k, ok, n))
    for s in scenarios:
        if not any(r["n"] for r in runs if r["scenario"] == names[s]):
            raise RunFailure(f"{s}: no query was created on any of the tuning seeds {seeds[0]}..{seeds[-1]} in "
                             f"{_duration_text(dur)}: every success ratio is undefined (0 of 0); lengthen the "
                             f"duration (--duration, evaluation.duration) or give it more seeds", EXIT_NOTHING_MEASURED)
    means = {s: {p: ci95([r["success_ratio"] for r in runs if r["scenario"] == names[s] and r["policy"] == p])[0]
                 for p in actions} for s in scenarios}
    mixes = run(mix_job, [(s, seeds, actions, dur, means[s]) for s in scenarios])
    return {"runs": runs, "means": means}, {s: m[0] for s, m in zip(scenarios, mixes, strict=True)}


def _duration_text(dur: float | None) -> str:
    return f"{dur:g} s" if dur else "the experiment's duration"


@dataclass
class _Setup:
    """What :func:`evaluate` checked before any run: the scenario files (resolved, each once),
    their experiment names, the simulated duration (None: each experiment's own), the
    checkpoint of each scenario (None: headroom only), the causal planner's samples, the
    results folder and the cache folder."""

    scenarios: list[str]
    names: dict[str, str]
    dur: float | None
    ckpts: dict[str, Path] | None
    causal: int
    out: Path
    cache: Path


def _prepare(cfg: AsetConfig, base: Path, duration_s: float | None, headroom_only: bool, specialised: bool,
             causal_samples: int | None) -> _Setup:
    """Every check of :func:`evaluate` that needs no run, in order (its Raises)."""

    ev = cfg.evaluation
    if headroom_only and specialised:
        raise InputError("--specialised with --headroom: the headroom runs no checkpoint, so --specialised would "
                         "only change the results folder (<name>-specialised); give one of the two")
    scenarios = scenario_files(ev.scenarios, base)
    plans = {s: plan_of(s) for s in scenarios}
    exps = {s: p.experiment for s, p in plans.items()}
    names = {s: e.name for s, e in exps.items()}
    check_scenario_names(scenarios, names)
    causal = ev.causal_samples if causal_samples is None else causal_samples
    if causal:
        _check_causal(exps, causal, ev.causal_min_t)
    ckpt = repo_path(ev.checkpoint, base)
    ckpts = None if headroom_only else {s: specialised_path(ckpt, names[s]) if specialised else ckpt
                                        for s in scenarios}
    windows = _check_checkpoints(ckpts, specialised, cfg.observation) if ckpts is not None else {}
    dur = duration_s or ev.duration_s
    check_durations(plans, dur, "--duration" if duration_s else "evaluation.duration", windows)
    root = repo_path(ev.out_dir, base)
    out = root / (cfg.name + ("-specialised" if specialised else ""))
    check_out_dirs(root, [root, out, root / "cache"])
    return _Setup(scenarios, names, dur, ckpts, causal, out, root / "cache")


def scenario_files(entries: Sequence[str], base: Path) -> list[str]:
    """``evaluation.scenarios`` resolved against ``base`` (a file listed twice, or two of one name,
    is refused once they are planned: :func:`check_scenario_names`)."""
    return [str(repo_path(s, base)) for s in entries]


def check_scenario_names(scenarios: Sequence[str], names: dict[str, str]) -> None:
    """Refuse a scenario file listed twice (two spellings of one path too: its runs would count
    twice) or two files of one experiment ``name`` (:func:`testbed.core.util.scenarios_problem`, the
    rule training and sweeps apply too).

    Raises:
        InputError: naming the file, or both files and the name: runs.csv, the tables, oracle.json
            and the specialised checkpoints key a scenario by its name, so the two would be merged.
    """
    problem = scenarios_problem("evaluation.scenarios", scenarios, [names[s] for s in scenarios],
                                "runs.csv, the tables, oracle.json and --specialised")
    if problem:
        raise InputError(problem)


def check_durations(plans: dict[str, Plan], dur: float | None, where: str, aset_windows: dict[str, float]) -> None:
    """Refuse, before any run, a simulated duration a scenario cannot be evaluated on: shorter
    than one decision window or not a whole number of them (the episode would be rounded to whole
    windows: the figures would count another duration, and ASET's runs another than the
    statics'), or, for an override ``dur`` of the experiment's duration, a workload outside the
    plan's bounds for it (:func:`testbed.plan.build.check_load_bounds`: fewer than 1 query expected, ...).

    Args:
        plans: scenario file -> plan. dur: the override (None: each experiment's own duration),
            named ``where`` (``--duration`` or ``evaluation.duration``).
        aset_windows: scenario file -> ASET's decision window (s; the checkpoint's observation.window).

    Raises:
        InputError: naming the scenario file, the duration and the window or the bound.
    """

    for s, plan in plans.items():
        eff = dur or float(plan.experiment.duration_s)
        what = f"{where} {eff:g} s" if dur else f"the duration of {s}, {eff:g} s,"
        windows = {f"the report_interval of {s}": window_of(plan, None)}
        if s in aset_windows:
            windows[f"ASET's, the checkpoint's observation.window for {s}"] = aset_windows[s]
        for name, w in windows.items():
            k = eff / w
            if k < 1 - 1e-9:
                raise InputError(f"{what} is shorter than one decision window ({name}: {w * 1e3:g} ms)")
            if abs(k - round(k)) > 1e-6:
                raise InputError(f"{what} is not a whole number of decision windows ({name}: {w * 1e3:g} ms): the "
                                 f"runs would last {round(k) * w:g} s; give a multiple of {w * 1e3:g} ms")
        if dur is not None:
            try:
                check_load_bounds(plan.experiment, plan.weights, eff, Path(plan.base_dir))
            except InputError as exc:
                raise naming_file(exc, f"{s} with {what}") from None


def check_out_dirs(root: Path, dirs: Sequence[Path]) -> None:
    """Refuse, before any run, results folders that cannot be written (tried for real and left as
    they were: :func:`testbed.plan.build.runs_dir_problem`).

    Raises:
        RunFailure: (exit code 3, as testbed run's, simulate's and sweep's same check) naming
            ``evaluation.out_dir`` and what is in the way (a file, a folder that cannot be created
            or written).
    """

    for d in dirs:
        problem = runs_dir_problem(d)
        if problem:
            raise RunFailure(f"evaluation.out_dir {root}: {problem}; nothing was run", EXIT_BRINGUP)


def evaluate(cfg: AsetConfig, base: Path, *, seeds: int | None = None, duration_s: float | None = None,
             workers: int = 2, progress: bool = True, console=None, backend: str = "process",
             ray_address: str | None = None, headroom_only: bool = False, fresh_seeds: int | None = None,
             agreement_check: bool = True, specialised: bool = False,
             causal_samples: int | None = None) -> EvalResult:
    """Run the evaluation (``cfg.evaluation`` required; module docstring); writes and returns it.

    ``headroom_only``: skip ASET (what ``testbed evaluate --headroom`` does before training).
    ``specialised``: ASET on each scenario is the checkpoint specialised to it
    (:func:`testbed.aset.train.specialised_path`, ``testbed train --specialise``); results in
    ``<out_dir>/<name>-specialised/``. ``causal_samples``: overrides ``evaluation.causal_samples``
    (0: no causal planner). ``duration_s``: overrides ``evaluation.duration``.

    Raises:
        ValueError: no ``evaluation:`` section.
        InputError (a ValueError), before any run: ``specialised`` with ``headroom_only``; a
            scenario file listed twice or two of one name (:func:`check_scenario_names`); a
            duration that is not whole decision windows or expects < 1 query
            (:func:`check_durations`); a checkpoint that cannot be read or drive the scenarios
            (:class:`~testbed.agent.npolicy.ObservationSizeError`'s message, ...); with the causal
            planner, a scenario whose clusters batch.
        RunFailure: before any run, ``evaluation.out_dir`` cannot be written (exit code 3,
            :func:`check_out_dirs`); after the static runs, no query on any tuning seed (exit 5).
        FileNotFoundError: the checkpoint is missing (without ``headroom_only``), before any run.
    """
    if cfg.evaluation is None:
        raise ValueError(f"ASET config {cfg.name!r}: an 'evaluation:' section is required for testbed evaluate")
    ev = cfg.evaluation
    su = _prepare(cfg, base, duration_s, headroom_only, specialised, causal_samples)
    scenarios, names, dur, causal = su.scenarios, su.names, su.dur, su.causal
    actions = list(aset_actions(cfg))
    tune = list(range(1, (seeds or ev.seeds) + 1))
    fresh = list(range(ev.fresh_from, ev.fresh_from + (ev.fresh_seeds if fresh_seeds is None else fresh_seeds)))
    bar = progress_bar(console, _n_jobs(ev, su, len(tune), len(fresh), agreement_check)) if progress else None
    code_fingerprint.cache_clear()  # read again by every evaluation: profiles re-measured in between count
    inputs_fingerprint.cache_clear()

    def warn(msg: str) -> None:
        if console is not None:
            console.print(f"warning: {msg}", markup=False, highlight=False)
        else:
            _warn(msg)

    def run(fn, tasks):
        return _parallel(fn, tasks, backend, workers, ray_address, bar, su.cache, warn)

    try:
        st, mixes = _statics_and_mix(scenarios, names, tune, actions, dur, run, "tuning")
        best = {s: max(st["means"][s], key=lambda p: (st["means"][s][p], p)) for s in scenarios}
        sets = _SeedSets(ev, scenarios, names, actions, dur, run, mixes, best, causal, su.ckpts, runs=st["runs"])
        for kind, ks in (("tuning", tune), ("fresh", fresh)):
            if ks:
                sets.evaluate(kind, ks)
        agree = _agreement(run, scenarios, actions, dur) if agreement_check else {}
    finally:
        if bar is not None:
            bar[0].stop()
    table = summarise(sets.runs, actions)
    su.out.mkdir(parents=True, exist_ok=True)
    named_mixes = {names[s]: m for s, m in mixes.items()}
    settings = {"samples": causal, "min_t": ev.causal_min_t, "horizon_windows": ev.oracle_horizon} if causal else None
    write_results(su.out, sets.runs, table, actions, named_mixes, sets.schedules, agree, sets.causal_schedules,
                  settings)
    return EvalResult(su.out, sets.runs, table, named_mixes, agree)


def _n_jobs(ev: EvaluationSpec, su: _Setup, n_tune: int, n_fresh: int, agreement_check: bool) -> int:
    """The jobs of an evaluation, for its progress bar: per scenario and seed the statics, the mix
    (and ASET); the oracle (and the causal planner) on the oracle's seeds; the mix's choice and the
    agreement once per scenario."""
    n_or = (n_tune if ev.oracle_seeds is None else min(n_tune, ev.oracle_seeds)) + \
        (n_fresh if ev.oracle_fresh_seeds is None else min(n_fresh, ev.oracle_fresh_seeds))
    per_seed = 2 + int(su.ckpts is not None)
    return len(su.scenarios) * ((n_tune + n_fresh) * per_seed + n_or * (1 + int(su.causal > 0)) + 1
                                + int(agreement_check))


def _check_checkpoints(ckpts: dict[str, Path], specialised: bool, observation: ObservationSpec) -> dict[str, float]:
    """Every scenario's checkpoint exists, can drive it, and was trained with the config's
    ``observation`` (:func:`evaluate`'s Raises; the checkpoint's own is what runs, so a config that
    says otherwise would be evaluated as something it is not). Returns each scenario's ASET decision
    window (s: the checkpoint's ``observation.window``)."""
    windows = {}
    for s, ckpt in ckpts.items():
        for path in policy_files(ckpt):
            if not path.is_file():
                how = "testbed train --specialise" if specialised else "testbed train"
                raise FileNotFoundError(f"checkpoint {path} is missing (run {how} first, "
                                        f"or testbed evaluate --headroom)")
        try:
            spec = check_checkpoint(ckpt, [s]).obs_spec
        except ValueError as exc:  # the checkpoint does not fit the scenario: bad input, no traceback
            raise InputError(str(exc)) from None
        mine, theirs = observation.model_dump(), spec.model_dump()
        differ = [f"{k} {theirs.get(k)!r} there, {v!r} in the config" for k, v in mine.items() if theirs.get(k) != v]
        if differ:
            raise InputError(f"checkpoint {ckpt} was trained with another observation than the config's "
                             f"({'; '.join(differ)}): the checkpoint's would run; set the config's observation to "
                             f"it, or evaluate the checkpoint with the config it was trained with")
        windows[s] = spec.window_ms / 1e3
    return windows


@dataclass
class _SeedSets:
    """Steps 3-5 of the module docstring on one seed set at a time, with the mix and the best
    static policy chosen on the tuning seeds; rows go to ``runs``, schedules to ``schedules`` /
    ``causal_schedules`` (scenario name -> ``"<kind>-<seed>"`` -> schedule). ``ckpts`` None: no ASET."""

    ev: EvaluationSpec
    scenarios: list[str]
    names: dict[str, str]
    actions: list[str]
    dur: float | None
    run: Callable
    mixes: dict[str, list[str]]
    best: dict[str, str]
    causal: int
    ckpts: dict[str, Path] | None
    runs: list[dict] = field(default_factory=list)
    schedules: dict[str, dict] = field(default_factory=dict)
    causal_schedules: dict[str, dict] = field(default_factory=dict)

    def evaluate(self, kind: str, ks: list[int]) -> None:
        scenarios, names, dur = self.scenarios, self.names, self.dur
        if kind == "fresh":  # the tuning seeds' statics ran with the choice of the mix
            res = self.run(static_job, [(s, k, self.actions, dur) for s in scenarios for k in ks])
            for (s, k), r in zip([(s, k) for s in scenarios for k in ks], res, strict=True):
                self.runs += [_row(names[s], kind, p, k, ok, n) for p, (ok, n) in r.items()]
        pairs = [(s, k) for s in scenarios for k in ks]
        mres = self.run(assignment_job, [(s, k, self.mixes[s], dur) for s, k in pairs])
        self.runs += [_row(names[s], kind, MIX, k, ok, n, assignment=",".join(self.mixes[s]))
                      for (s, k), (ok, n) in zip(pairs, mres, strict=True)]
        n_oracle = self.ev.oracle_seeds if kind == "tuning" else self.ev.oracle_fresh_seeds
        opairs = [(s, k) for s in scenarios for k in (ks if n_oracle is None else ks[:n_oracle])]
        self._oracle(kind, opairs)
        if self.causal:
            self._causal(kind, opairs)
        if self.ckpts is not None:
            ares = self.run(aset_job, [(s, k, str(self.ckpts[s]), dur) for s, k in pairs])
            self.runs += [_row(names[s], kind, ASET, k, a["ok"], a["n"], share=a["share"])
                          for (s, k), a in zip(pairs, ares, strict=True)]

    def _oracle(self, kind: str, opairs: list[tuple[str, int]]) -> None:
        ores = self.run(oracle_job, [(s, k, [self.mixes[s], [self.best[s]] * len(self.mixes[s])], self.actions,
                                      self.dur, self.ev.oracle_horizon) for s, k in opairs])
        for (s, k), o in zip(opairs, ores, strict=True):
            self.runs.append(_row(self.names[s], kind, ORACLE, k, o["ok"], o["n"], fallback=o["fallback"]))
            self.schedules.setdefault(self.names[s], {})[f"{kind}-{k}"] = o["schedule"]

    def _causal(self, kind: str, opairs: list[tuple[str, int]]) -> None:
        cres = self.run(causal_job, [(s, k, self.mixes[s], self.actions, self.causal, self.dur,
                                      self.ev.oracle_horizon, self.ev.causal_min_t) for s, k in opairs])
        for (s, k), c in zip(opairs, cres, strict=True):
            self.runs.append(_row(self.names[s], kind, CAUSAL, k, c["ok"], c["n"], deviations=c["deviations"]))
            self.causal_schedules.setdefault(self.names[s], {})[f"{kind}-{k}"] = c["schedule"]


def _agreement(run: Callable, scenarios: Sequence[str], actions: Sequence[str],
               dur: float | None) -> dict[str, list[int]]:
    """The actions' pairwise decision agreement summed over the scenarios (seed 1):
    ``{"a|b": [same, states]}`` (:func:`agreement_job`)."""
    agree: dict[str, list[int]] = {}
    for counts in run(agreement_job, [(s, 1, actions, dur) for s in scenarios]):
        for key, (same, tot) in counts.items():
            a = agree.setdefault(key, [0, 0])
            a[0] += same
            a[1] += tot
    return agree


def _check_causal(exps: dict[str, Experiment], samples: int, min_t: float) -> None:
    """Refuse, before any run, a planner setting or a scenario the causal planner cannot run.

    Raises:
        InputError: one sampled future with a t rule (``min_t`` > 0); a cluster of a scenario
            batches (``server.max_batch`` > 1), naming both.
    """
    if samples < 2 and min_t > 0:
        raise InputError(f"--causal {samples} (evaluation.causal_samples) with evaluation.causal_min_t {min_t:g}: a "
                         f"t statistic needs at least 2 sampled futures (one has no spread: any gain would pass); "
                         f"use --causal 2 or more, or causal_min_t: 0")
    for s, exp in exps.items():
        batching = [c.name for c in exp.clusters if c.server.max_batch > 1]
        if batching:
            raise InputError(f"{s}: cluster(s) {', '.join(batching)} batch (server.max_batch > 1); the causal "
                             f"planner cannot redraw a batching cluster's future: run without --causal "
                             f"(evaluation.causal_samples: 0)")


def progress_bar(console, total: int, label: str = "evaluate"):
    """A started rich progress bar of ``total`` jobs and its task: ``(bar, task)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console)
    task = bar.add_task("eval", total=total)
    bar.start()
    return bar, task
