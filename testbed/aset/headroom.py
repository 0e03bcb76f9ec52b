"""Headroom of a scenario, measured before anything is trained: what a policy selector could gain.

For one scenario (a plan) and a set of seeds, all on common random numbers (the same seed gives
every schedule the same arrivals; :class:`~testbed.aset.episode.Episode` counts every figure):

* **static policies**: every source applies policy p all the time, for each p of the action set;
  the best static policy is the one with the highest mean success ratio over the seeds.
* **per-source static mix**: one constant policy per source (|A|^n_sources assignments). Found by
  coordinate ascent on the mean over the seeds: start from the best static policy; for each source
  in turn, try every other policy with the other sources fixed and keep a strict improvement;
  repeat until a full pass changes nothing (:func:`best_mix`; a local optimum, exhaustive for one
  source). It is chosen once per scenario on the tuning seeds and used as it is on fresh seeds.
* **clairvoyant switching oracle** (:func:`rollout_oracle`): a schedule of one policy per window
  and source, chosen with hindsight on the same seed by multiagent rollout (Bertsekas, "Multiagent
  Rollout Algorithms and Reinforcement Learning", 2019): at window w, for each source in turn, the
  simulator state is cloned and every policy is tried for that source (the sources already decided
  keep their choice, the others the base policy), continuing with the base for the following
  windows up to the horizon; the candidate with the most successes among the queries created from
  window w on (to the horizon) wins, ties going to the candidate in force. The base is the better,
  on that seed, of the per-source mix and the best static policy. With the full horizon the
  schedule's success count is never below the base's (each step keeps or improves the value of the
  whole schedule; the simulator is deterministic per seed); with a truncated horizon the oracle's
  figure is the better of the schedule found and the base (said in ``fallback``). It is an
  achievable schedule, so it is a LOWER bound of the best switching schedule with hindsight, and
  that optimum is an upper bound of every selector deciding per window and source from the same
  action set on the same seed (a causal selector's run is one such schedule). The headroom we
  report (oracle - best static) is therefore a conservative estimate of the gain switching could
  bring.

* **causal planner** (:func:`causal_planner`): the same rollout, but
  every candidate scored on futures sampled afresh at the window's start instead of the seed's
  own: what a selector that sees the whole present, and not the future's draws, can reach.
  ``oracle - causal planner`` is the share of the headroom that is clairvoyance.

``headroom = oracle - best static`` (points of success ratio), per seed and as mean and 95 % CI.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from testbed.aset.episode import Episode, run_static
from testbed.plan.build import Plan

V = TypeVar("V")


def static_ratio(plan: Plan, seed: int, assignment: Sequence[str], window_s: float | None = None,
                 duration_s: float | None = None) -> tuple[int, int]:
    """(successes, queries) of one episode with a constant policy per source (sorted order)."""
    ep = run_static(plan, seed, assignment, window_s, duration_s)
    return int(ep.ok.sum()), int(ep.n.sum())


def mean_ratio(counts: Sequence[tuple[int, int]], what: str) -> float:
    """The mean success ratio ``ok / n`` over the ``(ok, n)`` of several seeds, the seeds without
    a query (n = 0: no ratio) left out.

    Raises:
        ValueError: no seed has a query (``what`` names the runs): the mean is undefined.
    """
    ratios = [ok / n for ok, n in counts if n > 0]
    if not ratios:
        raise ValueError(f"{what}: no query was created on any seed, so the success ratio (0 of 0) is undefined; "
                         f"lengthen the duration or raise a rate")
    return float(np.mean(ratios))


def best_mix(plan: Plan, seeds: Sequence[int], actions: Sequence[str], start: str | Sequence[str],
             window_s: float | None = None, duration_s: float | None = None,
             known: dict[tuple[str, ...], float] | None = None) -> tuple[list[str], float, dict]:
    """The per-source static mix by coordinate ascent (module docstring).

    Args:
        start: the starting policy (all sources) or assignment (sorted source order).
        known: assignment -> mean success ratio already measured (e.g. the static policies).

    Returns:
        (assignment, its mean success ratio over ``seeds``, every assignment evaluated -> mean).
        A seed on which no query is created (the same for every assignment: common random
        numbers) has no success ratio and is left out of the means.

    Raises:
        ValueError: no query is created on any of ``seeds``: every mean is undefined (0 of 0).
    """
    srcs = sorted(h.name for h in plan.sources)
    cur = [start] * len(srcs) if isinstance(start, str) else list(start)
    seen: dict[tuple[str, ...], float] = dict(known or {})

    def value(assign: list[str]) -> float:
        key = tuple(assign)
        if key not in seen:
            seen[key] = mean_ratio([static_ratio(plan, s, assign, window_s, duration_s) for s in seeds],
                                   f"{plan.experiment.name}, seeds {list(seeds)}")
        return seen[key]

    best = value(cur)
    improved = True
    while improved:
        improved = False
        for i in range(len(srcs)):
            for a in actions:
                if a == cur[i]:
                    continue
                trial = cur[:i] + [a] + cur[i + 1:]
                v = value(trial)
                if v > best + 1e-12:
                    cur, best, improved = trial, v, True
    return cur, best, seen


@dataclass
class OracleResult:
    """The oracle on one seed: ``ok``/``n`` (its successes and queries), ``schedule`` (windows x
    sources policy names), ``base_ok`` (the base schedule's successes), ``fallback`` (True when
    the truncated-horizon schedule scored below the base, so the base is reported), ``trials``
    (clone-and-continue evaluations made)."""

    ok: int
    n: int
    schedule: list[list[str]]
    base_ok: int
    fallback: bool = False
    trials: int = 0
    per_window_ok: list[list[int]] = field(default_factory=list)

    @property
    def success_ratio(self) -> float:
        return self.ok / self.n if self.n else float("nan")


def continuation_ok(ep: Episode, w: int, horizon: int | None, base: Sequence[str], first: Sequence[str],
                    resample: Sequence[int] | None = None) -> int:
    """Successes among the queries created in windows [w, w + horizon) of a clone that runs window
    ``w`` with ``first`` and the following windows with ``base`` (``ep`` at the start of window
    ``w`` and left there). One measure for the oracle's candidates and the rollout training
    targets (:mod:`testbed.aset.rollout`). ``resample``: the clone's future is drawn afresh
    (``Simulator.reseed(resample)``: the causal planner's sampled futures), else it is the seed's own."""
    return continuation_counts(ep, w, horizon, base, first, resample)[0]


def continuation_counts(ep: Episode, w: int, horizon: int | None, base: Sequence[str], first: Sequence[str],
                        resample: Sequence[int] | None = None) -> tuple[int, int]:
    """(successes, queries) among the queries created in windows [w, w + horizon) of the clone of
    :func:`continuation_ok` (with ``resample`` the queries are the sampled future's own)."""
    c = ep.clone()
    if resample is not None:
        c.sim.reseed(resample)
    c.set_policies(first)
    c.run_to(w + 1)
    c.set_policies(base)
    end = c.n_windows if horizon is None else min(c.n_windows, w + horizon)
    c.run_to(end)
    if end >= c.n_windows:
        c.finish()
    else:
        c.settle_to(end)
    return int(c.ok[w:end].sum()), int(c.n[w:end].sum())


def _rollout_schedule(ep: Episode, base: Sequence[str], actions: Sequence[str], value: Callable[[int, list[str]], V],
                      better: Callable[[V, V], bool] = operator.gt) -> tuple[list[list[str]], int]:
    """Multiagent rollout over ``base``, window by window, on ``ep`` (run to its end): at window w,
    for each source in turn, every action is tried with the sources decided before keeping theirs
    and the others the base's; ``value(w, assignment)`` scores a candidate, and a candidate replaces
    the best so far when ``better(its value, the best's)`` (default: more successes; so ties go to
    the one in force). Returns (the schedule, windows x sources; the number of candidates scored)."""
    schedule: list[list[str]] = []
    trials = 0
    for w in range(ep.n_windows):
        cur = list(base)
        best_v = value(w, cur)  # the schedule in force
        trials += 1
        for i in range(len(cur)):
            best_a = cur[i]
            for a in actions:
                if a == cur[i]:
                    continue
                v = value(w, cur[:i] + [a] + cur[i + 1:])
                trials += 1
                if better(v, best_v):
                    best_a, best_v = a, v
            cur[i] = best_a
        ep.set_policies(cur)
        ep.step()
        schedule.append(cur)
    ep.finish()
    return schedule, trials


def paired_gain_t(d: np.ndarray) -> float:
    """The one-sided paired t statistic of gains ``d`` (mean / (sd / sqrt(n)), sd with n - 1 degrees
    of freedom): +inf for positive gains with no spread, -inf for none or a non-positive mean with
    none, NaN-free."""
    m = float(d.mean()) if d.size else 0.0
    sd = float(d.std(ddof=1)) if d.size > 1 else 0.0
    if sd == 0.0:
        return math.inf if m > 0 else -math.inf
    return m / (sd / math.sqrt(d.size))


def _check_same_queries(plan: Plan, seed: int, ep: Episode, ref: Episode, who: str) -> None:
    if int(ep.n.sum()) != int(ref.n.sum()):
        raise AssertionError(f"{plan.experiment.name} seed {seed}: the {who} saw {int(ep.n.sum())} queries, the base "
                             f"{int(ref.n.sum())} (arrivals must not depend on the schedule)")


def rollout_oracle(plan: Plan, seed: int, base: Sequence[str] | Sequence[Sequence[str]], actions: Sequence[str],
                   window_s: float | None = None, duration_s: float | None = None,
                   horizon_windows: int | None = None) -> OracleResult:
    """The clairvoyant switching oracle on one seed (module docstring): multiagent rollout over the
    ``base`` schedule (a policy per source, sorted order; or several candidate assignments, of which
    the best on this seed is the base: the oracle knows the seed), ``horizon_windows`` windows of
    look-ahead (None: to the end of the episode, where the improvement over the base is exact)."""
    srcs = sorted(h.name for h in plan.sources)
    cands = [list(base)] if isinstance(base[0], str) else [list(b) for b in base]
    refs = [run_static(plan, seed, b, window_s, duration_s) for b in cands]
    k = max(range(len(cands)), key=lambda i: (int(refs[i].ok.sum()), -i))
    base, ref = cands[k], refs[k]
    ep = Episode(plan, seed, dict(zip(srcs, base, strict=True)), window_s, duration_s)
    schedule, trials = _rollout_schedule(
        ep, base, actions, lambda w, cand: continuation_ok(ep, w, horizon_windows, base, cand))
    _check_same_queries(plan, seed, ep, ref, "oracle")
    ok, n = int(ep.ok.sum()), int(ep.n.sum())
    base_ok = int(ref.ok.sum())
    fallback = ok < base_ok
    if fallback:
        ok, schedule = base_ok, [list(base) for _ in schedule]
    return OracleResult(ok, n, schedule, base_ok, fallback, trials, ep.ok.tolist())


def causal_planner(plan: Plan, seed: int, base: Sequence[str], actions: Sequence[str], samples: int,
                   window_s: float | None = None, duration_s: float | None = None,
                   horizon_windows: int | None = 2, min_t: float = 0.0) -> OracleResult:
    """The causal counterpart of :func:`rollout_oracle`: the same multiagent rollout over ``base``
    (one policy per source, sorted order, fixed in advance: no choice with hindsight), but each
    candidate is scored on ``samples`` futures drawn afresh at the window's start
    (:meth:`testbed.sim.Simulator.reseed`, salt ``(window, k)``, the same for every candidate:
    common random numbers), not on the seed's own future. It knows the model and the whole present
    state (every queue, every query in flight, the scenario's scheduled events) but none of the
    future's draws (arrivals, service times, losses). A candidate replaces the best so far when its
    mean gain over the samples is positive and, with ``min_t`` > 0, at least ``min_t`` standard
    errors of the paired gains (a one-sided paired t statistic: with few samples, the largest of
    several noisy estimates is biased up, and a plain argmax deviates on noise). Its schedule is
    then run on the seed itself, and that run's successes are its figure: never replaced by the
    base's (no ``fallback``: the choice would need hindsight).

    So ``oracle - causal planner`` estimates the part of the clairvoyant headroom that knowing the
    future's draws buys, which no selector deciding from the present can have; ``causal planner -
    best static`` estimates what a selector with a perfect view of the present (ASET sees less:
    reports one interval old, counts per window) could gain with the same look-ahead. A planner
    with finite samples and horizon is not optimal: its figure is an achievable lower bound of the
    best causal schedule, as the clairvoyant oracle's is of the best schedule with hindsight.

    Raises:
        ValueError: ``samples`` < 1, or < 2 with ``min_t`` > 0, or ``base`` not one policy per source.
    """
    if samples < 1:
        raise ValueError(f"causal_planner: samples must be >= 1, not {samples}")
    if samples < 2 and min_t > 0:
        raise ValueError(f"causal_planner: min_t {min_t:g} needs samples >= 2 (a t statistic of one sample has "
                         f"no spread: any positive gain would pass)")
    srcs = sorted(h.name for h in plan.sources)
    if not base or not isinstance(base[0], str) or len(base) != len(srcs):
        raise ValueError(f"causal_planner: base must be one policy per source ({len(srcs)}), not {base!r}")
    base = list(base)
    ref = run_static(plan, seed, base, window_s, duration_s)
    ep = Episode(plan, seed, dict(zip(srcs, base, strict=True)), window_s, duration_s)

    def value(w: int, cand: list[str]) -> np.ndarray:
        return np.array([continuation_ok(ep, w, horizon_windows, base, cand, resample=(w, k)) for k in range(samples)],
                        dtype=float)

    def better(v: np.ndarray, best: np.ndarray) -> bool:
        return paired_gain_t(v - best) >= min_t if min_t > 0 else float((v - best).mean()) > 0

    schedule, trials = _rollout_schedule(ep, base, actions, value, better)
    _check_same_queries(plan, seed, ep, ref, "causal planner")
    return OracleResult(int(ep.ok.sum()), int(ep.n.sum()), schedule, int(ref.ok.sum()), False, trials * samples,
                        ep.ok.tolist())


__all__ = ["OracleResult", "best_mix", "causal_planner", "continuation_counts", "continuation_ok", "mean_ratio",
           "paired_gain_t", "rollout_oracle", "static_ratio"]
