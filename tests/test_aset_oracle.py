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


def test_summary_pairs_headroom_and_capture_on_the_oracle_seeds_only():
    """With the oracle on seeds 1-2 of 4 (``evaluation.oracle_seeds``), the headroom is paired over
    seeds 1-2 and the captured share uses ASET - best static on those same seeds."""
    from testbed.aset.evaluate import summarise

    def row(policy, seed, ok):
        return {"scenario": "s", "kind": "tuning", "policy": policy, "seed": seed, "ok": ok, "n": 100,
                "success_ratio": ok / 100}

    runs = [row("closest", k, 80) for k in (1, 2, 3, 4)] + [row("cloud", k, 50) for k in (1, 2, 3, 4)]
    runs += [row("mix", k, 80) for k in (1, 2, 3, 4)] + [row("oracle", 1, 90), row("oracle", 2, 88)]
    runs += [row("aset", 1, 85), row("aset", 2, 84), row("aset", 3, 80), row("aset", 4, 80)]
    (t,) = summarise(runs, ACTIONS)
    assert t["best_static"] == "closest"
    assert t["headroom"][0] == pytest.approx(0.09) and t["oracle"][2] == 2
    assert t["diff"][0] == pytest.approx(0.0225)  # over all 4 seeds
    assert t["captured"] == pytest.approx(0.045 / 0.09)  # (5 + 4) / 2 pts over (10 + 8) / 2 pts


def test_paired_gain_t():
    import math

    import numpy as np

    from testbed.aset.headroom import paired_gain_t

    assert paired_gain_t(np.array([1.0, 3.0])) == pytest.approx(2.0)  # mean 2, sd sqrt(2), se 1
    assert paired_gain_t(np.array([2.0, 2.0])) == math.inf and paired_gain_t(np.array([0.0, 0.0])) == -math.inf
    assert paired_gain_t(np.array([-1.0, -3.0])) == pytest.approx(-2.0)


def _eval_config(scenario: Path, out: Path, causal: int):
    from testbed.spec.aset import load_aset_config

    cfg, base = load_aset_config(REPO / "experiments" / "aset-tiny.yaml")
    ev = cfg.evaluation.model_copy(update={"scenarios": [str(scenario)], "out_dir": str(out), "duration_s": 6.0,
                                           "oracle_horizon": 2, "causal_samples": causal})
    return cfg.model_copy(update={"evaluation": ev, "actions": ACTIONS}), base


def test_evaluate_with_the_causal_planner_adds_its_rows_paired_on_the_oracle_seeds(switch_path, tmp_path):
    """``testbed evaluate --causal K`` (evaluation.causal_samples): the planner runs over the mix on
    the oracle's seeds, on the same queries, and beats the mix there (the scheduled change at 3 s);
    it is not a static policy, and its schedules are saved."""
    import json

    from testbed.aset.evaluate import CAUSAL, evaluate

    cfg, base = _eval_config(switch_path, tmp_path, causal=4)
    res = evaluate(cfg, base, headroom_only=True, workers=1, progress=False, agreement_check=False)
    rows = {(r["policy"], r["seed"]): r for r in res.runs}
    for k in (1, 2):
        c = rows[CAUSAL, k]
        assert c["n"] == rows["mix", k]["n"] == rows["closest", k]["n"]  # common random numbers
        assert c["ok"] > rows["mix", k]["ok"] and 0 < c["deviations"] < 1
    (t,) = res.table
    assert t["best_static"] == "closest" and CAUSAL not in (t["best_static"], t["winner"])
    assert t["causal_gain"][0] > 0 and 0 < t["causal_share"] <= 1.5
    doc = json.loads((res.out_dir / "oracle.json").read_text())
    saved = doc["causal"]["switch"]
    assert set(saved) == {"tuning-1", "tuning-2"} and all(len(s[0]) == 1 for s in saved.values())
    assert doc["causal_settings"] == {"samples": 4, "min_t": 1.64, "horizon_windows": 2}
    md = (res.out_dir / "results.md").read_text()
    assert "causal - mix (pts)" in md and "causal planner: 4 sampled futures per decision" in md


def test_evaluate_refuses_the_causal_planner_on_a_batching_cluster_before_any_run(tmp_path):
    from testbed.aset.evaluate import evaluate
    from testbed.core.errors import InputError

    d = yaml.safe_load((REPO / "experiments" / "triangle.yaml").read_text())
    d["clusters"][0]["server"] = {"max_batch": 4, "max_queue_delay": "5ms"}
    d["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    scen = tmp_path / "batching.yaml"
    scen.write_text(yaml.safe_dump(d))
    cfg, base = _eval_config(scen, tmp_path / "ev", causal=2)
    with pytest.raises(InputError, match=rf"{d['clusters'][0]['name']}.*batch"):
        evaluate(cfg, base, headroom_only=True, workers=1, progress=False)
    assert not (tmp_path / "ev").exists()  # nothing ran, nothing written


def test_one_sampled_future_with_a_t_rule_and_too_many_are_refused_before_any_run(switch_path, tmp_path):
    """A breaker's review: at K = 1 the t rule passed any positive gain (no spread); K had no bound."""
    from testbed.aset.evaluate import evaluate
    from testbed.cli.main import main
    from testbed.core.errors import InputError

    cfg, base = _eval_config(switch_path, tmp_path / "ev", causal=1)
    with pytest.raises(InputError, match="needs at least 2 sampled futures"):
        evaluate(cfg, base, headroom_only=True, workers=1, progress=False)
    assert not (tmp_path / "ev").exists()
    with pytest.raises(ValueError, match="needs samples >= 2"):
        causal_planner(plan_experiment(switch_path), 1, ["closest"], ACTIONS, samples=1, min_t=1.64)
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", str(REPO / "experiments" / "aset-tiny.yaml"), "--headroom", "--causal", "65"])
    assert exc.value.code == 2


def test_summary_of_the_causal_planner_pairs_it_with_the_mix_the_oracle_and_aset():
    from testbed.aset.evaluate import summarise

    def row(policy, seed, ok):
        return {"scenario": "s", "kind": "tuning", "policy": policy, "seed": seed, "ok": ok, "n": 100,
                "success_ratio": ok / 100}

    runs = [row(p, k, ok) for p, ok in (("closest", 80), ("cloud", 50), ("mix", 80)) for k in (1, 2, 3)]
    runs += [row("oracle", 1, 90), row("oracle", 2, 88), row("causal", 1, 86), row("causal", 2, 84)]
    runs += [row("aset", 1, 85), row("aset", 2, 84), row("aset", 3, 80)]
    (t,) = summarise(runs, ACTIONS)
    assert t["best_static"] == "closest" and t["causal"][2] == 2
    assert t["causal_gain"][0] == pytest.approx(0.05)  # (6 + 4) / 2 pts over the mix
    assert t["causal_share"] == pytest.approx(0.05 / 0.09)  # of the oracle's (10 + 8) / 2 pts over the mix
    assert t["aset_vs_causal"][0] == pytest.approx(-0.005)  # (-1 + 0) / 2 pts, on the planner's seeds
