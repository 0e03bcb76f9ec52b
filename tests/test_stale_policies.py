"""The two policies for stale load reports: ``p2c`` (Mitzenmacher 2000) and ``age_aware`` (after
Dahlin 2000): their decisions on hand-built options, through the dispatcher, and in both engines."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.model import policies as pol
from testbed.model.dispatch import Dispatcher, Heard, OptionSpec
from testbed.model.policies import Context, Option, age_discounted_load, decide

REPO = Path(__file__).resolve().parent.parent
STALE = ("p2c", "age_aware")


def opt(cluster, load=0.0, rtt=5.0, service=2.0, acc=0.95, model="m", up=True, reported=0, sent=0, workers=1,
        heard_at_s=None, rate=0.0):
    return Option(cluster, model, rtt_ms=rtt, service_ms=service, accuracy=acc, load=load, up=up, tier="far_edge",
                  reported=reported, sent=sent, workers=workers, heard_at_s=heard_at_s, service_rate_qps=rate)


def test_both_are_registered_after_the_seven_with_their_flags():
    assert pol.CATALOGUE[-2:] == STALE and pol.CATALOGUE.index("p2c") == 7  # ASET's actions 0..6 keep their index
    assert "p2c" in pol.LOAD_AWARE and pol.REGISTRY["p2c"].stateful and "p2c" not in pol.DETERMINISTIC
    # age_aware reads the clock: not constant between two reports, so never cached
    assert "age_aware" in pol.LOAD_AWARE and "age_aware" not in pol.DETERMINISTIC
    assert not pol.REGISTRY["age_aware"].stateful


# --------------------------------------------------------------------------- p2c

def test_p2c_picks_the_lighter_of_its_two_draws():
    """Three clusters, loads 1 < 2 < 3: each pair is drawn with probability 1/3, so the lightest
    wins 2/3 of the draws, the middle one 1/3, the heaviest never."""
    opts = [opt("a", load=1.0), opt("b", load=2.0), opt("c", load=3.0)]
    ctx = Context(rng=np.random.default_rng(5))
    picks = Counter(decide("p2c", opts, 50.0, 0.9, ctx).cluster for _ in range(3000))
    assert picks["c"] == 0
    assert picks["a"] / 3000 == pytest.approx(2 / 3, abs=0.03) and picks["b"] / 3000 == pytest.approx(1 / 3, abs=0.03)


def test_p2c_draws_two_distinct_clusters_from_the_seeded_rng():
    opts = [opt("a", load=0.0), opt("b", load=5.0)]
    # two feasible clusters: both are always drawn, the lighter always wins
    assert {decide("p2c", opts, 50.0, 0.9, Context(rng=np.random.default_rng(s))).cluster for s in range(20)} == {"a"}
    four = [opt(c, load=float(i)) for i, c in enumerate("dcba")]
    seqs = []
    for _ in range(2):
        ctx = Context(rng=np.random.default_rng(9))
        seqs.append([decide("p2c", four, 50.0, 0.9, ctx).cluster for _ in range(200)])
    assert seqs[0] == seqs[1]  # the same seed, the same decisions
    assert "a" not in seqs[0] and set(seqs[0]) == {"b", "c", "d"}  # a (load 3) loses every pair it is drawn in
    other = Context(rng=np.random.default_rng(10))
    assert [decide("p2c", four, 50.0, 0.9, other).cluster for _ in range(200)] != seqs[0]


def test_p2c_compares_in_flight_plus_last_report_through_the_dispatcher():
    specs = [OptionSpec(c, "m", 5.0, 2.0, 2.0, 0.95, "far_edge", 2) for c in ("a", "b")]
    d = Dispatcher(specs, "p2c", np.random.default_rng(0))
    d.hear_all([("a", Heard(queue_len=1, busy=2, workers=2, at_s=0.0)), ("b", Heard(busy=1, workers=2, at_s=0.0))])
    assert d.dispatch(50.0, 0.9).cluster == "b"  # 3 vs 1 reported
    d.note_sent("b", 2)  # b: 1 reported + 3 own sends = 4 > 3
    assert d.dispatch(50.0, 0.9).cluster == "a"
    d.hear("b", Heard(workers=2, at_s=0.5))  # a new report resets b's in-flight count
    assert d.dispatch(50.0, 0.9).cluster == "b"


def test_p2c_needs_a_context():
    with pytest.raises(ValueError, match="p2c"):
        decide("p2c", [opt("a")], 50.0, 0.9, None)


# --------------------------------------------------------------------------- age_aware

def test_age_discounted_load_is_the_stated_formula():
    o = opt("a", reported=6, sent=2, workers=2, heard_at_s=10.0, rate=100.0)
    assert age_discounted_load(o, 10.0) == (6 + 2) / 2  # a fresh report: the report plus the own sends
    assert age_discounted_load(o, 10.03) == pytest.approx((6 - 3 + 2) / 2)  # 30 ms x 100/s drained
    assert age_discounted_load(o, 11.0) == 2 / 2  # drained to 0, the own sends remain
    assert age_discounted_load(o, 9.0) == (6 + 2) / 2  # a report from the future is taken as fresh
    assert age_discounted_load(o, None) == (6 + 2) / 2
    assert age_discounted_load(opt("a", reported=6, heard_at_s=None, rate=100.0), 50.0) == 6


def test_age_aware_discounts_an_old_report():
    """a reported 6 queries but drains 200/s; b reported 3 and drains 10/s. Fresh, b is lighter;
    30 ms later a has emptied (6 - 0.03 x 200 = 0) while b still holds 2.7: a. least_loaded,
    reading the reports as they are, keeps sending to b."""
    opts = [opt("a", load=6.0, reported=6, heard_at_s=1.0, rate=200.0),
            opt("b", load=3.0, reported=3, heard_at_s=1.0, rate=10.0)]
    at = lambda t: decide("age_aware", opts, 50.0, 0.9, Context(now_s=t)).cluster  # noqa: E731
    assert at(1.0) == "b" and at(1.03) == "a"
    assert decide("least_loaded", opts, 50.0, 0.9).cluster == "b"
    assert decide("age_aware", opts, 50.0, 0.9).cluster == "b"  # no clock: every report fresh
    # the dispatcher's own sends since the report are added in full
    sent = [opt("a", load=9.0, reported=6, sent=3, heard_at_s=1.0, rate=200.0), opts[1]]
    assert decide("age_aware", sent, 50.0, 0.9, Context(now_s=1.03)).cluster == "b"  # 0 + 3 > 2.7


def test_age_aware_through_the_dispatcher_uses_the_decision_time():
    specs = [OptionSpec("a", "m", 5.0, 5.0, 5.0, 0.95, "far_edge", 1),  # 200/s
             OptionSpec("b", "m", 5.0, 100.0, 100.0, 0.95, "far_edge", 1)]  # 10/s
    reports = [("a", Heard(queue_len=5, busy=1, workers=1, at_s=1.0)), ("b", Heard(queue_len=2, busy=1, at_s=1.0))]
    d = Dispatcher(specs, "age_aware", np.random.default_rng(0))
    d.hear_all(reports)
    o = {x.cluster: x for x in d.options}
    assert (o["a"].reported, o["a"].sent, o["a"].workers, o["a"].heard_at_s) == (6, 0, 1, 1.0)
    assert o["a"].service_rate_qps == pytest.approx(200.0) and o["b"].service_rate_qps == pytest.approx(10.0)
    assert d.decide(200.0, 0.9, now_s=1.0).cluster == "b"
    assert d.decide(200.0, 0.9, now_s=1.03).cluster == "a"
    assert d.ctx.now_s == 1.03
    # the queries of one step, each decided at its own time, as successive dispatches would
    other = Dispatcher(specs, "age_aware", np.random.default_rng(0))
    other.hear_all(reports)
    times = [1.0, 1.01, 1.02, 1.03, 1.04]
    many = d.dispatch_many(200.0, 0.9, 5, times=times)
    assert many == [other.dispatch(200.0, 0.9, now_s=t) for t in times]
    # b: 3 - 10 t' + own sends; a: max(0, 6 - 200 t') + own sends (t' the age)
    assert [x.cluster for x in many] == ["b", "b", "a", "a", "a"]
    with pytest.raises(ValueError, match="2 times for 5 queries"):
        d.dispatch_many(200.0, 0.9, 5, times=[1.0, 1.1])


# --------------------------------------------------------------------------- feasibility, as the others

@pytest.mark.parametrize("name", STALE)
def test_an_infeasible_or_down_cluster_is_never_picked_however_light(name):
    opts = [opt("light_far", load=0.0, rtt=48.0, reported=0, heard_at_s=0.0, rate=100.0),  # 48 + 2 > 45
            opt("light_bad", load=0.0, acc=0.5, reported=0, heard_at_s=0.0, rate=100.0),  # below A_a
            opt("light_down", load=0.0, up=False, reported=0, heard_at_s=0.0, rate=100.0),  # heard down
            opt("heavy", load=8.0, reported=8, heard_at_s=0.0, rate=1.0)]
    ctx = Context(rng=np.random.default_rng(3), now_s=0.5)
    for _ in range(50):
        assert decide(name, opts, 45.0, 0.9, ctx) == pol.Decision("heavy", "m", False)


@pytest.mark.parametrize("name", STALE)
def test_with_nothing_feasible_they_fall_back_as_the_others_do(name):
    opts = [opt("near", rtt=30.0, service=30.0), opt("far", rtt=60.0, service=2.0),
            opt("cheap", rtt=1.0, service=1.0, acc=0.5)]
    want = decide("least_loaded", opts, 40.0, 0.9)
    assert want.fallback and want.cluster == "near"  # min_latency over the pairs meeting A_a
    assert decide(name, opts, 40.0, 0.9, Context(rng=np.random.default_rng(0), now_s=1.0)) == want
    with pytest.raises(ValueError, match="no .* options"):
        decide(name, [], 40.0, 0.9, Context())


@pytest.mark.parametrize("name", STALE)
def test_the_fastest_feasible_model_at_the_chosen_cluster(name):
    opts = [opt("a", model="slow", service=9.0), opt("a", model="fast", service=1.0),
            opt("a", model="coarse", service=0.5, acc=0.5), opt("b", load=4.0, reported=4)]
    d = decide(name, opts, 50.0, 0.9, Context(rng=np.random.default_rng(0), now_s=0.0))
    assert (d.cluster, d.model, d.fallback) == ("a", "fast", False)


# --------------------------------------------------------------------------- both engines

@pytest.mark.parametrize("name", STALE)
def test_the_emulated_source_and_the_simulator_decide_alike(name, tmp_path):
    """The emulation's Source and the simulator's dispatcher of the same source, fed the same
    reports at the same times, make the same decisions (same options, same seeded stream)."""
    from testbed.emu.source import Source
    from testbed.plan.boundaries import SourceConfig
    from testbed.plan.build import plan_experiment
    from testbed.sim import Simulator

    plan = plan_experiment(REPO / "experiments" / "default.yaml")
    sim = Simulator(plan, policies={h.name: name for h in plan.sources})
    host = plan.sources[0].name
    cfg = SourceConfig.from_plan(plan, host, start_ns=0, duration_s=plan.experiment.duration_s, run_dir=tmp_path)
    cfg = cfg.model_copy(update={"policy": name})
    (tmp_path / "sources").mkdir(exist_ok=True)
    src = Source(cfg)
    try:
        a, b = src.dispatcher, sim.dispatchers[sim.src_index[host]]
        assert a.policy == b.policy == name
        rng = np.random.default_rng(4)
        app = max(plan.experiment.applications, key=lambda x: x.deadline_ms)  # several feasible clusters
        da, db = [], []
        for k in range(6):  # six report intervals, ten queries each at their own times
            reports = [(c, Heard(int(rng.integers(0, 6)), int(rng.integers(0, 3)), 2, 0.5, True, k * 0.5))
                       for c in a.clusters]
            for c, h in reports:
                a.hear(c, h)  # the source hears cluster by cluster, the simulator all at once
            b.hear_all(reports)
            times = sorted(k * 0.5 + rng.random(10) * 0.5)
            da += [a.dispatch(app.deadline_ms, app.min_accuracy, app.family, t) for t in times]
            db += b.dispatch_many(app.deadline_ms, app.min_accuracy, 10, app.family, times)
        assert da == db
        assert len({d.cluster for d in da}) > 1  # the trace exercises a choice
    finally:
        src.out.close()


@pytest.mark.parametrize("name", STALE)
def test_a_simulated_run_is_reproducible_and_answers(name):
    from testbed.plan.build import plan_experiment
    from testbed.sim import Simulator

    plan = plan_experiment(REPO / "experiments" / "triangle.yaml")
    out = []
    for _ in range(2):
        sim = Simulator(plan, seed=3, policies={h.name: name for h in plan.sources}, record=True)
        sim.run_until(sim.exp.duration_s + 1.0)
        out.append(sim.records())
    assert len(out[0]) > 0 and [r["cluster"] for r in out[0]] == [r["cluster"] for r in out[1]]
    assert {r["policy"] for r in out[0]} == {name}
    assert sum(r["outcome"] == "success" for r in out[0]) > 0.5 * len(out[0])
