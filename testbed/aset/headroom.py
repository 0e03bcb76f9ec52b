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

``headroom = oracle - best static`` (points of success ratio), per seed and as mean and 95 % CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from testbed.aset.episode import Episode, run_static, settle_s
from testbed.plan import Plan


def static_ratio(plan: Plan, seed: int, assignment: Sequence[str], window_s: float | None = None,
                 duration_s: float | None = None) -> tuple[int, int]:
    """(successes, queries) of one episode with a constant policy per source (sorted order)."""
    ep = run_static(plan, seed, assignment, window_s, duration_s)
    return int(ep.ok.sum()), int(ep.n.sum())


def best_mix(plan: Plan, seeds: Sequence[int], actions: Sequence[str], start: str | Sequence[str],
             window_s: float | None = None, duration_s: float | None = None,
             known: dict[tuple[str, ...], float] | None = None) -> tuple[list[str], float, dict]:
    """The per-source static mix by coordinate ascent (module docstring).

    Args:
        start: the starting policy (all sources) or assignment (sorted source order).
        known: assignment -> mean success ratio already measured (e.g. the static policies).

    Returns:
        (assignment, its mean success ratio over ``seeds``, every assignment evaluated -> mean).
    """
    srcs = sorted(h.name for h in plan.sources)
    cur = [start] * len(srcs) if isinstance(start, str) else list(start)
    seen: dict[tuple[str, ...], float] = dict(known or {})

    def value(assign: list[str]) -> float:
        key = tuple(assign)
        if key not in seen:
            runs = [static_ratio(plan, s, assign, window_s, duration_s) for s in seeds]
            seen[key] = float(np.mean([ok / n for ok, n in runs]))
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


def continuation_ok(ep: Episode, w: int, horizon: int | None, base: Sequence[str], first: Sequence[str]) -> int:
    """Successes among the queries created in windows [w, w + horizon) of a clone that runs window
    ``w`` with ``first`` and the following windows with ``base`` (``ep`` at the start of window
    ``w`` and left there). One measure for the oracle's candidates and the rollout training
    targets (:mod:`testbed.aset.rollout`)."""
    c = ep.clone()
    c.set_policies(first)
    c.run_to(w + 1)
    c.set_policies(base)
    end = c.n_windows if horizon is None else min(c.n_windows, w + horizon)
    c.run_to(end)
    if end >= c.n_windows:
        c.finish()
    else:
        c.sim.run_until(end * c.window_s + settle_s(c.plan))
        c._collect()
    return int(c.ok[w:end].sum())


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
    schedule: list[list[str]] = []
    trials = 0
    for w in range(ep.n_windows):
        cur = list(base)
        best_v = continuation_ok(ep, w, horizon_windows, base, cur)  # the schedule in force
        trials += 1
        for i in range(len(srcs)):
            best_a = cur[i]
            for a in actions:
                if a == cur[i]:
                    continue
                trial = cur[:i] + [a] + cur[i + 1:]
                v = continuation_ok(ep, w, horizon_windows, base, trial)
                trials += 1
                if v > best_v:
                    best_a, best_v = a, v
            cur[i] = best_a
        ep.set_policies(cur)
        ep.step()
        schedule.append(cur)
    ep.finish()
    ok, n = int(ep.ok.sum()), int(ep.n.sum())
    base_ok = int(ref.ok.sum())
    if n != int(ref.n.sum()):
        raise AssertionError(f"{plan.experiment.name} seed {seed}: the oracle saw {n} queries, the base "
                             f"{int(ref.n.sum())} (arrivals must not depend on the schedule)")
    fallback = ok < base_ok
    if fallback:
        ok, schedule = base_ok, [list(base) for _ in schedule]
    return OracleResult(ok, n, schedule, base_ok, fallback, trials, ep.ok.tolist())


__all__ = ["OracleResult", "best_mix", "continuation_ok", "rollout_oracle", "static_ratio"]
