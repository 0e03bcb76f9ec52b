"""Headroom measures (testbed/aset/headroom.py, issue 13): the oracle never falls below the best
static policy or the per-source mix on the same seeds, and it switches when the best policy changes.

The scenario: the triangle, one source at A, a fast edge at B (RTT 4 ms) and a small cloud behind C
(RTT 12 ms, 0.15 core: with the request handling its quota also pays, it queues: part of its
answers miss the 28 ms deadline). At 3 s the link
A-B gets 40 ms of delay: the route to B goes round through C (RTT 26 ms + the path's queueing), too
slow, while the cloud (RTT 22 ms) still makes it for most queries. The dispatcher keeps the planned
RTTs, so ``closest`` is best before 3 s and ``cloud`` after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.aset.episode import Episode, run_static
from testbed.aset.headroom import best_mix, causal_planner, continuation_ok, rollout_oracle, static_ratio
from testbed.plan.build import plan_experiment

REPO = Path(__file__).resolve().parent.parent
ACTIONS = ["closest", "cloud"]


@pytest.fixture(scope="module")
def switch_path(tmp_path_factory) -> Path:
    d = {"name": "switch", "seed": 1, "duration": "6s", "policy": "closest", "report_interval": "500ms",
         "topology": {"source": str(REPO / "topologies" / "triangle.yaml"), "host_bandwidth": "1Gbit/s"},
         "cloud": {"attach_to": "C", "delay": "1ms", "bandwidth": "1Gbit/s"},
         "clusters": [{"name": "edgeb", "site": "B", "tier": "far_edge", "cpu_cores": 0.5, "workers": 1,
                       "queue_limit": 16, "models": ["digits_small"]},
                      {"name": "cloudc", "site": "cloud", "tier": "cloud", "cpu_cores": 0.15, "workers": 1,
                       "queue_limit": 64, "models": ["digits_large"]}],
         "sources": [{"name": "srca", "site": "A"}],
         "applications": [{"name": "digits", "deadline": "28ms", "min_accuracy": 0.5}],
         "workload": [{"application": "digits", "sources": "all", "rate_qps": 40}],
         "events": [{"at": "3s", "kind": "link_delay", "link": ["A", "B"], "delay": "40ms"}]}
    path = tmp_path_factory.mktemp("oracle") / "switch.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture(scope="module")
def plan(switch_path):
    return plan_experiment(switch_path)


def test_stepping_window_by_window_equals_one_run_and_clones_continue_exactly(plan):
    whole = run_static(plan, 3, ["closest"])
    stepped = Episode(plan, 3, {"srca": "closest"})
    while stepped.w < stepped.n_windows:
        stepped.step()
        if stepped.w == 5:
            twin = stepped.clone()
    stepped.finish()
    assert (whole.ok == stepped.ok).all() and (whole.n == stepped.n).all() and whole.queries > 150
    twin.finish()
    assert (twin.ok == stepped.ok).all() and (twin.n == stepped.n).all()


@pytest.mark.parametrize("horizon", [None, 2])
def test_oracle_never_below_best_static_nor_mix_on_the_same_seeds(plan, horizon):
    seeds = [1, 2, 3]
    means = {a: sum(ok / n for ok, n in (static_ratio(plan, s, [a]) for s in seeds)) / len(seeds) for a in ACTIONS}
    best = max(means, key=means.get)
    mix, _, _ = best_mix(plan, seeds, ACTIONS, best)
    for s in seeds:
        r = rollout_oracle(plan, s, [mix, [best]], ACTIONS, horizon_windows=horizon)
        for assignment in (mix, [best]):
            ok, n = static_ratio(plan, s, assignment)
            assert r.n == n and r.ok >= ok
    assert r.success_ratio > max(means.values()) + 0.1  # switching is worth a lot here


def test_oracle_switches_when_the_best_policy_changes(plan):
    """From the policy that is best before the change, the oracle keeps it until the change and
    switches in the window the change happens (full look-ahead)."""
    for seed in (1, 2, 3, 4):
        r = rollout_oracle(plan, seed, ["closest"], ACTIONS, horizon_windows=None)
        first = [row[0] for row in r.schedule]
        assert first[:6] == ["closest"] * 6  # before the degradation at 3 s (window 6)
        assert first[6] == "cloud"  # the window the degradation starts in
        assert first[6:].count("cloud") >= 4


def test_causal_planner_scores_on_sampled_futures_not_the_seeds_own(plan):
    """The causal planner's score of a candidate depends on the present only: two copies of one
    episode that share the present (window 4) but not the future (one copy's streams reseeded)
    score every candidate alike once the future is sampled, and differently with their own."""
    ep = Episode(plan, 2, {"srca": "closest"})
    ep.run_to(4)
    other = ep.clone()
    other.sim.reseed((99,))  # the same present, another future
    own, sampled = [], []
    for cand in (["closest"], ["cloud"]):
        own.append((continuation_ok(ep, 4, 3, ["closest"], cand), continuation_ok(other, 4, 3, ["closest"], cand)))
        sampled.append((continuation_ok(ep, 4, 3, ["closest"], cand, resample=(4, 0)),
                        continuation_ok(other, 4, 3, ["closest"], cand, resample=(4, 0))))
    assert all(a == b for a, b in sampled)
    assert any(a != b for a, b in own)  # the reseeded copy's own future does differ
    assert sampled[0] != sampled[1] or sampled[0][0] > 0


def test_reseed_is_refused_between_report_boundaries(plan):
    from testbed.sim import SimError

    ep = Episode(plan, 1, {"srca": "closest"})
    ep.sim.run_until(0.25)  # arrivals are drawn to the next report, at 0.5 s
    with pytest.raises(SimError, match="report boundary"):
        ep.sim.reseed((0,))


def test_mmpp_reseed_redraws_the_pending_state_change():
    import numpy as np

    from testbed.model.arrivals import MMPP

    p = MMPP(np.random.default_rng(1), [10.0, 100.0], [1.0, 1.0])
    p.times(0.0, 0.5)
    ahead = p.until
    p.reseed(np.random.default_rng(7), 0.5)
    assert p.until > 0.5 and p.until != ahead and p.state in (0, 1)


def test_causal_planner_switches_after_the_change_and_beats_both_statics(plan):
    """Without the seed's future, with 4 sampled futures per candidate, the planner still finds
    the scheduled degradation at 3 s (window 6): it is in the scenario, which it knows."""
    for seed in (1, 2):
        r = causal_planner(plan, seed, ["closest"], ACTIONS, samples=4)
        first = [row[0] for row in r.schedule]
        assert first[:5].count("closest") >= 4 and first[7:].count("cloud") >= 4
        assert not r.fallback and r.trials == 4 * 2 * len(r.schedule)  # 2 candidates per window, 4 futures each
        for a in ACTIONS:
            ok, n = static_ratio(plan, seed, [a])
            assert r.n == n and r.ok > ok
    # a t threshold no gain with spread reaches: it keeps the base, whose run it then is
    keep = causal_planner(plan, 1, ["closest"], ACTIONS, samples=4, min_t=1e9)
    assert keep.ok == keep.base_ok and all(row == ["closest"] for row in keep.schedule)
    with pytest.raises(ValueError, match="samples"):
        causal_planner(plan, 1, ["closest"], ACTIONS, samples=0)
    with pytest.raises(ValueError, match="one policy per source"):
        causal_planner(plan, 1, ["closest", "cloud"], ACTIONS, samples=1)


def _summary(per_seed: dict[str, list[float]], agents=("ASET",)) -> dict:
    """The evaluation's summary of one scenario from per-seed success ratios (evaluation seeds 3-6)."""
    from testbed.aset.evaluate import Protocol, _summary

    class _Plan:
        experiment = type("E", (), {"name": "s"})()
        sources = [1]

    p = Protocol(tuning=[1, 2], seeds=[3, 4, 5, 6], actions=ACTIONS, reference_seeds=2)
    chosen = {"best": "closest", "fresh": None, "mix": ["closest"], "tuning_means": {"closest": 0.8, "cloud": 0.5}}
    ps = {"best static": per_seed["closest"], **per_seed}
    return _summary("s.yaml", _Plan(), p, chosen, ps, {a: {"closest": 1.0} for a in agents}, list(agents))


def test_headroom_is_the_mix_s_or_the_planner_s_gain_never_the_oracle_s():
    """Paired per seed; the oracle and the causal planner on the reference seeds only (NaN after):
    their gains pair over those seeds; the headroom is the larger of the mix's and the planner's."""
    nan = float("nan")
    t = _summary({"closest": [0.80] * 4, "cloud": [0.5] * 4, "mix": [0.81, 0.82, 0.81, 0.82],
                  "oracle": [0.90, 0.88, nan, nan], "causal planner": [0.86, 0.84, nan, nan],
                  "ASET": [0.85, 0.84, 0.80, 0.80]})
    assert t["best_static"] == "closest"
    assert t["gains"]["oracle"]["mean"] == pytest.approx(9.0) and t["gains"]["oracle"]["n"] == 2
    assert t["gains"]["causal planner"]["mean"] == pytest.approx(5.0) and t["rows"]["causal planner"]["seeds"] == 2
    assert t["headroom"] == {"by": "causal planner", "points": pytest.approx(5.0)}
    a = t["agents"]["ASET"]
    assert a["vs_best"]["mean"] == pytest.approx(2.25) and a["vs_best"]["n"] == 4  # over all 4 seeds
    assert a["vs_causal"]["mean"] == pytest.approx(-0.5) and a["vs_causal"]["n"] == 2  # the planner's seeds
    assert a["vs_mix"]["mean"] == pytest.approx(0.75) and 0 < a["vs_mix"]["p"] < 1
    assert "capture" not in str(t)


def test_paired_gain_t():
    import math

    import numpy as np

    from testbed.aset.headroom import paired_gain_t

    assert paired_gain_t(np.array([1.0, 3.0])) == pytest.approx(2.0)  # mean 2, sd sqrt(2), se 1
    assert paired_gain_t(np.array([2.0, 2.0])) == math.inf and paired_gain_t(np.array([0.0, 0.0])) == -math.inf
    assert paired_gain_t(np.array([-1.0, -3.0])) == pytest.approx(-2.0)


def _protocol(causal: int, **kw):
    from testbed.aset.evaluate import Protocol

    return Protocol(**{"tuning": [1, 2], "seeds": [3, 4, 5, 6, 7], "actions": ACTIONS, "reference_seeds": 5,
                       "causal_samples": causal, "horizon": 2, "duration_s": 6.0, "fresh": False, **kw})


def test_evaluate_with_the_causal_planner_adds_its_rows_paired_on_the_reference_seeds(switch_path, tmp_path):
    """``testbed evaluate --oracle 5 --causal K``: the planner runs over the mix (chosen on the tuning
    seeds) on the reference seeds, on the same queries, and beats the mix there (the scheduled
    change at 3 s); the oracle is reported beside it, never as the headroom."""
    import json

    from testbed.aset.evaluate import CAUSAL, ORACLE, evaluate

    res = evaluate([str(switch_path)], _protocol(causal=4), tmp_path / "ev", workers=1, progress=False)
    (t,) = res.rows
    assert t["best_static"] == "closest" and t["rows"][CAUSAL]["seeds"] == t["rows"][ORACLE]["seeds"] == 5
    assert t["gains"][CAUSAL]["mean"] > 0 and t["gains"][CAUSAL]["n"] == 5
    assert t["headroom"]["by"] in ("mix", CAUSAL) and t["headroom"]["points"] >= t["gains"][CAUSAL]["mean"]
    doc = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert doc["protocol"]["reference_seeds"] == [3, 4, 5, 6, 7] and not doc["protocol"]["full_strength"]
    runs = (tmp_path / "ev" / "runs.csv").read_text()
    assert "switch,tuning,closest,1," in runs and "switch,evaluation,causal planner,7," in runs
    md = (tmp_path / "ev" / "results.md").read_text()
    assert "FEWER than the protocol's 20" in md and "| causal planner" in md


def test_evaluate_refuses_the_causal_planner_on_a_batching_cluster_before_any_run(tmp_path):
    from testbed.aset.evaluate import evaluate
    from testbed.core.errors import InputError

    d = yaml.safe_load((REPO / "experiments" / "triangle.yaml").read_text())
    d["clusters"][0]["server"] = {"max_batch": 4, "max_queue_delay": "5ms"}
    d["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    scen = tmp_path / "batching.yaml"
    scen.write_text(yaml.safe_dump(d))
    with pytest.raises(InputError, match=rf"{d['clusters'][0]['name']}.*batch"):
        evaluate([str(scen)], _protocol(causal=2), tmp_path / "ev", workers=1, progress=False)
    assert not (tmp_path / "ev").exists()  # nothing ran, nothing written


def test_one_sampled_future_with_a_t_rule_too_many_and_too_few_seeds_are_refused_before_any_run(switch_path, tmp_path):
    """At K = 1 the t rule passed any positive gain (no spread); K has a bound; the references need
    at least 5 seeds (their CIs)."""
    from testbed.aset.evaluate import evaluate
    from testbed.cli.main import main
    from testbed.core.errors import InputError

    with pytest.raises(InputError, match="needs at least 2 sampled futures"):
        evaluate([str(switch_path)], _protocol(causal=1), tmp_path / "ev", workers=1, progress=False)
    with pytest.raises(InputError, match="at least 5 evaluation seeds"):
        evaluate([str(switch_path)], _protocol(causal=2, reference_seeds=2), tmp_path / "ev", progress=False)
    assert not (tmp_path / "ev").exists()
    with pytest.raises(ValueError, match="needs samples >= 2"):
        causal_planner(plan_experiment(switch_path), 1, ["closest"], ACTIONS, samples=1, min_t=1.64)
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", str(REPO / "experiments" / "aset-tiny.yaml"), "--headroom", "--causal", "65"])
    assert exc.value.code == 2


def test_claims_over_scenarios_are_holm_corrected():
    """"Above the best static policy beyond the CI in k of n" is counted after Holm's correction over
    the scenarios."""
    from testbed.aset.evaluate import _claims
    from testbed.core.util import holm

    assert holm([0.01, 0.02, 0.5]) == [True, True, False]
    assert holm([0.01, 0.03, 0.5]) == [True, False, False]  # 0.03 > 0.05 / 2
    assert holm([0.04, 0.04, 0.04]) == [False, False, False]
    rows = [{"gains": {"ASET": {"mean": m, "ci": 1.0, "n": 20, "p": p}}} for m, p in ((2.0, 0.01), (1.0, 0.03),
                                                                                          (-3.0, 0.001))]
    c = _claims(rows, ["ASET"])["ASET"]
    assert (c["above"], c["below"], c["scenarios"]) == (2, 1, 3) and c["worst_gain"] == -3.0
    for r in rows:  # each beyond the CI alone (p 0.02 < 0.05), none after the correction over 3 (0.02 > 0.05 / 3)
        r["gains"]["ASET"]["p"] = 0.02
    c = _claims(rows, ["ASET"])["ASET"]
    assert (c["above"], c["below"]) == (0, 0)
