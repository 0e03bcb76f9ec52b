"""The policy catalogue: exact picks per policy, fallback, determinism of the stateful ones."""

import numpy as np
import pytest

from testbed.model import policies as pol
from testbed.model.dispatch import expected_wait_ms
from testbed.model.policies import CATALOGUE, Context, Option, decide

# near: 4 ms RTT, loaded; mid: 10 ms, idle; cloud: 40 ms. small: 0.93, large: 0.98.
OPTS = [
    Option("near", "small", rtt_ms=4.0, service_ms=1.0, accuracy=0.93, queue_wait_ms=30.0, load=3.0, tier="far_edge"),
    Option("mid", "small", rtt_ms=10.0, service_ms=1.0, accuracy=0.93, queue_wait_ms=0.0, load=0.0, tier="near_edge"),
    Option("mid", "large", rtt_ms=10.0, service_ms=6.0, accuracy=0.98, queue_wait_ms=0.0, load=0.0, tier="near_edge"),
    Option("cloud", "small", rtt_ms=40.0, service_ms=0.5, accuracy=0.93, queue_wait_ms=0.0, load=0.5, tier="cloud"),
    Option("cloud", "large", rtt_ms=40.0, service_ms=3.0, accuracy=0.98, queue_wait_ms=0.0, load=0.5, tier="cloud"),
]


def pick(name, deadline=60.0, acc=0.9, opts=OPTS, ctx=None):
    d = decide(name, opts, deadline, acc, ctx or Context(rng=np.random.default_rng(1)))
    return d.cluster, d.model, d.fallback


def test_catalogue_order_is_fixed():
    assert CATALOGUE == ("closest", "cloud", "least_loaded", "min_latency", "max_accuracy", "random", "round_robin",
                         "p2c", "age_aware")
    assert tuple(pol.POLICIES) == CATALOGUE


@pytest.mark.parametrize("name,deadline,acc,expected", [
    ("closest", 60, 0.9, ("near", "small", False)),
    ("closest", 60, 0.97, ("mid", "large", False)),
    ("closest", 15, 0.97, ("mid", "large", True)),  # 10 + 6 > 15 and 40 + 3 > 15: fallback min_latency (16 < 43)
    ("cloud", 60, 0.9, ("cloud", "small", False)),
    ("cloud", 60, 0.97, ("cloud", "large", False)),
    ("cloud", 30, 0.9, ("cloud", "small", False)),  # cloud ignores the deadline
    ("least_loaded", 60, 0.9, ("mid", "small", False)),  # load 0 < 0.5 < 3
    ("least_loaded", 60, 0.97, ("mid", "large", False)),
    ("min_latency", 60, 0.9, ("mid", "small", False)),  # near: 4 + 30 + 1 = 35 > mid: 11
    ("min_latency", 60, 0.97, ("mid", "large", False)),  # 16 < 43
    ("max_accuracy", 60, 0.9, ("mid", "large", False)),  # 0.98 at 16 ms (cloud large 43 ms: later)
    ("max_accuracy", 14, 0.9, ("mid", "small", False)),  # no large in time -> min_latency
    ("min_latency", 4.5, 0.9, ("mid", "small", True)),  # nothing feasible: min_latency over accurate pairs
    ("closest", 60, 0.99, ("mid", "large", True)),  # nothing accurate enough: the most accurate, nearest
])
def test_exact_picks(name, deadline, acc, expected):
    assert pick(name, deadline, acc) == expected


def test_random_is_uniform_over_feasible_pairs_and_seeded():
    ctx = Context(rng=np.random.default_rng(5))
    seq = [decide("random", OPTS, 60, 0.9, ctx) for _ in range(5000)]
    counts = {}
    for d in seq:
        counts[(d.cluster, d.model)] = counts.get((d.cluster, d.model), 0) + 1
    assert set(counts) == {(o.cluster, o.model) for o in OPTS}  # all 5 pairs are feasible at 60 ms
    assert all(900 < n < 1100 for n in counts.values())
    ctx2 = Context(rng=np.random.default_rng(5))
    assert [decide("random", OPTS, 60, 0.9, ctx2) for _ in range(5000)] == seq


def test_round_robin_cycles_feasible_clusters_by_name_per_application():
    ctx = Context()
    got = [pick("round_robin", 60, 0.9, ctx=ctx)[:2] for _ in range(4)]
    assert got == [("cloud", "small"), ("mid", "small"), ("near", "small"), ("cloud", "small")]
    # another application class has its own counter; only mid and cloud have a 0.97 model
    got = [pick("round_robin", 60, 0.97, ctx=ctx)[:2] for _ in range(3)]
    assert got == [("cloud", "large"), ("mid", "large"), ("cloud", "large")]


def test_clusters_heard_down_are_avoided():
    opts = [Option(o.cluster, o.model, o.rtt_ms, o.service_ms, o.accuracy, o.queue_wait_ms, o.load, o.tier,
                   up=o.cluster != "near") for o in OPTS]
    assert pick("closest", 60, 0.9, opts) == ("mid", "small", False)
    assert pick("cloud", 60, 0.9, [o for o in opts if o.tier != "cloud"]) == ("mid", "small", True)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown policy 'fastest'; known: closest, cloud"):
        decide("fastest", OPTS, 60, 0.9)
    with pytest.raises(ValueError, match="no .cluster, model. options"):
        decide("closest", [], 60, 0.9)
    with pytest.raises(ValueError, match="needs a Context"):
        decide("round_robin", OPTS, 60, 0.9, None)


def test_expected_wait():
    assert expected_wait_ms(queue_len=5, busy=1, workers=2, mean_service_ms=10) == 0.0
    assert expected_wait_ms(queue_len=3, busy=2, workers=2, mean_service_ms=10) == 20.0


def test_decide_many_matches_single_decisions():
    ctx1, ctx2 = Context(), Context()
    assert pol.decide_many("round_robin", OPTS, 60, 0.9, 5, ctx1) == [decide("round_robin", OPTS, 60, 0.9, ctx2)
                                                                       for _ in range(5)]
    assert ctx1.rr == ctx2.rr
    many = pol.decide_many("random", OPTS, 60, 0.9, 5000, Context(rng=np.random.default_rng(2)))
    counts = {}
    for d in many:
        counts[d.cluster, d.model] = counts.get((d.cluster, d.model), 0) + 1
    assert len(counts) == 5 and all(900 < n < 1100 for n in counts.values())
    assert pol.decide_many("closest", OPTS, 60, 0.9, 3) == [decide("closest", OPTS, 60, 0.9)] * 3
    assert pol.decide_many("random", OPTS, 4.5, 0.9, 2, Context()) == [decide("min_latency", OPTS, 4.5, 0.9)] * 2


def test_dispatcher_counts_its_own_sends_until_the_next_report():
    """Herding: with stale reports, least_loaded alternates between two idle clusters because the
    dispatcher adds its own sends to the last report; a report of the same cluster resets them."""
    from testbed.model.dispatch import Dispatcher, Heard, OptionSpec

    specs = [OptionSpec("a", "m", 4.0, 2.0, 10.0, 0.9, "far_edge", 1),
             OptionSpec("b", "m", 6.0, 2.0, 10.0, 0.9, "far_edge", 1)]
    d = Dispatcher(specs, "least_loaded", np.random.default_rng(0))
    picks = [d.dispatch(60, 0.5).cluster for _ in range(4)]
    assert picks == ["a", "b", "a", "b"] and d.sent == {"a": 2, "b": 2}
    a_opt = next(o for o in d.options if o.cluster == "a")
    assert a_opt.load == 2.0 and a_opt.queue_wait_ms == 20.0  # 1 busy + 1 waiting: (1 + 1) / 1 x 10 ms
    d.hear("a", Heard(0, 0, 1, 0.0, True, 1.0))
    assert d.sent == {"a": 0, "b": 2} and d.dispatch(60, 0.5).cluster == "a"
    closest = Dispatcher(specs, "closest", np.random.default_rng(0))
    assert [x.cluster for x in closest.dispatch_many(60, 0.5, 5)] == ["a"] * 5 and closest.sent["a"] == 5


def _nearest_any(options, deadline_ms, min_accuracy, ctx=None):
    """A throwaway policy: the smallest RTT, whatever the deadline and accuracy."""
    o = min(options, key=lambda o: (o.rtt_ms, o.cluster, o.model))
    return pol.Decision(o.cluster, o.model, False)


def test_a_policy_is_one_registry_entry_seen_by_the_catalogue_the_plan_and_the_simulator(tmp_path):
    from pathlib import Path

    from testbed.model.dispatch import Dispatcher, OptionSpec
    from testbed.plan.build import PlanError, plan_experiment
    from testbed.sim import Simulator

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "topologies").symlink_to(repo / "topologies")  # the experiment names ../topologies/triangle.yaml
    exp = tmp_path / "experiments" / "triangle-nearest.yaml"
    exp.parent.mkdir()
    text = (repo / "experiments" / "triangle.yaml").read_text()
    assert "policy: closest" in text
    exp.write_text(text.replace("policy: closest", "policy: nearest_any"))
    before = tuple(CATALOGUE)
    with pytest.raises(PlanError, match=r"policy: unknown policy 'nearest_any'; known: closest, .*, aset"):
        plan_experiment(exp)
    pol.register_policy("nearest_any", deterministic=True)(_nearest_any)
    try:
        assert tuple(CATALOGUE) == (*before, "nearest_any")  # appended: ASET's earlier actions keep their index
        assert "nearest_any" in pol.DETERMINISTIC and "nearest_any" not in pol.LOAD_AWARE
        assert pick("nearest_any") == ("near", "small", False)
        d = Dispatcher([OptionSpec("a", "m", 5.0, 1.0, 1.0, 0.9, "far_edge", 1)], "nearest_any",
                       np.random.default_rng(0))
        assert d.dispatch(100.0, 0.5).cluster == "a"
        plan = plan_experiment(exp)  # the plan accepts it
        sim = Simulator(plan, seed=1)
        assert sim.policy_names[-1] == "nearest_any"
        sim.run_until(3.0)
        done = sim.drain_resolved()
        assert done and {r.policy for r in done} == {"nearest_any"}
        with pytest.raises(ValueError, match="'nearest_any' is already registered"):
            pol.register_policy("nearest_any", deterministic=True)(_nearest_any)
    finally:
        pol.unregister_policy("nearest_any")
    assert tuple(CATALOGUE) == before and "nearest_any" not in pol.DETERMINISTIC
    with pytest.raises(PlanError, match="unknown policy 'nearest_any'"):
        plan_experiment(exp)
    with pol.REGISTRY.temporarily("nearest_any", pol.Policy("nearest_any", _nearest_any, deterministic=True)):
        assert CATALOGUE[-1] == "nearest_any"
    assert "nearest_any" not in CATALOGUE


def test_unknown_policy_names_the_item_and_a_close_match():
    from testbed.core.errors import InputError
    from testbed.plan.policy_resolution import check_policy

    with pytest.raises(InputError, match=r"^sources\.atl\.policy: unknown policy 'closet'; known: closest, "
                                         r".*age_aware, aset(, [\w.:-]+)* \(did you mean 'closest'\?\)$"):
        check_policy("closet", "sources.atl.policy", aset=True)  # then the installed plug-ins' entry points
    assert check_policy("aset", "policy", aset=True) == "aset"
    with pytest.raises(InputError, match="^actions: unknown policy 'aset'"):
        check_policy("aset", "actions")
    with pytest.raises(ValueError, match="stateful policy is not deterministic"):
        pol.register_policy("x", deterministic=True, stateful=True)
