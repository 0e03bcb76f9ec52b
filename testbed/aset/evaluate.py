"""``testbed evaluate``: agents against every static policy and the references, in the simulator,
scored on seeds apart from those anything was chosen on. ONE evaluation for experiment files and
for an ASET config's ``evaluation:`` section (:class:`testbed.spec.aset.EvaluationSpec`).

Protocol (docs/aset.md, "Evaluation"), per scenario, all runs on common random numbers (seed k
gives every schedule the same arrivals) and counted by :class:`testbed.aset.episode.Episode`:

1. **Tuning seeds** T: every static policy (all sources on it) -> the **best static policy** (the
   highest mean); the load-aware policies again with the dispatchers hearing the true state every
   10 ms (``view="fresh"``) -> the **fresh-state reference** policy; the **per-source mix**, by
   coordinate ascent from the best static policy (:func:`testbed.aset.headroom.best_mix`).
   Nothing else is chosen.
2. **Evaluation seeds** E, disjoint from T (an overlap is refused, naming the seeds, before any
   run; at least :data:`~testbed.spec.aset.MIN_EVALUATION_SEEDS` for a full-strength claim, fewer
   are said so in every output): every static policy, the fresh-state reference, the mix, and each
   agent (a checkpoint driving every source through ``testbed simulate``'s loop,
   :func:`testbed.aset.jobs.agent_job`); the clairvoyant **oracle** and the **causal planner**
   (:mod:`testbed.aset.headroom`) on the first R seeds of E (R >= 5: ``reference_seeds``).
3. **Figures**: every row's success % (mean ± 95 % CI over its seeds); every reference's and
   agent's gain over the best static policy, paired per seed (mean ± CI, two-sided paired t test
   p); each agent also against the mix and the causal planner, and its choice shares (the share of
   its decisions on each policy). **Headroom** = the larger of the mix's and the causal planner's
   gain on E: what a selector deciding from the present could reach. The oracle's gain is
   reported with its CI and never used as the headroom (it knows the seed's future).
4. **Claims over scenarios**: "above (below) the best static policy beyond the CI in k of n"
   counts the scenarios whose paired test rejects at 5 % after Holm's correction over the n
   scenarios (:func:`testbed.core.util.holm`).

Outputs in ``out`` (documented in docs/aset.md, "Evaluation"): ``results.md`` (the tables, as
printed), ``results.json`` (every figure of every scenario, the protocol, the claims),
``runs.csv`` (one row per scenario x seed set x row x seed: ok, n, success ratio), ``choices.json``
(each agent's schedule per scenario, seed and source). Results are cached in ``out/cache``
(:func:`testbed.aset.jobs.run_jobs`).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testbed.agent.live import SourceSelector, source_configs
from testbed.aset.episode import window_of
from testbed.aset.jobs import (
    agent_job,
    assignment_job,
    causal_job,
    code_fingerprint,
    inputs_fingerprint,
    mix_job,
    oracle_job,
    plan_of,
    progress_bar,
    run_jobs,
    static_job,
)
from testbed.core.errors import EXIT_BRINGUP, EXIT_NOTHING_MEASURED, InputError, RunFailure, naming_file
from testbed.core.util import ci95, holm, markdown_table, paired_test, scenarios_problem, write_json_atomic
from testbed.model.policies import REGISTRY
from testbed.plan.build import Plan, check_load_bounds, runs_dir_problem
from testbed.plan.dilation import with_time_dilation
from testbed.spec.aset import MIN_EVALUATION_SEEDS, MIN_REFERENCE_SEEDS
from testbed.spec.experiment import AsetSpec

#: Row names besides the static policies' and the agents'.
BEST, MIX, FRESH, ORACLE, CAUSAL = "best static", "mix", "fresh-state", "oracle", "causal planner"


@dataclass
class Protocol:
    """What :func:`evaluate` runs (module docstring): ``tuning`` and ``seeds`` (evaluation), the
    actions (static policies), ``mix``, ``fresh``, ``reference_seeds`` (oracle and, with
    ``causal_samples`` > 0, the causal planner), ``horizon`` (their windows of look-ahead),
    ``causal_min_t``, ``duration_s`` (None: each experiment's)."""

    tuning: list[int]
    seeds: list[int]
    actions: list[str]
    mix: bool = True
    fresh: bool = True
    reference_seeds: int = 0
    causal_samples: int = 0
    causal_min_t: float = 1.64
    horizon: int | None = 2
    duration_s: float | None = None

    @property
    def references(self) -> list[int]:
        return self.seeds[:self.reference_seeds]


def check_protocol(p: Protocol) -> None:
    """Refuse, before any run, seed sets that would score something on the seeds it was chosen on.

    Raises:
        InputError: (exit code 2) evaluation seeds that are also tuning seeds, naming them; more
            reference seeds than evaluation seeds; reference seeds fewer than 5 (but 0); the causal
            planner without reference seeds.
    """
    overlap = sorted(set(p.tuning) & set(p.seeds))
    if overlap:
        raise InputError(f"evaluation seeds {', '.join(map(str, overlap))} are also tuning seeds: what is chosen "
                         f"(the best static policy, the mix, the fresh-state reference) on the tuning seeds "
                         f"{_seed_text(p.tuning)} would be scored on them; give disjoint seeds (e.g. --tuning-seeds "
                         f"1-5 --seeds 101-120)")
    if p.reference_seeds > len(p.seeds):
        raise InputError(f"--oracle {p.reference_seeds}: more reference seeds than the {len(p.seeds)} evaluation seeds")
    if 0 < p.reference_seeds < MIN_REFERENCE_SEEDS:
        raise InputError(f"--oracle {p.reference_seeds}: the oracle and the causal planner run on at least "
                         f"{MIN_REFERENCE_SEEDS} evaluation seeds (their CIs), or 0 (off)")
    if p.causal_samples and not p.reference_seeds:
        raise InputError(f"--causal {p.causal_samples}: the causal planner runs on the reference seeds; give "
                         f"--oracle N (N >= {MIN_REFERENCE_SEEDS})")
    if p.causal_samples == 1 and p.causal_min_t > 0:
        raise InputError(f"--causal 1 with causal_min_t {p.causal_min_t:g}: a t statistic needs at least 2 sampled "
                         f"futures; use --causal 2 or more")


def _seed_text(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    return f"{s[0]}-{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 2 else ",".join(map(str, s))


@dataclass
class Evaluation:
    """What :func:`evaluate` returns: the results folder, ``rows`` (one summary per scenario,
    as ``results.json``), ``claims`` (per agent and reference), the markdown it wrote."""

    out: Path
    rows: list[dict]
    claims: dict[str, dict]
    markdown: str
    runs: list[dict] = field(default_factory=list)


# ----------------------------------------------------------------------------- checks
def check_scenarios(scenarios: Sequence[str], p: Protocol, agents: dict[str, str]) -> dict[str, Plan]:
    """Plan every scenario and refuse, before any run, what cannot be evaluated: a file given twice
    or two of one name; a duration that is not whole decision windows (of the report interval and
    of each agent) or expects no query; with the causal planner, a cluster that batches; an agent
    that cannot drive a source (its resolution's message).

    Raises:
        InputError: naming the scenario file and what is wrong.
    """
    plans = {s: plan_of(s) for s in scenarios}
    problem = scenarios_problem("scenarios", list(scenarios), [pl.experiment.name for pl in plans.values()],
                                "runs.csv and the tables")
    if problem:
        raise InputError(problem)
    for s, plan in plans.items():
        windows = {f"the report interval of {s}": window_of(plan, None)}
        for label, ckpt in agents.items():
            try:
                windows[f"{label}'s window"] = _agent_window(plan, agent_checkpoint(ckpt, s))
            except InputError as exc:
                raise naming_file(exc, s) from None
        _check_duration(s, plan, p.duration_s, windows)
        if p.causal_samples:
            batching = [c.name for c in plan.experiment.clusters if c.server.max_batch > 1]
            if batching:
                raise InputError(f"{s}: cluster(s) {', '.join(batching)} batch (server.max_batch > 1); the causal "
                                 f"planner cannot redraw a batching cluster's future: run without --causal")
    return plans


def agent_checkpoint(checkpoint: str, scenario: str) -> str:
    """An agent's checkpoint for one scenario: ``{stem}`` in it stands for the scenario file's stem
    (one specialized checkpoint per scenario, e.g. ``runs/spec/{stem}``); any other path is every
    scenario's."""
    return checkpoint.replace("{stem}", Path(scenario).stem)


def _agent_window(plan: Plan, checkpoint: str) -> float:
    """Every source's selector of ``checkpoint`` built as the jobs build it; its window (s)."""
    srcs = sorted(h.name for h in plan.sources)
    cfgs = source_configs(with_time_dilation(plan, 1.0), srcs, AsetSpec(checkpoint=checkpoint))
    try:
        return min(SourceSelector(c).window_s for c in cfgs)
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"ASET checkpoint {checkpoint}: {exc}") from None


def _check_duration(s: str, plan: Plan, dur: float | None, windows: dict[str, float]) -> None:
    eff = dur or float(plan.experiment.duration_s)
    what = f"--duration {eff:g} s" if dur else f"the duration of {s}, {eff:g} s,"
    for name, w in windows.items():
        k = eff / w
        if k < 1 - 1e-9:
            raise InputError(f"{what} is shorter than one decision window ({name}: {w * 1e3:g} ms)")
        if abs(k - round(k)) > 1e-6:
            raise InputError(f"{what} is not a whole number of decision windows ({name}: {w * 1e3:g} ms); give a "
                             f"multiple of {w * 1e3:g} ms")
    if dur is not None:
        try:
            check_load_bounds(plan.experiment, plan.weights, eff, Path(plan.base_dir))
        except InputError as exc:
            raise naming_file(exc, f"{s} with {what}") from None


def check_out_dir(out: Path) -> None:
    """Refuse, before any run, a results folder that cannot be written.

    Raises:
        RunFailure: (exit code 3) naming it and what is in the way.
    """
    for d in (out, out / "cache"):
        problem = runs_dir_problem(d)
        if problem:
            raise RunFailure(f"results folder {out}: {problem}; nothing was run", EXIT_BRINGUP)


# ----------------------------------------------------------------------------- the runs
class _Runner:
    """The jobs of one evaluation with one progress bar (rich: done / total, elapsed, ETA)."""

    def __init__(self, total: int, cache: Path, workers: int, backend: str, ray_address: str | None, console,
                 progress: bool):
        self.cache, self.workers, self.backend, self.ray_address = cache, workers, backend, ray_address
        self.console, self.bar, self.task = console, None, None
        if progress:
            self.bar, self.task = progress_bar(console, total, "evaluate")

    def __call__(self, phase: str, fn: Callable, tasks: list[tuple]) -> list:
        if self.bar is not None:
            self.bar.update(self.task, description=phase)
        advance = (lambda: self.bar.advance(self.task)) if self.bar is not None else None
        return run_jobs(fn, tasks, cache=self.cache, workers=self.workers, backend=self.backend,
                        ray_address=self.ray_address, advance=advance, warn=self._warn)

    def skip(self, n: int) -> None:
        """``n`` counted jobs that need no run (a fresh-state reference that reads no load)."""
        if self.bar is not None and n:
            self.bar.advance(self.task, n)

    def _warn(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(f"warning: {msg}", markup=False, highlight=False)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _n_jobs(n_s: int, p: Protocol, n_agents: int) -> int:
    n_t, n_e, n_r = len(p.tuning), len(p.seeds), p.reference_seeds
    tuning = n_t * (1 + p.fresh) + p.mix
    return n_s * (tuning + n_e * (1 + p.fresh + p.mix + n_agents) + n_r * (1 + (p.causal_samples > 0)))


def _load_aware(policy: str) -> bool:
    """Whether ``policy`` (a built-in name or a plug-in) reads load (its fresh-state runs differ)."""
    return bool(REGISTRY.resolve(policy, "actions").load_aware)


def _ratio(c) -> float:
    return c[0] / c[1] if c[1] else math.nan


def evaluate(scenarios: Sequence[str], protocol: Protocol, out: Path, *, agents: dict[str, str] | None = None,
             workers: int = 2, backend: str = "process", ray_address: str | None = None, console=None,
             progress: bool = True) -> Evaluation:
    """Run the protocol (module docstring) on ``scenarios`` (experiment files) with ``agents``
    (label -> checkpoint, e.g. ``{"ASET": "models/aset/general"}``, ``{stem}`` standing for each
    scenario's file stem: :func:`agent_checkpoint`; none: the references only);
    writes ``out`` and returns the figures.

    Raises:
        InputError: before any run: overlapping seed sets (:func:`check_protocol`), a scenario or an
            agent that cannot be evaluated (:func:`check_scenarios`). RunFailure: before any run, an
            output folder that cannot be written (exit 3); after the tuning runs, a scenario with no
            query on any tuning seed (exit 5).
    """
    agents = dict(agents or {})
    p = protocol
    check_protocol(p)
    scenarios = [str(Path(s).resolve()) for s in scenarios]
    plans = check_scenarios(scenarios, p, agents)
    check_out_dir(out)
    code_fingerprint.cache_clear()  # read again: profiles or code changed in between count
    inputs_fingerprint.cache_clear()
    run = _Runner(_n_jobs(len(scenarios), p, len(agents)), out / "cache", workers, backend, ray_address, console,
                  progress)
    try:
        chosen = _tune(run, scenarios, plans, p)
        per_seed, shares, schedules = _score(run, scenarios, p, chosen, agents)
    finally:
        run.stop()
    rows = [_summary(s, plans[s], p, chosen[s], per_seed[s], shares.get(s, {}), list(agents)) for s in scenarios]
    claims = _claims(rows, list(agents))
    md = results_markdown(rows, claims, p)
    runs = _runs_rows(scenarios, plans, per_seed, chosen, p)
    _write(out, rows, claims, md, runs, schedules, p)
    return Evaluation(out, rows, claims, md, runs)


def _tune(run: _Runner, scenarios: list[str], plans: dict[str, Plan], p: Protocol) -> dict[str, dict]:
    """Step 1 (module docstring) on the tuning seeds: per scenario its ``best``, ``fresh`` policy,
    ``mix`` and the tuning runs (``tuning``: policy -> per-seed ratios).

    Raises:
        RunFailure: (exit code 5) a scenario created no query on any tuning seed.
    """
    pairs = [(s, k) for s in scenarios for k in p.tuning]
    res = run("tuning: static policies", static_job, [(s, k, p.actions, p.duration_s) for s, k in pairs])
    stale = {s: {a: [] for a in p.actions} for s in scenarios}
    for (s, _k), r in zip(pairs, res, strict=True):
        for a, c in r.items():
            stale[s][a].append(_ratio(c))
    for s in scenarios:
        if all(math.isnan(x) for xs in stale[s].values() for x in xs):
            raise RunFailure(f"{s}: no query was created on any tuning seed ({_seed_text(p.tuning)}): every success "
                             f"ratio is undefined; lengthen the duration", EXIT_NOTHING_MEASURED)
    means = {s: {a: float(np.nanmean(v)) for a, v in stale[s].items()} for s in scenarios}
    best = {s: max(p.actions, key=lambda a, s=s: (means[s][a], a)) for s in scenarios}
    fresh_means = {s: dict(means[s]) for s in scenarios}
    aware = [a for a in p.actions if _load_aware(a)] if p.fresh else []
    if aware:
        res = run("tuning: fresh-state", static_job, [(s, k, aware, p.duration_s, "fresh") for s, k in pairs])
        fr = {s: {a: [] for a in aware} for s in scenarios}
        for (s, _k), r in zip(pairs, res, strict=True):
            for a, c in r.items():
                fr[s][a].append(_ratio(c))
        for s in scenarios:
            fresh_means[s].update({a: float(np.nanmean(v)) for a, v in fr[s].items()})
    mixes = {s: [best[s]] * len(plans[s].sources) for s in scenarios}
    if p.mix:
        res = run("tuning: per-source mix", mix_job, [(s, p.tuning, p.actions, p.duration_s, means[s])
                                                      for s in scenarios])
        mixes = {s: list(r[0]) for s, r in zip(scenarios, res, strict=True)}
    return {s: {"best": best[s], "fresh": max(p.actions, key=lambda a, s=s: (fresh_means[s][a], a)) if p.fresh
                else None, "mix": mixes[s], "tuning": stale[s], "tuning_means": means[s]} for s in scenarios}


def _score(run: _Runner, scenarios: list[str], p: Protocol, chosen: dict[str, dict],
           agents: dict[str, str]) -> tuple[dict, dict, dict]:
    """Step 2 on the evaluation seeds: per scenario, row -> per-seed success ratios (NaN where a
    row did not run); each agent's choice shares and schedules."""
    E = p.seeds
    pairs = [(s, k) for s in scenarios for k in E]
    per_seed: dict[str, dict[str, list[float]]] = {s: {} for s in scenarios}
    res = run("evaluation: static policies", static_job, [(s, k, p.actions, p.duration_s) for s, k in pairs])
    for (s, _k), r in zip(pairs, res, strict=True):
        for a, c in r.items():
            per_seed[s].setdefault(a, []).append(_ratio(c))
    for s in scenarios:
        per_seed[s][BEST] = list(per_seed[s][chosen[s]["best"]])
    if p.fresh:
        fp = {s: chosen[s]["fresh"] for s in scenarios}
        aware = [s for s in scenarios if _load_aware(fp[s])]
        res = run("evaluation: fresh-state", static_job, [(s, k, [fp[s]], p.duration_s, "fresh")
                                                          for s in aware for k in E])
        run.skip(len(E) * (len(scenarios) - len(aware)))
        for s in scenarios:
            per_seed[s][FRESH] = list(per_seed[s][fp[s]])  # a policy that reads no load: its stale figure
        for i, s in enumerate(aware):
            per_seed[s][FRESH] = [_ratio(r[fp[s]]) for r in res[i * len(E):(i + 1) * len(E)]]
    if p.mix:
        res = run("evaluation: mix", assignment_job, [(s, k, chosen[s]["mix"], p.duration_s) for s, k in pairs])
        for i, s in enumerate(scenarios):
            per_seed[s][MIX] = [_ratio(c) for c in res[i * len(E):(i + 1) * len(E)]]
    shares: dict[str, dict] = {s: {} for s in scenarios}
    schedules: dict[str, dict] = {}
    for label, ckpt in agents.items():
        agent = {s: AsetSpec(checkpoint=agent_checkpoint(ckpt, s)).model_dump_json() for s in scenarios}
        res = run(f"evaluation: {label}", agent_job, [(s, k, agent[s], p.duration_s) for s, k in pairs])
        for i, s in enumerate(scenarios):
            mine = res[i * len(E):(i + 1) * len(E)]
            per_seed[s][label] = [_ratio((r["ok"], r["n"])) for r in mine]
            shares[s][label] = {a: float(np.mean([r["shares"].get(a, 0.0) for r in mine]))
                                for a in sorted({a for r in mine for a in r["shares"]})}
            schedules.setdefault(label, {})[Path(s).stem] = {str(k): r["schedule"]
                                                             for k, r in zip(E, mine, strict=True)}
    _references(run, scenarios, p, chosen, per_seed)
    return per_seed, shares, schedules


def _references(run: _Runner, scenarios: list[str], p: Protocol, chosen: dict[str, dict],
                per_seed: dict[str, dict[str, list[float]]]) -> None:
    """The oracle and the causal planner on the reference seeds (NaN on the other evaluation seeds)."""
    R = p.references
    if not R:
        return
    pad = [math.nan] * (len(p.seeds) - len(R))
    bases = {s: [chosen[s]["mix"], [chosen[s]["best"]] * len(chosen[s]["mix"])] for s in scenarios}
    res = run("references: oracle", oracle_job, [(s, k, bases[s], p.actions, p.duration_s, p.horizon)
                                                  for s in scenarios for k in R])
    for i, s in enumerate(scenarios):
        per_seed[s][ORACLE] = [_ratio((r["ok"], r["n"])) for r in res[i * len(R):(i + 1) * len(R)]] + pad
    if p.causal_samples:
        res = run("references: causal planner", causal_job,
                  [(s, k, chosen[s]["mix"], p.actions, p.causal_samples, p.duration_s, p.horizon, p.causal_min_t)
                   for s in scenarios for k in R])
        for i, s in enumerate(scenarios):
            per_seed[s][CAUSAL] = [_ratio((r["ok"], r["n"])) for r in res[i * len(R):(i + 1) * len(R)]] + pad


# ----------------------------------------------------------------------------- figures
def _pct(xs: Sequence[float]) -> dict:
    m, h = ci95([100 * x for x in xs])
    return {"mean": m, "ci": h, "seeds": int(sum(not math.isnan(x) for x in xs))}


def _gain(a: Sequence[float], b: Sequence[float]) -> dict:
    """``a - b`` in points, paired per seed (:func:`testbed.core.util.paired_test`)."""
    return paired_test([100 * x for x in a], [100 * x for x in b])


def _summary(s: str, plan: Plan, p: Protocol, chosen: dict, ps: dict[str, list[float]], shares: dict,
             agents: list[str]) -> dict:
    """One scenario's figures (``results.json``'s row)."""
    refs = [r for r in (MIX, FRESH, CAUSAL, ORACLE) if r in ps]
    row = {"scenario": plan.experiment.name, "file": s, "sources": len(plan.sources), "best_static": chosen["best"],
           "fresh_policy": chosen["fresh"], "mix_assignment": chosen["mix"],
           "tuning_means": {a: 100 * v for a, v in chosen["tuning_means"].items()},
           "rows": {r: _pct(ps[r]) for r in [*p.actions, BEST, *refs, *agents]},
           "gains": {r: _gain(ps[r], ps[BEST]) for r in [*refs, *agents]}, "agents": {}}
    heads = {r: row["gains"][r]["mean"] for r in (MIX, CAUSAL) if r in row["gains"]}
    row["headroom"] = ({"by": max(heads, key=lambda r: heads[r]), "points": max(heads.values())} if heads
                       else None)
    for a in agents:
        row["agents"][a] = {"vs_best": row["gains"][a], "shares": shares.get(a, {}),
                            **{f"vs_{key}": _gain(ps[a], ps[r]) for key, r in (("mix", MIX), ("causal", CAUSAL),
                                                                                ("fresh", FRESH)) if r in ps}}
    return row


def _claims(rows: list[dict], agents: list[str]) -> dict[str, dict]:
    """Per agent and reference: in how many scenarios it is above / below the best static policy
    beyond the CI, Holm-corrected over the scenarios (module docstring), and its mean gain."""
    out = {}
    for r in [*agents, MIX, CAUSAL, ORACLE, FRESH]:
        gains = [row["gains"][r] for row in rows if r in row["gains"] and row["gains"][r]["n"] >= 2]
        if not gains:
            continue
        reject = list(zip(holm([g["p"] for g in gains]), gains, strict=True))
        out[r] = {"scenarios": len(gains), "above": sum(rj and g["mean"] > 0 for rj, g in reject),
                  "below": sum(rj and g["mean"] < 0 for rj, g in reject),
                  "mean_gain": float(np.mean([g["mean"] for g in gains])),
                  "worst_gain": float(min(g["mean"] for g in gains))}
    return out


def _pm(g: dict) -> str:
    if g is None or g["mean"] != g["mean"]:
        return "-"
    h = "n/a" if g["ci"] != g["ci"] else f"{g['ci']:.2f}"
    return f"{g['mean']:+.2f} ± {h}"


def _cell(x: dict) -> str:
    if x["mean"] != x["mean"]:
        return "-"
    h = "n/a" if x["ci"] != x["ci"] else f"{x['ci']:.2f}"
    return f"{x['mean']:.2f} ± {h}"


def _p(g: dict) -> str:
    return "-" if g["p"] != g["p"] else f"{g['p']:.3g}"


def results_markdown(rows: list[dict], claims: dict[str, dict], p: Protocol) -> str:
    """The tables ``testbed evaluate`` prints and writes (``results.md``)."""
    few = len(p.seeds) < MIN_EVALUATION_SEEDS
    lines = [f"Protocol: chosen on tuning seeds {_seed_text(p.tuning)}; scored on evaluation seeds "
             f"{_seed_text(p.seeds)} ({len(p.seeds)} seeds, common random numbers, paired)"
             + (f"; FEWER than the protocol's {MIN_EVALUATION_SEEDS}: a weaker claim" if few else "")
             + (f"; oracle{' and causal planner' if p.causal_samples else ''} on {_seed_text(p.references)}"
                if p.references else "") + ".", ""]
    for r in rows:
        lines.append(f"## {r['scenario']} ({r['sources']} sources)")
        lines.append("")
        lines.append(f"best static policy (chosen on the tuning seeds): {r['best_static']}"
                     + (f"; mix: {', '.join(r['mix_assignment'])}" if MIX in r["rows"] else "")
                     + (f"; fresh-state reference: {r['fresh_policy']}" if FRESH in r["rows"] else ""))
        lines.append("")
        table = []
        for name, x in r["rows"].items():
            g = r["gains"].get(name)
            table.append({"row": name, "success % (mean ± 95 % CI)": _cell(x), "seeds": x["seeds"],
                          "- best static (pts, paired)": _pm(g) if g else "", "p": _p(g) if g else ""})
        lines.append(markdown_table(table))
        if r["headroom"]:
            lines.append(f"\nheadroom (on the evaluation seeds): {r['headroom']['points']:+.2f} points "
                         f"({r['headroom']['by']})")
        for a, info in r["agents"].items():
            vs = "; ".join(f"{k.removeprefix('vs_')}: {_pm(v)}" for k, v in info.items() if k.startswith("vs_"))
            share = ", ".join(f"{k} {100 * v:.1f} %" for k, v in sorted(info["shares"].items(), key=lambda kv: -kv[1]))
            lines.append(f"\n{a}: gains {vs}. Choices: {share}.")
        lines.append("")
    if len(rows) > 1:
        lines.append("## Over the scenarios")
        lines.append("")
        lines.append(markdown_table([{"row": k, "scenarios": c["scenarios"],
                                      "mean gain (pts)": f"{c['mean_gain']:+.2f}",
                                      "worst (pts)": f"{c['worst_gain']:+.2f}",
                                      "above best static beyond the CI": f"{c['above']} of {c['scenarios']}",
                                      "below beyond the CI": f"{c['below']} of {c['scenarios']}"}
                                     for k, c in claims.items()]))
        lines.append("\n(paired t tests at 5 %, Holm-corrected over the scenarios)")
    return "\n".join(lines) + "\n"


def _runs_rows(scenarios: list[str], plans: dict[str, Plan], per_seed: dict, chosen: dict, p: Protocol) -> list[dict]:
    out = []
    for s in scenarios:
        name = plans[s].experiment.name
        for a, xs in chosen[s]["tuning"].items():
            out += [{"scenario": name, "seeds": "tuning", "row": a, "seed": k, "success_ratio": x}
                    for k, x in zip(p.tuning, xs, strict=True)]
        for a, xs in per_seed[s].items():
            out += [{"scenario": name, "seeds": "evaluation", "row": a, "seed": k, "success_ratio": x}
                    for k, x in zip(p.seeds, xs, strict=True) if x == x]
    return out


def _write(out: Path, rows: list[dict], claims: dict, md: str, runs: list[dict], schedules: dict, p: Protocol) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(md)
    protocol = {"tuning_seeds": p.tuning, "evaluation_seeds": p.seeds, "reference_seeds": p.references,
                "actions": p.actions, "mix": p.mix, "fresh": p.fresh, "causal_samples": p.causal_samples,
                "causal_min_t": p.causal_min_t, "horizon_windows": p.horizon, "duration_s": p.duration_s,
                "full_strength": len(p.seeds) >= MIN_EVALUATION_SEEDS}
    write_json_atomic(out / "results.json", json.loads(json.dumps({"protocol": protocol, "scenarios": rows,
                                                                    "claims": claims}, default=float)))
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["scenario", "seeds", "row", "seed", "success_ratio"])
        w.writeheader()
        w.writerows(runs)
    if schedules:
        write_json_atomic(out / "choices.json", schedules, indent=None)


__all__ = ["BEST", "CAUSAL", "FRESH", "MIX", "ORACLE", "Evaluation", "Protocol", "agent_checkpoint", "check_protocol",
           "check_scenarios", "evaluate", "results_markdown"]
