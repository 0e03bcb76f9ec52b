"""Specialization for one experiment (testbed specialize) and the confidence gate of gated checkpoints
(docs/aset.md, "Specialization" and "The confidence gate"); gated checkpoints run through the one seam
(testbed.aset.jobs.agent_job: testbed simulate's and evaluate's loop)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.agent.checkpoint import CheckpointError, read_checkpoint
from testbed.agent.features import INPUT_SIZE, LOCAL_FEATURES, POLICY_FEATURES
from testbed.agent.gate import GatedPolicy, export_gated, input_width
from testbed.aset.generator import draw_scenario, plan_document
from testbed.aset.jobs import agent_job
from testbed.aset.specialize import OFF_MARGIN, Costs, Settings, specialize, tuning_seeds, variant
from testbed.model.policies import CATALOGUE
from testbed.plan.build import plan_experiment
from testbed.spec.aset import ObservationSpec
from testbed.spec.experiment import AsetSpec

POLICIES = tuple(CATALOGUE)
SPEC = ObservationSpec()
#: The column of the first per-policy feature (``e2e``) of the scorer's input.
ROW0 = len(LOCAL_FEATURES)


def _member(weight: float, width: int, col: int = ROW0) -> list[np.ndarray]:
    """A one-layer scorer: Q(s, p) = weight x input[col] (a linear read of one feature)."""
    w = np.zeros((width, 1), np.float32)
    w[col, 0] = weight
    return [w, np.zeros(1, np.float32)]


def _state(hot: int) -> tuple[np.ndarray, np.ndarray]:
    """(local, per_policy) where only policy ``hot`` has its first per-policy feature set to 1."""
    per = np.zeros((len(POLICIES), len(POLICY_FEATURES)), np.float32)
    per[hot, 0] = 1.0
    return np.zeros(len(LOCAL_FEATURES), np.float32), per


def test_gate_keeps_the_plan_when_the_ensemble_disagrees():
    srcs = ("sa", "sb")
    width = input_width(len(srcs))
    plan = {"sa": "min_latency", "sb": "closest"}
    cloud = POLICIES.index("cloud")
    # members disagree on cloud's gain (+10, -10, +9, -9 points): the lower bound is far below 0
    split = GatedPolicy.from_members([_member(w, width) for w in (10, -10, 9, -9)], POLICIES, SPEC, plan,
                                     sources=srcs, margin=0.5)
    for s in srcs:
        actor = split.for_source(s)
        assert actor.initial == plan[s]
        mean, lower = actor.bounds(*_state(cloud))
        assert lower[cloud] < 0 < max(abs(mean[cloud]), 1e-9) + 1
        assert POLICIES[actor.act(*_state(cloud))] == plan[s]
    # the same state with members that agree (+10, +9.5, +10.5, +9): cloud's lower bound beats the margin
    agree = GatedPolicy.from_members([_member(w, width) for w in (10, 9.5, 10.5, 9)], POLICIES, SPEC, plan,
                                     sources=srcs, margin=0.5)
    assert POLICIES[agree.for_source("sa").act(*_state(cloud))] == "cloud"
    # ... unless the margin is above that bound
    assert POLICIES[agree.with_margin(20).for_source("sa").act(*_state(cloud))] == "min_latency"
    with pytest.raises(ValueError, match="not one of the sources"):
        agree.for_source("sz")


def test_gated_checkpoint_round_trip_and_refusals(tmp_path):
    width = input_width(2)
    members = [_member(w, width) for w in (1, 2, 3)]
    path = tmp_path / "spec"
    export_gated(members, path, policies=POLICIES, obs_spec=SPEC, reference={"sa": "cloud", "sb": "random"},
                 sources=("sa", "sb"), margin=1.5, provenance={"experiment": "x"})
    assert read_checkpoint(path).kind == "gated"
    g = GatedPolicy(path)
    assert g.specialized and g.provenance == {"experiment": "x"} and g.margin == 1.5
    assert g.reference_of("sb") == "random" and len(g.members) == 3
    with pytest.raises(ValueError, match="at least 2"):
        export_gated(members[:1], tmp_path / "one", policies=POLICIES, obs_spec=SPEC, reference="min_latency",
                     margin=0)
    with pytest.raises(ValueError, match="not among the policies"):
        export_gated([_member(1, INPUT_SIZE)] * 2, tmp_path / "bad", policies=POLICIES, obs_spec=SPEC,
                     reference="nonesuch", margin=0)
    meta = json.loads((tmp_path / "spec.json").read_text())
    meta["features"]["policy_features"] = meta["features"]["policy_features"][:-1]
    (tmp_path / "spec.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="features changed"):
        GatedPolicy(path)


def _run(path: Path, seed: int, checkpoint: Path) -> dict:
    """The checkpoint driving every source of the experiment at ``path`` on one seed (the one loop)."""
    return agent_job(str(path), seed, AsetSpec(checkpoint=str(checkpoint)).model_dump_json(), None)


def _tiny_experiment(tmp_path: Path, duration: str = "6s") -> Path:
    """A generated training scenario (a topology never in the test or validation sets; bursts, 3
    sources, 6 s) where the static policies differ, as an experiment file."""
    doc = draw_scenario("train", 20)
    doc.pop("x_generated")
    doc["duration"] = duration
    plan_document(doc)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_zero_shot_general_stays_on_its_default_when_the_lower_bound_is_below_the_margin(tmp_path):
    cloud = POLICIES.index("cloud")
    # every member says cloud gains about 2 points (1.5 .. 2.5): mean 2, lower bound ~1.3
    gated = GatedPolicy.from_members([_member(w, INPUT_SIZE) for w in (1.5, 2.0, 2.5, 2.0)], POLICIES, SPEC,
                                     "min_latency", margin=3.0)
    actor = gated.for_source("any source")
    mean, lower = actor.bounds(*_state(cloud))
    assert mean[cloud] == pytest.approx(2.0) and 0 < lower[cloud] < 3.0
    assert POLICIES[actor.act(*_state(cloud))] == "min_latency"  # lower bound below the margin: the default
    assert POLICIES[gated.with_margin(1.0).for_source("x").act(*_state(cloud))] == "cloud"
    # on a whole episode: scorers that disagree everywhere never take it off its default
    rng = np.random.default_rng(5)
    noisy = [[rng.normal(0, 1, (INPUT_SIZE, 8)).astype(np.float32), np.zeros(8, np.float32),
              rng.normal(0, 1, (8, 1)).astype(np.float32), np.zeros(1, np.float32)] for _ in range(4)]
    wide = GatedPolicy.from_members(noisy, POLICIES, SPEC, "min_latency", margin=50.0)
    path = _tiny_experiment(tmp_path)
    n_src = len(plan_experiment(path).sources)
    res = _run(path, 3, wide.export(tmp_path / "wide"))
    assert set(res["shares"]) == {"min_latency"} and res["n"] > 0
    assert sum(len(x) for x in res["schedule"].values()) == 12 * n_src
    # with no margin the same scorers do leave it (so the gate, not the scorers, kept it there)
    assert set(_run(path, 3, wide.with_margin(-50.0).export(tmp_path / "loose"))["shares"]) != {"min_latency"}


def test_variant_redraws_times_rates_and_staleness_in_order(tmp_path):
    exp = plan_experiment(_tiny_experiment(tmp_path)).experiment
    rng = np.random.default_rng(1)
    vs = [variant(exp, rng) for _ in range(20)]
    for v in vs:
        assert v.report_interval_s in (exp.report_interval_s, exp.report_interval_s / 2)
        for w, w0 in zip(v.workload, exp.workload, strict=True):
            assert 0.55 < w.rates_qps[0] / w0.rates_qps[0] < 1.8
    assert len({v.report_interval_s for v in vs}) == 2
    assert len({v.workload[0].rates_qps[0] for v in vs}) == 20
    doc = draw_scenario("train", 11)  # a cluster failure: cluster_down then cluster_up
    doc.pop("x_generated")
    ev = plan_document(doc).experiment
    assert [e.kind for e in ev.events] == ["cluster_down", "cluster_up"]
    times = set()
    for _ in range(20):
        v = variant(ev, rng)
        down, up = (float(e.at_s) for e in v.events)
        assert 0 <= down < up < 0.95 * ev.duration_s + 1e-9  # moved and stretched, order kept
        times.add(down)
    assert len(times) == 20


def _small(**kw) -> Settings:
    # nominal costs of a slow machine: the budget plans the least work (one episode per round)
    base = dict(tuning_seeds=2, check_seeds=1, rounds=2, members=2, epochs=2, futures=1, probe_every=3,
                mix_share=0.05, check_margins=(0.0,), min_episodes=1, wall_guard=False, costs=Costs(static_s=2.0))
    return Settings(**(base | kw))


def test_specialize_is_deterministic_per_seed(tmp_path):
    path = _tiny_experiment(tmp_path, "3s")
    a = specialize(path, tmp_path / "a", budget_s=10, seed=3, workers=2, settings=_small())
    b = specialize(path, tmp_path / "b", budget_s=10, seed=3, workers=2, settings=_small())
    assert b.mix == a.mix and b.check == a.check
    assert a.tuning_seeds == tuning_seeds(3, 2) and tuning_seeds(4, 2) != a.tuning_seeds
    assert not set(a.tuning_seeds) & set(a.check_seeds) and min(a.tuning_seeds) > 1000
    assert a.samples > 0 and len(a.rounds) == 2 and a.rounds[1]["learner"]
    ja, jb = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    for j in (ja, jb):
        for k in ("wall_s", "cpu_s", "phases_s"):
            j["provenance"].pop(k)
    assert ja == jb  # same seed: the same plan, labels, rounds, check and margin
    with np.load(tmp_path / "a.npz") as na, np.load(tmp_path / "b.npz") as nb:
        assert sorted(na.files) == sorted(nb.files)
        assert all(np.array_equal(na[k], nb[k]) for k in na.files)
    g = GatedPolicy(tmp_path / "a")
    assert g.specialized and g.sources == tuple(sorted(s["name"] for s in yaml.safe_load(path.read_text())
                                                                 ["sources"]))
    assert g.margin in (Settings().margin, OFF_MARGIN)
    assert [g.reference_of(s) for s in g.sources] == a.mix


def test_a_margin_chosen_later_applies_with_the_checks_verdict(tmp_path):
    from testbed.aset.specialize import CHECK_MARGINS, apply_margin, margin_after_check

    width = input_width(2)
    by = {str(float(m)): v for m, v in zip(CHECK_MARGINS, (-0.4, -0.1, 0.3, 0.2, 0.0, 0.1), strict=True)}
    meta = {"check": {"by_margin": by}}
    assert margin_after_check(meta, 0.5) == 0.5
    assert margin_after_check(meta, 0.25) == OFF_MARGIN  # the agent gated at 0.25 was below the plan
    assert margin_after_check(meta, 2.0) == OFF_MARGIN  # level with it: not above
    with pytest.raises(ValueError, match="measured"):
        margin_after_check(meta, 0.75)
    export_gated([_member(w, width) for w in (1, 2)], tmp_path / "s", policies=POLICIES, obs_spec=SPEC,
                 reference={"sa": "cloud", "sb": "random"}, sources=("sa", "sb"), margin=0.5, provenance=meta)
    assert apply_margin(tmp_path / "s", 1.0, {"on": "test"}) == 1.0
    assert GatedPolicy(tmp_path / "s").margin == 1.0
    assert apply_margin(tmp_path / "s", 0.0, {"on": "test"}) == OFF_MARGIN
    g = GatedPolicy(tmp_path / "s")
    assert g.margin == OFF_MARGIN and g.provenance["margin_choice"]["asked"] == 0.0


def test_a_gated_run_that_never_leaves_its_plan_is_the_plans_static_run(tmp_path):
    from testbed.aset.episode import run_static

    path = _tiny_experiment(tmp_path)
    plan = plan_experiment(path)
    srcs = sorted(h.name for h in plan.sources)
    mix = dict(zip(srcs, ["least_loaded", "min_latency", "max_accuracy"][:len(srcs)], strict=True))
    width = input_width(len(srcs))
    ckpt = export_gated([_member(w, width) for w in (5, -5, 4)], tmp_path / "plan", policies=POLICIES,
                        obs_spec=SPEC, reference=mix, sources=srcs, margin=OFF_MARGIN)
    for seed in (1, 2):
        res = _run(path, seed, ckpt)  # the first window too runs on the plan (the selector's initial_policy)
        ep = run_static(plan, seed, [mix[s] for s in srcs])
        assert (res["ok"], res["n"]) == (int(ep.ok.sum()), int(ep.n.sum()))
        assert {s: set(x) for s, x in res["schedule"].items()} == {s: {mix[s]} for s in srcs}


def test_ascent_move_takes_the_best_candidate_that_passes_the_paired_test():
    """Source 0 of a two-source mix: 'a' has the highest mean gain but on one seed only (t ~ 1), 'b' a
    smaller, steady gain (t ~ 9). best_mean tests 'a' alone and stays; best_passing moves to 'b'."""
    from testbed.aset.specialize import ascent_move

    pols = ["cur", "a", "b", "c"]
    vals = np.array([0.50, 0.50, 0.50, 0.50])
    seen = {("a", "x"): np.array([0.50, 0.50, 0.50, 0.62]),  # +3 points in mean, one seed
            ("b", "x"): np.array([0.52, 0.52, 0.53, 0.52]),  # +2.25 points, every seed
            ("c", "x"): np.array([0.40, 0.40, 0.40, 0.40])}
    cands = list(seen)
    assert ascent_move(cands, seen, vals, 0, pols, 1.64, "best_mean") is None
    move, gain, t_stat = ascent_move(cands, seen, vals, 0, pols, 1.64, "best_passing")
    assert move == ("b", "x") and gain == pytest.approx(2.25) and t_stat > 1.64
    assert ascent_move(cands, seen, vals, 0, pols, 0.5, "best_mean")[0] == ("a", "x")  # 'a' passes a weaker test
    seen[("b", "x")] = np.array([0.52, np.nan, 0.53, np.nan])  # seeds without queries are left out of the pairs
    assert ascent_move(cands, seen, vals, 0, pols, 1.64, "best_passing")[1] == pytest.approx(2.5)
    tie = {("t", "x"): vals + 1e-13}  # float rounding, not a gain: no move (a cycle of ties would never end)
    assert ascent_move(list(tie), tie, vals, 0, ["cur", "t"], 0.0, "best_mean") is None
    with pytest.raises(Exception, match="ascent rule 'best'"):
        ascent_move(cands, seen, vals, 0, pols, 1.64, "best")


class _Landscape:
    """A runner whose static episodes score an assignment from a table (the same on every seed, with a
    common per-seed offset): pure logic of the plan search, no simulator."""

    def __init__(self, table: dict[tuple[str, ...], float]):
        self.table, self.runs = table, 0

    def map(self, fn, tasks, what, deadline=None, status=""):
        self.runs += len(tasks)
        return [(round(1000 * (self.table[tuple(a)] + 1e-3 * (k % 3))), 1000) for _, _, k, a in tasks]


def test_restarted_ascent_keeps_the_best_end_point_over_its_starts(monkeypatch):
    """Two sources, three policies: from the best static (p, p) the ascent in the listed order moves
    source 0 to q and ends at (q, p) = 0.55; visiting source 1 first it ends at (p, r) = 0.60. Two
    sources have two orders, so orders=3 starts twice (plan_starts) and finds 0.60."""
    import testbed.aset.specialize as sp
    from testbed.aset.specialize import Report, plan_starts, search_plan

    monkeypatch.setattr(sp, "CATALOGUE", ["p", "q", "r"])  # the search's policies

    table = {("p", "p"): 0.50, ("q", "q"): 0.45, ("r", "r"): 0.30, ("q", "p"): 0.55, ("r", "p"): 0.40,
             ("p", "q"): 0.53, ("p", "r"): 0.60, ("q", "r"): 0.50, ("r", "q"): 0.20}

    def plan(orders: int) -> Report:
        rep = Report("x", 0.0, 1, tuning_seeds(1, 4), [])
        search_plan(_Landscape(table), "{}", ".", ["s0", "s1"], rep, Settings(orders=orders, tuning_seeds=4),
                    float("inf"), None)
        return rep

    assert [o for _, o in plan_starts(["p", "q", "r"], {"p": 0.5, "q": 0.45, "r": 0.3}, 2,
                                      Settings(orders=3), 1)] == [[0, 1], [1, 0]]
    one = plan(1)
    assert one.mix == ["q", "p"] and one.mix_ratio == pytest.approx(0.551, abs=1e-3)
    three = plan(3)
    assert three.mix == ["p", "r"] and three.mix_ratio == pytest.approx(0.601, abs=1e-3)
    assert [st["mix"] for st in three.mix_starts] == [["q", "p"], ["p", "r"]]
    assert [(m["start"], m["source"], m["to"]) for m in three.mix_moves] == [(0, "s0", "q"), (1, "s1", "r")]
    assert three.mix_candidates == len(table) - 3 - 1  # every non-static assignment once, (r, q) never


def test_plan_starts_draws_distinct_orders():
    """Seed 1's draws for three sources repeat the listed order; the repeat is skipped, and no more
    orders than the sources have are asked for. Four sources draw distinct orders at once: the same
    as before any skipping."""
    from testbed.aset.specialize import plan_starts

    def orders(n: int, k: int, statics: int = 1) -> list[list[int]]:
        st = {"p": 0.5, "q": 0.4}
        return [o for _, o in plan_starts(["p", "q"], st, n, Settings(orders=k, start_statics=statics), 1)]

    three = orders(3, 3)
    assert len(three) == 3 and len({tuple(o) for o in three}) == 3 and three[:2] == [[0, 1, 2], [2, 0, 1]]
    assert len({tuple(o) for o in orders(3, 6)}) == 6 and len(orders(3, 9)) == 6  # 3! orders at most
    assert orders(4, 3) == [[0, 1, 2, 3], [2, 0, 1, 3], [3, 1, 0, 2]]
    assert orders(1, 3) == [[0]]
    both = plan_starts(["p", "q"], {"p": 0.5, "q": 0.6}, 3, Settings(orders=2, start_statics=2), 1)
    assert [p for p, _ in both] == ["q", "q", "p", "p"] and both[0][1] == both[2][1]
