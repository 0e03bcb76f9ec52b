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
from testbed.aset.headroom import best_mix, rollout_oracle, static_ratio
from testbed.plan import plan_experiment

REPO = Path(__file__).resolve().parent.parent
ACTIONS = ["closest", "cloud"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
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
    return plan_experiment(path)


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
