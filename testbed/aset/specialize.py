"""Specialize ASET for one experiment within a time budget (``testbed specialize``).

The result is a checkpoint of kind ``gated`` (:mod:`testbed.agent.gate`) with ``sources`` set: a **plan**
(one static policy per source) and an ensemble that corrects it, which leaves the plan only when
the ensemble's lower bound of the gain beats the margin. Four steps, all in the simulator, all on
seeds apart from those an evaluation scores (:data:`TUNING_SEED_BASE`; the checkpoint records them):

1. **The plan: the per-source static mix over every built-in policy** on ``tuning_seeds`` seeds
   (common random numbers: seed k gives every assignment the same arrivals). Every static policy
   first; from the best one, coordinate ascent (:func:`testbed.aset.headroom.best_mix`'s search,
   with a test): for each source in turn every other policy is tried with the others fixed, and the
   best candidate replaces the source's policy only when its mean paired gain over the seeds is
   positive with a one-sided t of at least ``accept_t`` (:func:`testbed.aset.headroom.paired_gain_t`;
   0 by default: any positive mean), until a whole pass changes nothing or the step's share of the
   budget is spent. The ascent can restart (:func:`plan_starts`: from the few best static policies,
   in other orders of the sources); the end point with the highest tuning mean is the plan.
2. **Labels from rollouts** (AggreVaTe, Ross and Bagnell, "Reinforcement and imitation learning via
   interactive no-regret learning", 2014) on **variants** of the experiment (:func:`variant`:
   event times, rates and report interval redrawn). In each data episode, every
   ``probe_every``-th window one source is probed: for every policy a, a clone of the simulator
   (:meth:`testbed.aset.episode.Episode.clone` continues exactly) runs that window with the source on
   a and the others as the episode runs them, then the plan for ``horizon - 1`` windows, over
   ``futures`` futures drawn afresh at the window's start (:meth:`testbed.sim.Simulator.reseed`,
   the same draws for every a); the label of a is the team's success gain over the plan's policy,
   in points. Not the argmax of a clairvoyant oracle: the value of each action from the state, on
   futures the state does not know.
3. **DAgger rounds** (Ross, Gordon and Bagnell, AISTATS 2011): round 0's episodes follow the plan
   (leaving it in ``explore`` of the decisions); each later round's follow the gated learner fitted
   on every label so far, so the states labelled are those the learner's own policy visits. Half
   of a later round's episodes re-use the variants of the previous round where the learner
   trailed the plan most (paired, same variant and seed), on new seeds: oversampling where the
   agent trails the baseline (Genet, Xia et al., SIGCOMM 2022).
4. **The ensemble and the check**: ``members`` scorers (:func:`testbed.aset.general.fit`), each on a
   bootstrap resample of the episodes (its out-of-bag episodes choose its epoch), gated at
   ``margin`` (chosen on the validation set, :data:`DEFAULT_MARGIN`). Then the gated agent and
   the plan run on ``check_seeds`` further tuning seeds of the experiment itself; where the agent is
   not above the plan there, the corrections are switched off (margin :data:`OFF_MARGIN`): the
   checkpoint then is the plan. Precomputing per-state choices offline and switching online is
   what Oboe (Akhtar et al., SIGCOMM 2018) found to beat a learned policy; the plan is that
   offline choice, the corrections its online switch.

**Budget and determinism.** The work is planned from the budget before anything runs, with
nominal costs (:class:`Costs`: seconds per static episode from its query count, per clone, per
featurized window, measured on the 2-core build machines; the planned CPU time is the budget times
the workers), so the same experiment, budget, seed and number of workers give the same work and
the same checkpoint, however busy the machine. A wall-clock guard
stops a step at its share of the budget on a slower machine; the checkpoint then says
``truncated`` (the only case in which a rerun may differ; ``Settings.wall_guard`` False turns
the guard off). With ``clock="cpu"`` (``--clock cpu``) the guard counts the CPU seconds of the
command and its workers over the number of workers instead: on a machine shared with other jobs,
the budget then buys the work it would on idle cores (the report gives wall and CPU time).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from testbed.agent.gate import Z_95, GatedPolicy, export_gated, input_width, member_inputs, set_margin
from testbed.aset.episode import run_static, window_of
from testbed.aset.general import GeneralRun, fit, init_weights
from testbed.aset.headroom import continuation_counts, paired_gain_t
from testbed.aset.jobs import agent_job
from testbed.core.distributed import imap_unordered
from testbed.core.errors import InputError
from testbed.model.policies import CATALOGUE
from testbed.plan.build import Plan, build_plan, plan_experiment
from testbed.spec.aset import ObservationSpec
from testbed.spec.experiment import AsetSpec, Experiment

#: Tuning seeds are ``TUNING_SEED_BASE + 1000 * seed + k``: far above the evaluation seeds (``testbed
#: evaluate``'s 101-120).
TUNING_SEED_BASE = 1_000_000
#: The margin (points) of a specialized checkpoint's gate unless ``--margin`` says otherwise: chosen
#: on the validation set (experiments/generated/validation, all 12 specialized at 180 CPU-s, seeds
#: 1-6) by ``python -m testbed.aset.gate_margin`` (benchmarks/results/aset-gate-margin.json): 0 was
#: more than 0.25 point below the plan on one scenario (not admissible); 0.5 gained +0.15 on
#: average, 0.25 +0.10, 1 to 4 +0.11 to +0.12 (one scenario moves at any margin: within the noise).
DEFAULT_MARGIN = 0.5
#: The margin of a checkpoint whose corrections the final check switched off (never deviates).
OFF_MARGIN = 1e6
#: The margins (points) the final check measures, so that a margin chosen later on the validation set
#: can be applied with the check's verdict at it (:func:`margin_after_check`).
CHECK_MARGINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Costs:
    """Nominal CPU seconds of the work units (one core of the build machine, measured on generated
    scenarios of 2-8 sources, 240-4400 queries per 30 s): a static episode ``static_s +
    per_query_s x queries``; a featurized window per source ``feature_s``; one clone-and-continue
    ``clone_s + continuation_share x`` a static episode; a member's fit ``fit_row_s`` per
    (sample x policy) and epoch."""

    static_s: float = 0.06
    per_query_s: float = 0.08e-3
    feature_s: float = 4e-3
    clone_s: float = 5e-3
    continuation_share: float = 0.06
    fit_row_s: float = 4e-6


@dataclass(frozen=True)
class Settings:
    """What :func:`specialize` does (module docstring); the defaults are ``testbed specialize``'s."""

    tuning_seeds: int = 8
    #: Chosen on the validation set (``benchmarks/ascent_rule.py``, docs/history.md): against 1.64,
    #: 0 changed the plan in 9 of 12 experiments, +0.36 points on average on evaluation seeds, above
    #: beyond the CI in 2 (Holm) and below in none; ``best_passing`` changed none.
    accept_t: float = 0.0
    ascent: str = "best_mean"
    #: Restarts of the ascent (:func:`plan_starts`): from each of the ``start_statics`` best static
    #: policies, with the sources visited in ``orders`` orders (the first as listed, the others
    #: permuted per seed); the end point with the highest tuning mean is the plan. Chosen on the
    #: validation set (``benchmarks/ascent_rule.py``, docs/results.md): against one start, 3 orders
    #: changed the plan in 5 of 12 experiments, +0.44 points on average on evaluation seeds, above
    #: beyond the CI in 1 (Holm) and below in none; 3 static starts +0.03.
    start_statics: int = 1
    orders: int = 3
    mix_share: float = 0.3
    probe_every: int = 2
    horizon: int = 2
    futures: int = 2
    rounds: int = 3
    explore: float = 0.15
    learner_explore: float = 0.05
    oversample: float = 0.5
    members: int = 5
    hidden: tuple[int, ...] = (32, 32)
    epochs: int = 40
    batch: int = 128
    learning_rate: float = 1e-3
    huber_delta: float = 1.0
    margin: float = DEFAULT_MARGIN
    z: float = Z_95
    learner_margin: float = 0.5
    check_seeds: int = 5
    min_episodes: int = 2
    wall_guard: bool = True
    clock: str = "wall"
    check_margins: tuple[float, ...] = CHECK_MARGINS
    costs: Costs = field(default_factory=Costs)


# -- variants and plans in worker processes -------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _plan(exp_json: str, base_dir: str) -> Plan:
    return build_plan(Experiment.model_validate_json(exp_json), base_dir=Path(base_dir))


def variant(exp: Experiment, rng: np.random.Generator) -> Experiment:
    """A variant of ``exp`` for the correction's data: the events' times (and a ``step`` process's
    change times) moved by one offset of up to 15 % of the duration and stretched by 0.8-1.25
    around the first (order kept, within [0, 0.95 x duration)); every rate scaled by one factor of
    0.8-1.2 times a per-entry log-normal factor (sigma 0.1); with probability 0.3 the report interval
    halved (fresher reports: the staleness redrawn) where the decision window stays a whole number
    of report intervals."""
    d = float(exp.duration_s)
    times = [float(e.at_s) for e in exp.events] + [float(st.at_s) for w in exp.workload for st in (w.steps or ())
                                                   if st.at_s > 0]
    t0 = min(times) if times else 0.0
    shift, stretch = float(rng.uniform(-0.15, 0.15)) * d, float(rng.uniform(0.8, 1.25))

    def moved(t: float) -> float:
        return float(min(max(t0 + shift + stretch * (t - t0), 0.0), 0.95 * d))

    events = [e.model_copy(update={"at_s": moved(float(e.at_s))}) for e in exp.events]
    g = float(rng.uniform(0.8, 1.2))
    workload = []
    for w in exp.workload:
        f = g * float(np.exp(rng.normal(0.0, 0.1)))
        upd: dict = {}
        if w.rate_qps is not None:
            upd["rate_qps"] = float(w.rate_qps) * f
        if w.rates_qps is not None:
            upd["rates_qps"] = [float(r) * f for r in w.rates_qps]
        if w.steps is not None:
            upd["steps"] = [st.model_copy(update={"rate_qps": float(st.rate_qps) * f,
                                                  "at_s": moved(float(st.at_s)) if st.at_s > 0 else 0.0})
                            for st in w.steps]
        workload.append(w.model_copy(update=upd))
    r = float(exp.report_interval_s)
    half = rng.random() < 0.3 and r / 2 >= 0.01
    return exp.model_copy(update={"events": events, "workload": workload,
                                  "report_interval_s": r / 2 if half else r})


def static_job(exp_json: str, base_dir: str, seed: int, assignment: list[str]) -> tuple[int, int]:
    """(successes, queries) of one episode with a constant policy per source (sorted order)."""
    ep = run_static(_plan(exp_json, base_dir), seed, assignment)
    return int(ep.ok.sum()), int(ep.n.sum())


def _ratio(c: Sequence[int]) -> float:
    return c[0] / c[1] if c[1] else math.nan


def episode_job(exp_json: str, base_dir: str, seed: int, plan: list[str], learner: dict | None,
                settings_json: str, window_s: float) -> dict:
    """One data episode (module docstring, steps 2-3) on the variant ``exp_json``: ``x`` (samples,
    policies, width) member inputs, ``y`` (samples, policies) gains over the plan's policy in points,
    the episode's success ratio as run (``agent``) and the plan's on the same variant and seed
    (``plan``, rounds with a learner only), ``wall_s``."""
    t0 = time.perf_counter()
    s = _settings(settings_json)
    p = _plan(exp_json, base_dir)
    policies = tuple(CATALOGUE)
    spec = ObservationSpec(window=f"{window_s * 1e3:g}ms")
    run = GeneralRun(p, seed, policies, spec)
    srcs = run.ep.sources
    n_src, n_pol = len(srcs), len(policies)
    ref = [policies.index(a) for a in plan]
    run.current = list(plan)
    run.ep.set_policies(run.current)
    actors = None
    if learner is not None:
        gated = GatedPolicy.from_members(learner["members"], policies, spec, dict(zip(srcs, plan, strict=True)),
                                         sources=srcs, margin=learner["margin"], z=s.z)
        actors = [gated.for_source(x) for x in srcs]
    eps = s.learner_explore if learner is not None else s.explore
    rng = np.random.default_rng([seed, 3701])
    xs, ys = [], []
    # a batching cluster cannot be reseeded: the labels then use the seed's own future (one each)
    futures = 0 if any(c.queue.max_batch > 1 for c in run.ep.sim.clusters) else s.futures
    while not run.done:
        feats = run.observe()
        acts = [policies[a.act(*f)] for a, f in zip(actors, feats, strict=True)] if actors else list(plan)
        acts = [policies[int(rng.integers(n_pol))] if rng.random() < eps else a for a in acts]
        w = run.ep.w
        if w % s.probe_every == 0:
            i = int(rng.integers(n_src))
            ok, n = np.zeros(n_pol), 0
            for k in range(max(futures, 1)):
                for a, name in enumerate(policies):
                    o, q = continuation_counts(run.ep, w, s.horizon, plan, acts[:i] + [name] + acts[i + 1:],
                                               resample=(w, k, 37) if futures else None)
                    ok[a] += o
                    n += q if a == 0 else 0
            if n > 0:
                xs.append(member_inputs(*feats[i], i, n_src, ref[i]))
                ys.append(100.0 * (ok - ok[ref[i]]) / n)
        run.step(acts)
    run.ep.finish()
    out = {"x": np.asarray(xs, np.float32).reshape(-1, n_pol, xs[0].shape[-1] if xs else 1),
           "y": np.asarray(ys, np.float32).reshape(-1, n_pol), "agent": run.ep.success_ratio, "plan": math.nan}
    if learner is not None:
        out["plan"] = _ratio(static_job(exp_json, base_dir, seed, list(plan)))
    out["wall_s"] = time.perf_counter() - t0
    return out


def gated_job(scenario: str, seed: int, checkpoint: str) -> tuple[int, int]:
    """(successes, queries) of the gated checkpoint at ``checkpoint`` driving every source of the
    experiment file ``scenario`` on one seed: the one loop of every agent
    (:func:`testbed.aset.jobs.agent_job`, ``testbed simulate``'s and ``testbed evaluate``'s)."""
    r = agent_job(scenario, seed, AsetSpec(checkpoint=checkpoint).model_dump_json(), None)
    return r["ok"], r["n"]


@functools.lru_cache(maxsize=8)
def _settings(js: str) -> Settings:
    d = json.loads(js)
    d["costs"] = Costs(**d["costs"])
    d["hidden"] = tuple(d["hidden"])
    d["check_margins"] = tuple(d["check_margins"])
    return Settings(**d)


# -- the orchestration ------------------------------------------------------------------------------

@dataclass
class Report:
    """What :func:`specialize` did (written into the checkpoint's ``provenance``)."""

    experiment: str
    budget_s: float
    seed: int
    tuning_seeds: list[int]
    check_seeds: list[int]
    statics: dict[str, float] = field(default_factory=dict)
    best_static: str = ""
    mix: list[str] = field(default_factory=list)
    mix_ratio: float = math.nan
    mix_moves: list[dict] = field(default_factory=list)
    mix_candidates: int = 0
    mix_starts: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    samples: int = 0
    check: dict = field(default_factory=dict)
    corrections: bool = True
    truncated: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    clock: str = "wall"
    phases_s: dict[str, float] = field(default_factory=dict)


class Clock:
    """The budget's clock, in seconds since the start: ``wall`` (monotonic wall time) or ``cpu``
    (CPU seconds of this process and its workers, live or finished, divided by ``workers``: the
    wall time the work would take on ``workers`` idle cores, for a machine shared with other jobs)."""

    def __init__(self, kind: str, workers: int):
        if kind not in ("wall", "cpu"):
            raise InputError(f"clock {kind!r}: wall or cpu")
        self.kind, self.workers = kind, workers
        self.t0 = 0.0
        self.t0 = self.now()

    def now(self) -> float:
        if self.kind == "wall":
            return time.monotonic() - self.t0
        return _tree_cpu_s() / self.workers - self.t0


class TaskRunner:
    """Tasks in parallel (:func:`testbed.core.distributed.imap_unordered`, ``workers`` processes),
    results in task order, each finished task ticking ``progress(what, done, total, status)``.

    ``map`` raises ``_OverBudget`` (carrying the results so far) when ``guard`` is on and ``clock``
    has passed ``deadline`` (s) before every task is done; the plan search and the benchmarks
    that compare its rules (``benchmarks/ascent_rule.py``, ``guard=False``) share it."""

    def __init__(self, workers: int, progress: Callable[[str, int, int, str], None] | None, guard: bool = True,
                 clock: Clock | None = None):
        self.workers, self.progress, self.guard = workers, progress or (lambda *_: None), guard
        self.clock = clock or Clock("wall", workers)

    def map(self, fn, tasks: list[tuple], what: str, deadline: float | None = None, status: str = "") -> list:
        out: list = [None] * len(tasks)
        self.progress(what, 0, len(tasks), status)
        done = 0
        for i, r in imap_unordered(fn, tasks, jobs=self.workers):
            out[i] = r
            done += 1
            self.progress(what, done, len(tasks), status)
            if self.guard and deadline is not None and self.clock.now() > deadline and done < len(tasks):
                raise _OverBudget(out)
        return out


class _OverBudget(Exception):
    def __init__(self, partial: list):
        super().__init__("over budget")
        self.partial = partial


def tuning_seeds(seed: int, n: int, offset: int = 0) -> list[int]:
    """The ``n`` tuning seeds of specialization seed ``seed`` (``offset`` 500: the check's)."""
    return [TUNING_SEED_BASE + 1000 * int(seed) + offset + k for k in range(1, n + 1)]


def specialize(path: str | Path, out: str | Path, *, budget_s: float, seed: int = 1, workers: int = 2,
               settings: Settings | None = None,
               progress: Callable[[str, int, int, str], None] | None = None) -> Report:
    """Specialize (module docstring) the experiment at ``path``; write the checkpoint ``out``
    (``out.npz``, ``out.json``) and return the :class:`Report`.

    Raises:
        InputError: a budget under 10 s, an experiment that does not plan (naming it), or one whose
            report interval does not divide a decision window (the window is the report interval, at
            least 500 ms: the general features' window).
    """
    s = settings or Settings()
    if budget_s < 10:
        raise InputError(f"--budget {budget_s:g} s: at least 10 s")
    t_start, cpu_start = time.monotonic(), _cpu_s()
    clock = Clock(s.clock, workers)
    deadline = budget_s
    path = Path(path)
    plan = plan_experiment(path)
    exp = plan.experiment
    r = float(exp.report_interval_s)
    window_s = r * max(1, round(0.5 / r))
    window_of(plan, window_s)
    exp_json, base_dir = exp.model_dump_json(), str(plan.base_dir)
    srcs = sorted(h.name for h in plan.sources)
    pols = list(CATALOGUE)
    rep = Report(str(path), budget_s, seed, tuning_seeds(seed, s.tuning_seeds), tuning_seeds(seed, s.check_seeds, 500))
    runner = TaskRunner(workers, progress, s.wall_guard, clock)
    capacity = budget_s * workers * 0.8  # nominal CPU seconds planned; the rest is slack for a busy machine

    # 1. the plan: statics, then the paired coordinate ascent
    t = time.monotonic()
    c_static = search_plan(runner, exp_json, base_dir, srcs, rep, s, capacity, budget_s * max(s.mix_share, 0.05) * 1.6)
    rep.phases_s["plan"] = round(time.monotonic() - t, 1)

    # 2-3. labels on variants, DAgger rounds
    t = time.monotonic()
    n_win = max(1, int(round(float(exp.duration_s) / window_s)))
    probes = n_win / s.probe_every
    c_episode = (c_static + n_win * len(srcs) * s.costs.feature_s
                 + probes * len(pols) * max(1, s.futures) * (s.costs.clone_s + s.costs.continuation_share * c_static))
    n_check = 2 * s.check_seeds * (c_static + n_win * len(srcs) * s.costs.feature_s)
    planned = c_static * s.tuning_seeds * (len(pols) + rep.mix_candidates)  # step 1's nominal CPU s, not its clock
    left = capacity - planned - n_check
    per_round = max(s.min_episodes, int(left * 0.9 / (c_episode * s.rounds)))
    data_deadline = deadline - (n_check / workers) / 0.8 - 5
    members, episodes = _dagger(runner, exp, exp_json, base_dir, rep, srcs, s, per_round, window_s, seed,
                                data_deadline)
    rep.phases_s["data"] = round(time.monotonic() - t, 1)

    # 4. the check on further tuning seeds of the experiment itself
    t = time.monotonic()
    margin = s.margin
    if members is None:
        rep.corrections, margin = False, OFF_MARGIN
        rep.check = {"skipped": "no labelled state"}
    else:
        margin = _check(runner, path, Path(out), exp_json, base_dir, rep, members, srcs, s, window_s, deadline)
    rep.phases_s["check"] = round(time.monotonic() - t, 1)
    if members is None:
        members = _null_members(len(srcs), s)
    rep.wall_s = round(time.monotonic() - t_start, 1)
    rep.clock = s.clock
    rep.cpu_s = round(_cpu_s() - cpu_start, 1)
    meta = asdict(rep) | {"settings": asdict(s), "workers": workers, "window_s": window_s, "file_sha256": _sha256(path),
                          "episodes": episodes, "kind": "specialized"}
    export_gated(members, out, policies=pols, obs_spec=ObservationSpec(window=f"{window_s * 1e3:g}ms"),
                 reference=dict(zip(srcs, rep.mix, strict=True)), sources=srcs, margin=margin, z=s.z, provenance=meta)
    return rep


def search_plan(runner: TaskRunner, exp_json: str, base_dir: str, srcs: list[str], rep: Report, s: Settings,
                capacity: float, deadline: float | None,
                seen: dict[tuple[str, ...], np.ndarray] | None = None) -> float:
    """Step 1 (module docstring): every built-in policy alone on ``rep.tuning_seeds``, then the ascent
    (:func:`_ascent`) from each of :func:`plan_starts`, all within ``s.mix_share`` of ``capacity``
    (nominal CPU s; inf: no bound) and the ``deadline`` (s on the runner's clock; None: none); a
    start cut by either ends the search. Fills ``rep``'s ``statics``, ``best_static``, ``mix`` and
    ``mix_ratio`` (the start of the highest tuning mean), ``mix_starts`` and the ascent's record;
    ``seen`` as :func:`_ascent`'s (None: a fresh cache). Returns the nominal CPU seconds of one
    static episode (:class:`Costs`)."""
    pols = list(CATALOGUE)
    n = s.tuning_seeds
    counts = runner.map(static_job, [(exp_json, base_dir, k, [p] * len(srcs)) for p in pols for k in rep.tuning_seeds],
                        "static policies on the tuning seeds")
    per = {p: np.array([_ratio(c) for c in counts[i * n:(i + 1) * n]]) for i, p in enumerate(pols)}
    queries = float(np.mean([c[1] for c in counts[:n]]))
    c_static = s.costs.static_s + s.costs.per_query_s * queries
    rep.statics = {p: float(np.nanmean(v)) for p, v in per.items()}
    rep.best_static = max(pols, key=lambda p: (rep.statics[p], -pols.index(p)))
    max_cands = int(s.mix_share * capacity / (c_static * n)) if math.isfinite(capacity) else sys.maxsize
    seen = {} if seen is None else seen
    seen.update({tuple([p] * len(srcs)): v for p, v in per.items()})
    best_vals = None
    for j, (start, order) in enumerate(plan_starts(pols, rep.statics, len(srcs), s, rep.seed)):
        mix, vals, cut = _ascent(runner, exp_json, base_dir, srcs, pols, rep, start, order, j, s, max_cands,
                                 deadline, seen)
        rep.mix_starts.append({"start": start, "order": [srcs[i] for i in order],
                               "mix": mix, "ratio": float(np.nanmean(vals))})
        if best_vals is None or 100 * (np.nanmean(vals) - np.nanmean(best_vals)) > MIN_GAIN_POINTS:
            rep.mix, best_vals = mix, vals
        if cut:
            break
    rep.mix_ratio = float(np.nanmean(best_vals))
    return c_static


def plan_starts(pols: list[str], statics: dict[str, float], n_sources: int, s: Settings,
                seed: int) -> list[tuple[str, list[int]]]:
    """The ascent's starts: (static policy, order of the source indices) for each of the
    ``s.start_statics`` best static policies (``statics``: mean tuning success ratio; ties go to
    the catalogue's order ``pols``), each with ``s.orders`` distinct orders (fewer when the sources
    have fewer: ``n_sources!``): the sources as listed first, then permutations drawn from
    ``numpy.random.default_rng([seed, j])`` (j = 1, 2, ...), a draw equal to an earlier order
    skipped, the same for every start policy. Deterministic per ``seed``."""
    ranked = sorted(pols, key=lambda p: (-statics[p], pols.index(p)))[:max(1, s.start_statics)]
    want = min(max(1, s.orders), math.factorial(n_sources))
    orders, j = [list(range(n_sources))], 1
    while len(orders) < want:
        order = [int(i) for i in np.random.default_rng([seed, j]).permutation(n_sources)]
        if order not in orders:
            orders.append(order)
        j += 1
    return [(p, o) for p in ranked for o in orders]


def _ascent(runner: TaskRunner, exp_json: str, base_dir: str, srcs: list[str], pols: list[str], rep: Report,
            start: str, order: list[int], start_no: int, s: Settings, max_cands: int, deadline: float | None,
            seen: dict[tuple[str, ...], np.ndarray]) -> tuple[list[str], np.ndarray, bool]:
    """The paired coordinate ascent of step 1 from ``start`` on every source, visiting the sources in
    ``order`` (indices into ``srcs``) and moving as ``s.ascent`` says (:func:`ascent_move`); returns
    (mix, its per-seed success ratios, True when the budget or the guard cut it, as ``rep.truncated``
    then says). ``seen``: candidates' per-seed success ratios already run (kept up to date; it holds
    every static policy's); ``max_cands``: candidates run over all starts (``rep.mix_candidates``) at
    most. Moves go to ``rep.mix_moves`` with their ``start_no``."""
    cur = [start] * len(srcs)
    vals = seen[tuple(cur)]
    improved, n = True, s.tuning_seeds
    while improved:
        improved = False
        for i in order:
            cands = [tuple(cur[:i] + [a] + cur[i + 1:]) for a in pols if a != cur[i]]
            todo = [c for c in cands if c not in seen]
            if rep.mix_candidates + len(todo) > max_cands:
                rep.truncated.append(f"mix: the budget's {max_cands} candidates spent, start {start_no + 1} stopped "
                                     f"at source {srcs[i]}")
                return cur, vals, True
            if todo:
                tasks = [(exp_json, base_dir, k, list(c)) for c in todo for k in rep.tuning_seeds]
                try:
                    res = runner.map(static_job, tasks, f"mix: start {start_no + 1}, source {srcs[i]}", deadline,
                                     status=f"mix {100 * np.nanmean(vals):.2f} %")
                except _OverBudget:
                    rep.truncated.append(f"mix: stopped by the wall-clock guard, start {start_no + 1} at source "
                                         f"{srcs[i]}")
                    return cur, vals, True
                rep.mix_candidates += len(todo)
                seen.update({c: np.array([_ratio(x) for x in res[j * n:(j + 1) * n]]) for j, c in enumerate(todo)})
            move = ascent_move(cands, seen, vals, i, pols, s.accept_t, s.ascent)
            if move is not None:
                best, gain, t_stat = move
                rep.mix_moves.append({"start": start_no, "source": srcs[i], "from": cur[i], "to": best[i],
                                      "gain_points": round(gain, 3), "t": round(t_stat, 2)})
                cur, vals, improved = list(best), seen[best], True
    return cur, vals, False


#: How the ascent picks a source's move (:func:`ascent_move`).
ASCENT_RULES = ("best_mean", "best_passing")
#: A mean gain (points) at or below this is a tie, not a move: float rounding between mixes of the
#: same success could otherwise make the ascent go round a cycle of them for ever.
MIN_GAIN_POINTS = 1e-9


def ascent_move(cands: list[tuple[str, ...]], seen: dict[tuple[str, ...], np.ndarray], vals: np.ndarray, i: int,
                pols: list[str], accept_t: float, rule: str) -> tuple[tuple[str, ...], float, float] | None:
    """The ascent's move for source ``i``: (candidate, mean paired gain in points, one-sided t), or
    None for no move. ``seen[c]``: candidate ``c``'s success ratio per tuning seed (NaN: no query);
    ``vals``: the current mix's. A move needs a mean gain above :data:`MIN_GAIN_POINTS` with t >= ``accept_t``
    (:func:`testbed.aset.headroom.paired_gain_t`). ``rule`` ``best_mean``: the candidate with the
    highest mean is tested, and no move when it fails; ``best_passing``: the highest mean among the
    candidates that pass. Ties go to the catalogue's order (``pols``).

    Raises:
        InputError: an unknown ``rule`` (:data:`ASCENT_RULES`).
    """
    if rule not in ASCENT_RULES:
        raise InputError(f"ascent rule {rule!r}: one of {', '.join(ASCENT_RULES)}")

    def scored(c: tuple[str, ...]) -> tuple[float, float]:
        d = 100 * (seen[c] - vals)
        d = d[~np.isnan(d)]
        return (float(d.mean()), float(paired_gain_t(d))) if d.size else (-math.inf, -math.inf)

    order = sorted(cands, key=lambda c: (-float(np.nanmean(seen[c])), pols.index(c[i])))
    for c in order if rule == "best_passing" else order[:1]:
        gain, t_stat = scored(c)
        if gain > MIN_GAIN_POINTS and t_stat >= accept_t:
            return c, gain, t_stat
    return None


def _dagger(runner: TaskRunner, exp: Experiment, exp_json: str, base_dir: str, rep: Report, srcs: list[str],
            s: Settings, per_round: int, window_s: float, seed: int, deadline: float) -> tuple[list | None, int]:
    """Steps 2-3: ``s.rounds`` rounds of ``per_round`` episodes; returns (the last fit's members or
    None without data, episodes run)."""
    rng = np.random.default_rng([seed, 3702])
    data: list[dict] = []
    members, last = None, []
    settings_json = json.dumps(asdict(s))
    for rnd in range(s.rounds):
        docs: list[str] = []
        trailed = [e for e in last if np.isfinite(e["plan"])]  # the previous round ran the learner
        n_old = int(round(s.oversample * per_round)) if trailed else 0
        if n_old:  # Genet: the variants where the learner trailed the plan most, on new seeds
            gaps = np.array([e["plan"] - e["agent"] for e in trailed])
            order = np.argsort(-gaps, kind="stable")[:max(1, n_old // 2)]
            docs += [trailed[int(order[j % len(order)])]["doc"] for j in range(n_old)]
        docs += [variant(exp, rng).model_dump_json() for _ in range(per_round - len(docs))]
        learner = None if members is None else {"members": members, "margin": s.learner_margin}
        tasks = [(d, base_dir, int(rng.integers(1, 2**31 - 1)), list(rep.mix), learner, settings_json, window_s)
                 for d in docs]
        try:
            res = runner.map(episode_job, tasks, f"round {rnd + 1}/{s.rounds}: rollout labels", deadline,
                             status=f"{sum(len(e['x']) for e in data)} labels")
        except _OverBudget as ob:
            res = [r for r in ob.partial if r is not None]
            docs = [d for d, r in zip(docs, ob.partial, strict=True) if r is not None]
            rep.truncated.append(f"data: round {rnd + 1} stopped by the wall-clock guard after {len(res)} episodes")
        for d, r in zip(docs, res, strict=True):
            r["doc"] = d
        data += [r for r in res if len(r["x"])]
        last = res
        trail = [e["plan"] - e["agent"] for e in res if np.isfinite(e["plan"])]
        rep.rounds.append({"round": rnd + 1, "episodes": len(res), "labels": int(sum(len(e["x"]) for e in res)),
                           "oversampled": n_old, "learner": learner is not None,
                           "plan_minus_agent_points": round(100 * float(np.mean(trail)), 3) if trail else None})
        if data:
            members = _fit_members(data, s, seed)
        if rep.truncated and rep.truncated[-1].startswith("data"):
            break
    rep.samples = int(sum(len(e["x"]) for e in data))
    return members, sum(r["episodes"] for r in rep.rounds)


def _fit_members(data: list[dict], s: Settings, seed: int) -> list:
    """``s.members`` scorers, each on a bootstrap resample of the episodes, its epoch chosen on its
    out-of-bag episodes (on all of them when none is out of bag)."""
    def join(eps: list[dict]) -> dict:
        x = np.concatenate([e["x"] for e in eps])
        y = np.concatenate([e["y"] for e in eps])
        return {"x": x, "y": y, "ref": _ref_of(x)}

    members = []
    for b in range(s.members):
        pick = np.random.default_rng([seed, 3703, b, len(data)]).integers(0, len(data), len(data))
        oob = sorted(set(range(len(data))) - set(pick.tolist()))
        train = join([data[i] for i in pick])
        valid = join([data[i] for i in oob]) if oob else train
        res = fit(train, valid, hidden=list(s.hidden), seed=int(seed) * 100 + b, epochs=s.epochs, batch=s.batch,
                  lr=s.learning_rate, delta=s.huber_delta)
        members.append(res["weights"])
    return members


def _ref_of(x: np.ndarray) -> np.ndarray:
    """The reference (plan) row of each sample: the one whose last input column is 1."""
    return np.argmax(x[:, :, -1], axis=1).astype(np.int64)


def _null_members(n_sources: int, s: Settings) -> list:
    """Two all-zero scorers (no labelled state: every gain 0, the gate never leaves the plan)."""
    return [[np.zeros_like(w) for w in init_weights(list(s.hidden), 0, input_width(n_sources))] for _ in range(2)]


def _check(runner: TaskRunner, path: Path, out: Path, exp_json: str, base_dir: str, rep: Report, members: list,
           srcs: list[str], s: Settings, window_s: float, deadline: float) -> float:
    """Step 4's check: the gated agent at each margin of ``s.check_margins`` (and ``s.margin``)
    against the plan on the check seeds (paired), kept in ``rep.check`` (``by_margin``: margin ->
    mean agent - plan, points); returns the margin to ship: ``s.margin`` where the agent gated at it
    is above the plan, else :data:`OFF_MARGIN` (:func:`margin_after_check` applies the same rule to
    another margin later). Each margin's candidate is written as a checkpoint beside ``out``
    (``OUT.check/m<margin>``, removed after) and driven through the one agent loop (:func:`gated_job`)."""
    margins = sorted(set(s.check_margins) | {float(s.margin)})
    gated = GatedPolicy.from_members(members, tuple(CATALOGUE), ObservationSpec(window=f"{window_s * 1e3:g}ms"),
                                     dict(zip(srcs, rep.mix, strict=True)), sources=srcs, z=s.z)
    tmp = out.with_name(out.name + ".check")
    files = {m: str(gated.with_margin(m).export(tmp / f"m{m:g}")) for m in margins}
    tasks = [(str(path), k, files[m]) for m in margins for k in rep.check_seeds]
    late = deadline + 0.1 * rep.budget_s
    try:
        agent = runner.map(gated_job, tasks, "check: gated agent against the plan", late)
        plan = runner.map(static_job, [(exp_json, base_dir, k, list(rep.mix)) for k in rep.check_seeds],
                          "check: the plan", late)
    except _OverBudget:
        rep.truncated.append("check: stopped by the wall-clock guard; corrections off")
        rep.corrections = False
        return OFF_MARGIN
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = np.array([_ratio(c) for c in plan])
    n = len(rep.check_seeds)
    by_margin, per_seed = {}, {}
    for j, m in enumerate(margins):
        d = 100 * (np.array([_ratio(c) for c in agent[j * n:(j + 1) * n]]) - base)
        d = d[~np.isnan(d)]
        by_margin[str(m)] = round(float(d.mean()), 3) if d.size else 0.0
        per_seed[str(m)] = [round(float(x), 3) for x in d]
    rep.check = {"by_margin": by_margin, "per_seed": per_seed,
                 "agent_minus_plan_points": by_margin[str(float(s.margin))]}
    rep.corrections = by_margin[str(float(s.margin))] > 0
    return s.margin if rep.corrections else OFF_MARGIN


def margin_after_check(meta: dict, margin: float) -> float:
    """The margin a specialized checkpoint ships with when its gate's margin is ``margin``: the
    margin itself where its check found the agent gated at it above the plan (``provenance.check.by_margin``),
    else :data:`OFF_MARGIN`.

    Raises:
        ValueError: the check did not measure ``margin`` (one of :data:`CHECK_MARGINS`).
    """
    by = (meta.get("check") or {}).get("by_margin")
    if by is None:
        return OFF_MARGIN
    if str(float(margin)) not in by:
        raise ValueError(f"margin {margin:g}: the check measured {sorted(float(k) for k in by)}")
    return float(margin) if by[str(float(margin))] > 0 else OFF_MARGIN


def apply_margin(path: str | Path, margin: float, provenance: dict) -> float:
    """Give the specialized checkpoint at ``path`` the gate's ``margin`` with its check's verdict at
    it (:func:`margin_after_check`: the checkpoint ``specialize`` would have written with that
    margin, the rest being independent of it); returns the margin written.

    Raises:
        ValueError: not a specialized gated checkpoint, or a margin its check did not measure.
    """
    g = GatedPolicy(path)
    if not g.specialized:
        raise ValueError(f"{path}: not a specialized checkpoint")
    m = margin_after_check(g.provenance, margin)
    set_margin(path, m, provenance | {"asked": float(margin)})
    return m


def _tree_cpu_s() -> float:
    """CPU seconds of this process, its finished children and its live descendants (psutil)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in me.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.Error:
            pass
    return total


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


__all__ = ["CHECK_MARGINS", "DEFAULT_MARGIN", "OFF_MARGIN", "TUNING_SEED_BASE", "Costs", "Report", "Settings",
           "TaskRunner", "apply_margin", "episode_job", "gated_job", "margin_after_check", "specialize", "static_job",
           "tuning_seeds", "variant"]
