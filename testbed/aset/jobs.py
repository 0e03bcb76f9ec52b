"""The jobs of ``testbed evaluate`` (:mod:`testbed.aset.evaluate`), each run in a worker process:
one static policy, the per-source mix, one schedule, the oracle, the causal planner, ASET and the
decision agreement, on one scenario and seed (plans are loaded in the worker)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from testbed.agent.npolicy import NumpyPolicy
from testbed.aset.envs import AsetSimEnv, plan_contexts
from testbed.aset.episode import Episode
from testbed.aset.headroom import best_mix, causal_planner, rollout_oracle, static_ratio
from testbed.plan.build import Plan, plan_experiment


def plan_of(scenario: str) -> Plan:
    """The plan of a scenario file (each worker plans its own)."""
    return plan_experiment(scenario)


def static_job(scenario: str, seed: int, actions: Sequence[str], duration_s: float | None) -> dict:
    """Every static policy on one seed: ``{policy: (ok, n)}``."""
    plan = plan_of(scenario)
    n = len(plan.sources)
    return {a: static_ratio(plan, seed, [a] * n, None, duration_s) for a in actions}


def mix_job(scenario: str, seeds: Sequence[int], actions: Sequence[str], duration_s: float | None,
            known: dict[str, float]) -> tuple[list[str], float]:
    """The per-source mix of one scenario chosen on ``seeds`` (``known``: static means)."""
    plan = plan_of(scenario)
    n = len(plan.sources)
    start = max(known, key=lambda p: (known[p], p))
    mix, v, _ = best_mix(plan, seeds, actions, start, None, duration_s, {tuple([p] * n): m for p, m in known.items()})
    return mix, v


def assignment_job(scenario: str, seed: int, assignment: Sequence[str], duration_s: float | None) -> tuple[int, int]:
    """One constant per-source assignment on one seed: (ok, n)."""

    return static_ratio(plan_of(scenario), seed, assignment, None, duration_s)


def oracle_job(scenario: str, seed: int, base: Sequence[Sequence[str]], actions: Sequence[str],
               duration_s: float | None, horizon: int | None) -> dict:
    """The oracle on one seed (:func:`testbed.aset.headroom.rollout_oracle`)."""

    r = rollout_oracle(plan_of(scenario), seed, base, actions, None, duration_s, horizon)
    return {"ok": r.ok, "n": r.n, "base_ok": r.base_ok, "fallback": r.fallback, "trials": r.trials,
            "schedule": r.schedule}


def causal_job(scenario: str, seed: int, base: Sequence[str], actions: Sequence[str], samples: int,
               duration_s: float | None, horizon: int | None, min_t: float = 0.0) -> dict:
    """The causal planner on one seed (:func:`testbed.aset.headroom.causal_planner`; base: the mix)."""

    r = causal_planner(plan_of(scenario), seed, base, actions, samples, None, duration_s, horizon, min_t)
    moved = sum(a != b for row in r.schedule for a, b in zip(row, base, strict=True))
    return {"ok": r.ok, "n": r.n, "base_ok": r.base_ok, "trials": r.trials, "schedule": r.schedule,
            "deviations": moved / max(1, len(r.schedule) * len(base))}


def aset_job(scenario: str, seed: int, checkpoint: str, duration_s: float | None) -> dict:
    """ASET's greedy policy on one seed: (ok, n) and how often it chose each action."""

    pol = NumpyPolicy(checkpoint)
    plan = plan_of(scenario)
    env = AsetSimEnv(plan, pol.obs_spec, duration_s or plan.experiment.duration_s, policies=tuple(pol.meta["policies"]))
    pol.check_contexts(env.contexts, f"the simulator env of {scenario}")
    obs, _ = env.reset(seed=seed, options={"sim_seed": seed})
    done, info = False, {}
    while not done:
        obs, _, _, done, info = env.step(pol.act(obs))
    share = env.policy_windows.sum(0) / max(1, env.policy_windows.sum())
    return {"ok": int(env.ep.ok.sum()), "n": int(env.ep.n.sum()),
            "share": {p: round(float(s), 4) for p, s in zip(env.policies, share, strict=True) if s > 0}}


def check_checkpoint(ckpt: Path, scenarios: Sequence[str]) -> NumpyPolicy:
    """Fail at once (not after hours of runs) when the checkpoint cannot drive a scenario; returns
    the checkpoint's policy.

    Raises:
        ValueError: a checkpoint file that cannot be read (cut short, corrupt), naming it; other
            clusters or sources than the scenario's; ObservationSizeError.
    """

    pol = NumpyPolicy(ckpt)
    for s in scenarios:
        pol.check_contexts(plan_contexts(plan_of(s), tuple(pol.meta["policies"]), pol.obs_spec),
                           f"the simulator env of {s}")
    return pol


def agreement_job(scenario: str, seed: int, actions: Sequence[str], duration_s: float | None) -> dict:
    """Pairwise decision agreement of the actions: under each static policy in turn, at every
    window start, for every source and application, every action decides on the dispatcher's
    current options (``random`` / ``round_robin`` on a copy of its state, so the run is unchanged).
    Returns ``{"a|b": [same, total]}``."""
    plan = plan_of(scenario)
    apps = list(plan.experiment.applications)
    counts: dict[str, list[int]] = {f"{a}|{b}": [0, 0] for i, a in enumerate(actions) for b in actions[i + 1:]}
    for run_policy in actions:
        ep = Episode(plan, seed, {h.name: run_policy for h in plan.sources}, None, duration_s)
        while ep.w < ep.n_windows:
            for view in (ep.sim.source_view(s) for s in ep.sources):
                for app in apps:
                    picks = {a: view.would_pick(a, app.deadline_ms, app.min_accuracy, app.family) for a in actions}
                    for key, c in counts.items():
                        a, b = key.split("|")
                        c[0] += int(picks[a] == picks[b])
                        c[1] += 1
            ep.step()
    return counts
