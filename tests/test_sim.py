"""The simulator: queueing theory, determinism, events, records, API, bad input (no root needed)."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from testbed.core.errors import InputError
from testbed.model.records import RECORD_FIELDS
from testbed.plan.build import PlanError, build_plan, plan_experiment
from testbed.plan.catalog import FixedCatalog
from testbed.results.runs import run_simulation
from testbed.sim import ServiceSampler, SimError, Simulator
from testbed.spec.experiment import ConfigError, Experiment, load_experiment

REPO = Path(__file__).resolve().parent.parent


#: A synthetic model "m" (accuracy 0.9, 1000-byte requests); its service times come from the tests' samplers.
CATALOG = FixedCatalog({"m": ("digits", 0.9, [10.0])})


def one_queue(workers=1, rate=70.0, queue_limit=1_000_000, server=None, deadline="100s", **extra):
    """One source at A, one cluster at B (triangle), one application; one core per worker, so
    the CPU quota never throttles (a plain M/G/c queue)."""
    cl = {"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": workers, "workers": workers,
          "queue_limit": queue_limit, "models": ["m"]}
    if server:
        cl["server"] = server
    exp = Experiment.model_validate({
        "name": "qt", "duration": "10s", "policy": "closest",
        "topology": {"source": str(REPO / "topologies/triangle.yaml")},
        "clusters": [cl], "sources": [{"name": "src", "site": "A"}],
        "applications": [{"name": "app", "deadline": deadline, "min_accuracy": 0.5}],
        "workload": [{"application": "app", "rate_qps": rate}], **extra})
    return build_plan(exp, catalog=CATALOG)


def sim_with(plan, seed, svc, **kw):
    return Simulator(plan, seed=seed, service=lambda cl, m: svc(np.random.default_rng([seed, 99])), **kw)


def erlang_c_wait_ms(c: int, lam: float, mean_ms: float) -> float:
    """M/M/c mean wait in queue: C(c, a) x mean / (c - a), a = lam x mean (Erlang C formula)."""
    a = lam * mean_ms / 1e3
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail) * mean_ms / (c - a)


@pytest.mark.parametrize("c,rho", [(1, 0.7), (3, 0.6)])
def test_mmc_mean_wait_matches_erlang_c(c, rho):
    mean = 10.0
    lam = rho * c / (mean / 1e3)
    sim = sim_with(one_queue(c, lam), 1, lambda r: ServiceSampler.exponential(mean, r))
    sim.run_until(400_000 / lam)
    cl = sim.clusters[0]
    assert cl.served > 390_000
    wq_ms = cl.mean_wait_s() * 1e3
    assert wq_ms == pytest.approx(erlang_c_wait_ms(c, lam, mean), rel=0.02)


def test_md1_mean_wait_matches_pollaczek_khinchine():
    d, rho = 10.0, 0.7
    lam = rho / (d / 1e3)
    sim = sim_with(one_queue(1, lam), 2, lambda r: ServiceSampler.deterministic(d, r))
    sim.run_until(300_000 / lam)
    cl = sim.clusters[0]
    # P-K: Wq = lam E[S^2] / (2 (1 - rho)) = rho d / (2 (1 - rho)) for constant service d.
    assert cl.mean_wait_s() * 1e3 == pytest.approx(rho * d / (2 * (1 - rho)), rel=0.02)


def test_queue_bound_drops_and_admission():
    plan = one_queue(1, 200.0, queue_limit=2, deadline="1s")
    sim = sim_with(plan, 3, lambda r: ServiceSampler.deterministic(10.0, r))
    sim.run_until(20.0)
    res = sim.drain_resolved()
    causes = {r.failure_cause for r in res}
    assert "dropped" in causes and sim.clusters[0].dropped > 1000  # offered 2x the capacity
    assert all(r.failure_cause in ("", "dropped") for r in res)
    # admission: expected completion (ahead / workers + 1) x 10 ms must meet a 25 ms deadline
    plan = one_queue(1, 200.0, queue_limit=100, deadline="25ms", server={"admission": True})
    sim = sim_with(plan, 3, lambda r: ServiceSampler.deterministic(10.0, r))
    sim.run_until(5.0)
    assert sim.clusters[0].dropped > 0 and len(sim.clusters[0].queue) <= 2


def test_edf_serves_earliest_deadline_first():
    waits = {}
    for disc in ("fifo", "edf"):
        exp = Experiment.model_validate({
            "name": "edf", "duration": "10s", "topology": {"source": str(REPO / "topologies/triangle.yaml")},
            "clusters": [{"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": 1, "workers": 1,
                          "queue_limit": 10000, "models": ["m"], "server": {"discipline": disc}}],
            "sources": [{"name": "src", "site": "A"}],
            "applications": [{"name": "tight", "deadline": "50ms", "min_accuracy": 0.5},
                             {"name": "loose", "deadline": "5s", "min_accuracy": 0.5}],
            "workload": [{"application": "tight", "rate_qps": 45}, {"application": "loose", "rate_qps": 45}]})
        sim = sim_with(build_plan(exp, catalog=CATALOG), 4, lambda r: ServiceSampler.deterministic(10.0, r))
        sim.run_until(60.0)
        q = sim.query_table().dropna(subset=["t2_s"])
        waits[disc] = {a: float((q.t2_s - q.t1_s)[q.application == a].mean()) for a in ("tight", "loose")}
    assert waits["fifo"]["tight"] == pytest.approx(waits["fifo"]["loose"], rel=0.1)
    assert waits["edf"]["tight"] < 0.5 * waits["edf"]["loose"]


def test_batching_takes_up_to_max_batch():
    plan = one_queue(1, 300.0, server={"max_batch": 4, "max_queue_delay": "5ms"})
    sim = sim_with(plan, 5, lambda r: ServiceSampler.deterministic(10.0, r), record=True)
    sim.run_until(10.0)
    started = sim.query_table().dropna(subset=["t2_s"])
    assert started.batch.max() == 4 and 1 < started.batch.mean() <= 4
    # a batch never starts later than its oldest query's arrival + 5 ms, unless every worker was busy
    assert sim.clusters[0].served > 2900  # 300 q/s offered, capacity 4 per 10 ms


def test_default_experiment_is_deterministic_per_seed_and_writes_emulation_layout(tmp_path):
    plan = plan_experiment(REPO / "experiments/digits-abilene.yaml")
    a, sa = run_simulation(plan, run_dir=tmp_path / "a", duration_s=20, quiet=True)
    b, sb = run_simulation(plan, run_dir=tmp_path / "b", duration_s=20, quiet=True)
    c, sc = run_simulation(plan, run_dir=tmp_path / "c", duration_s=20, seed=99, quiet=True)
    ra, rb, rc = (pd.read_csv(d / "records.csv") for d in (a, b, c))
    assert list(ra.columns) == RECORD_FIELDS
    pd.testing.assert_frame_equal(ra, rb)
    assert not ra["t0_ns"].equals(rc["t0_ns"]) if len(ra) == len(rc) else len(ra) != len(rc)
    assert sa["queries"] == len(ra) == sb["queries"] and sa["success_ratio"] == sb["success_ratio"]
    assert sorted(p.name for p in (a / "sources").iterdir()) == [
        f"{s}.{kind}" for s in ("atl", "lax", "nyc", "sea") for kind in ("records.csv", "tally.json")]
    for src, g in ra.groupby("source"):  # ids <source>-1..n in creation order, as the emulated sources number them
        n = g.sort_values("t0_ns")["query_id"].str.rsplit("-", n=1).str[-1].astype(int).tolist()
        assert n == list(range(1, len(g) + 1)), src
    assert "missing_query_ids" in sa["records_check"] and sa["records_check"]["missing_query_ids"] == {}
    assert sa["records_check"]["sources_without_tally"] == []  # the simulator tallies its sources too
    assert sum(sa["records_check"]["queries_created"].values()) == sa["queries"]
    import json

    run = json.loads((a / "run.json").read_text())
    assert run["mode"] == "simulation" and run["seed"] == 1
    ok = ra[ra["outcome"] == "success"]
    assert (ok["t1_ns"] >= ok["t0_ns"]).all() and (ok["t2_ns"] >= ok["t1_ns"]).all()
    assert (ok["t3_ns"] > ok["t2_ns"]).all() and (ok["t4_ns"] > ok["t3_ns"]).all()
    assert ((ok["e2e_ms"] <= ok["deadline_ms"]) & (ok["model_accuracy"] >= ok["min_accuracy"])).all()


def test_api_for_the_aset_environment():
    plan = plan_experiment(REPO / "experiments/digits-abilene.yaml")
    sim = Simulator(plan, seed=3)
    assert sim.policy_names == ["closest", "cloud", "least_loaded", "min_latency", "max_accuracy", "random",
                                "round_robin", "p2c", "age_aware"]
    sim.run_until(2.0)
    n1 = len(sim.drain_resolved())
    assert sim.now_s == 2.0 and n1 > 0 and sim.drain_resolved() == []
    st = sim.cluster_state("sea")
    assert set(st) == {"fesv", "fedc", "nechi", "cloud"}
    assert set(st["cloud"]) == {"queue_len", "busy", "workers", "utilization", "up"} and st["cloud"]["workers"] == 2
    sim.set_policy("sea", "cloud")
    sim.run_until(4.0)
    later = [r for r in sim.drain_resolved() if r.source == "sea" and r.t0_s >= 2.0]
    assert later and {r.cluster for r in later} == {"cloud"} and {r.policy for r in later} == {"cloud"}
    links = sim.path_links("sea", "cloud")
    util = sim.link_utilization()
    assert links and all(lk in util for lk in links) and util[links[0]] > 0
    with pytest.raises(SimError, match="unknown policy 'best'"):
        sim.set_policy("sea", "best")
    with pytest.raises(SimError, match="unknown source 'xyz'"):
        sim.set_policy("xyz", "cloud")


def test_clone_continues_exactly_and_source_view_reads_one_dispatcher():
    """The interface ASET reads the simulator through: clone() is independent of the original and
    continues as it would (a batching cluster too); source_view(source) is what that dispatcher knows."""
    plan = plan_experiment(REPO / "experiments/digits-abilene.yaml")
    sim = Simulator(plan, seed=3)
    sim.run_until(2.0)
    sim.drain_resolved()
    twin, other = sim.clone(), sim.clone()
    before = sim.source_view("sea").policy
    other.set_policy("sea", "cloud")
    for s in (sim, twin, other):
        s.run_until(4.0)
    assert sim.drain_resolved() == twin.drain_resolved() != []
    assert sim.source_view("sea").policy == before and other.source_view("sea").policy == "cloud"
    view = sim.source_view("sea")
    assert view.name == "sea" and view.heard() == sim.cluster_state("sea")
    assert set(view.report_age_s()) == set(view.heard()) and all(0 <= a <= sim.R for a in view.report_age_s().values())
    table = sim.query_table()
    assert view.sent() == table[table.source == "sea"].groupby("cluster").size().to_dict()
    app = plan.experiment.applications[0]
    assert view.would_pick("cloud", app.deadline_ms, app.min_accuracy, app.family)[0] == "cloud"
    with pytest.raises(SimError, match="unknown source 'xyz'"):
        sim.source_view("xyz")
    batching = Simulator(one_queue(1, 300.0, server={"max_batch": 4, "max_queue_delay": "5ms"}), seed=5)
    batching.run_until(1.0)
    copy = batching.clone()
    batching.run_until(2.0)
    copy.run_until(2.0)
    pd.testing.assert_frame_equal(batching.query_table(), copy.query_table())
    assert batching.query_table().batch.max() > 1


def test_events_cluster_failure_and_link_delay():
    """kill (default): queries sent to the dead server are refused (server_down); stop: frozen
    queries are answered after it resumes, too late; a link delay step moves every later RTT."""
    base = one_queue(1, 50.0, deadline="100ms").experiment.model_dump()
    base["events"] = [{"at": "2s", "kind": "cluster_down", "cluster": "c"},
                      {"at": "4s", "kind": "cluster_up", "cluster": "c"},
                      {"at": "6s", "kind": "link_delay", "link": ["A", "B"], "delay": "60ms"},
                      {"at": "6s", "kind": "link_delay", "link": ["A", "C"], "delay": "60ms"}]  # no way around
    plan = build_plan(Experiment.model_validate(base), catalog=CATALOG)
    sim = sim_with(plan, 6, lambda r: ServiceSampler.deterministic(1.0, r))
    sim.run_until(8.5)
    res = sim.drain_resolved()
    down = [r for r in res if 2.0 <= r.t0_s < 3.99]  # later ones arrive after the recovery
    assert down and all(not r.success and r.failure_cause == "server_down" for r in down)
    ok = [r for r in res if 4.1 <= r.t0_s < 5.9]
    assert ok and all(r.success for r in ok)
    slow = [r for r in res if 6.0 <= r.t0_s < 8.3]
    assert slow and all(r.failure_cause == "deadline_miss" for r in slow)  # RTT now >= 120 ms > 100 ms
    assert all(r.e2e_ms is None or r.e2e_ms > 120 for r in slow)
    # stop: nothing is answered while frozen; what waited is served after the resume, late
    base["events"] = [{"at": "2s", "kind": "cluster_down", "cluster": "c", "mode": "stop"},
                      {"at": "4s", "kind": "cluster_up", "cluster": "c"}]
    sim = sim_with(build_plan(Experiment.model_validate(base), catalog=CATALOG), 6,
                   lambda r: ServiceSampler.deterministic(1.0, r), record=True)
    sim.run_until(7.0)
    res = sim.drain_resolved()
    frozen = [r for r in res if 2.0 <= r.t0_s < 3.85]
    assert frozen and all(r.failure_cause == "deadline_miss" for r in frozen)
    qt = sim.query_table()
    late = qt[(qt.t0_s >= 2.0) & (qt.t0_s < 3.85)]
    assert (late.t2_s >= 4.0).all() and late.status.eq(200).all()  # served once resumed, in order
    assert late.t2_s.is_monotonic_increasing
    assert all(r.success for r in res if 4.1 <= r.t0_s < 6.0)


def test_bad_input_errors(tmp_path):
    plan = plan_experiment(REPO / "experiments/triangle.yaml")
    with pytest.raises(SimError, match="policies: unknown source 'nope'"):
        Simulator(plan, policies={"nope": "closest"})
    text = (REPO / "experiments/triangle.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("rate_qps: 4", "process: mmpp, rates_qps: [1]"))
    with pytest.raises(ConfigError, match=r"workload\.0: process .mmpp. needs rates_qps and dwell_s"):
        load_experiment(bad)
    bad.write_text(text + "\nevents:\n  - {at: 1s, kind: cluster_down, cluster: nosuch}\n")
    with pytest.raises(ConfigError, match="events.0.*unknown cluster 'nosuch'|unknown cluster 'nosuch'"):
        load_experiment(bad)
    bad.write_text(text + "\nevents:\n  - {at: 1s, kind: link_delay, link: [A, B]}\n")
    with pytest.raises(ConfigError, match="events.0: event 'link_delay' needs .*'delay'"):
        load_experiment(bad)
    bad.write_text(text.replace("policy: closest", "policy: fastest"))
    load_experiment(bad)  # a policy is a name in the experiment file; the plan resolves it (the registry)
    with pytest.raises(PlanError, match=r"bad.yaml: policy: unknown policy 'fastest'; known: closest, .*, aset"):
        plan_experiment(bad)
    bad.write_text(text + "\nevents:\n  - {at: 1s, kind: link_delay, link: [A, Z], delay: 5ms}\n")
    with pytest.raises(PlanError, match=r"events.0 \(link_delay\).link: unknown node 'Z'"):
        plan_experiment(bad)


def test_aset_policy_without_a_checkpoint_uses_the_general_one(tmp_path):
    from testbed.spec.experiment import DEFAULT_ASET_CHECKPOINT

    text = (REPO / "experiments/triangle.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("policy: closest", "policy: aset"))
    assert load_experiment(bad).aset.checkpoint == DEFAULT_ASET_CHECKPOINT == "models/aset/general"
    bad.write_text(text.replace("policy: closest", "policy: aset\naset: {window: 500ms}"))
    assert load_experiment(bad).aset.checkpoint == DEFAULT_ASET_CHECKPOINT
    bad.write_text(text.replace("policy: closest", "policy: aset\naset: {checkpoint: models/aset/aset, window: 100ms}"))
    exp = load_experiment(bad)
    assert exp.aset.window_s == pytest.approx(0.1) and exp.aset.checkpoint == "models/aset/aset"


def test_cli_simulate_and_sweep(tmp_path):
    from testbed.cli.main import main

    assert main(["simulate", str(REPO / "experiments/triangle.yaml"), "--duration", "5s", "--policy", "random",
                 "--runs-dir", str(tmp_path)]) == 0
    (run,) = list(tmp_path.iterdir())
    df = pd.read_csv(run / "records.csv")
    assert len(df) > 0 and set(df["policy"]) == {"random"}
    assert main(["sweep", str(REPO / "experiments/triangle.yaml"), "--policies", "closest,best", "--out",
                 str(tmp_path / "sw")]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments/triangle.yaml").read_text().replace("rate_qps: 4", "rate_qps: -4"))
    assert main(["simulate", str(bad)]) == 2


def test_simulate_runs_policy_aset_on_its_checkpoint_and_refuses_a_missing_one(tmp_path):
    """A source on policy aset is driven in the simulator by its checkpoint, through the
    emulation's own selector (testbed.agent.live.SourceSelector): by default the general agent,
    on a held-out scenario no file was edited for. A checkpoint that does not exist is refused
    before anything is written, naming it; --policy still simulates a static policy."""
    import json

    from testbed.cli.main import main

    exp = tmp_path / "live.yaml"
    exp.write_text((REPO / "experiments/triangle.yaml").read_text().replace(
        "policy: closest", "policy: aset\naset: {checkpoint: models/aset/nope, window: 500ms}"))
    with pytest.raises(InputError, match=r"models/aset/nope.npz is missing"):
        run_simulation(plan_experiment(exp), runs_dir=tmp_path / "runs", duration_s=2)
    assert not (tmp_path / "runs").exists()
    assert main(["simulate", str(exp), "--duration", "2s", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert main(["simulate", str(exp), "--duration", "2s", "--policy", "closest", "--runs-dir",
                 str(tmp_path / "runs")]) == 0

    held = yaml.safe_load((REPO / "experiments/generated/held-out/gen-heldout-1.yaml").read_text())
    held["policy"] = "aset"  # no aset: section: the shipped general checkpoint
    (tmp_path / "held.yaml").write_text(yaml.safe_dump(held))
    plan = plan_experiment(tmp_path / "held.yaml")
    run_dir, _ = run_simulation(plan, runs_dir=tmp_path / "held", duration_s=6, quiet=True)
    rec = json.loads((run_dir / "run.json").read_text())["selector"]
    assert rec["kind"] == "gated" and rec["checkpoint"] == "models/aset/general" and len(rec["sha256"]) == 2
    assert rec["initial"] == {s: "min_latency" for s in rec["sources"]}  # the gated checkpoint's reference
    assert rec["sources"] == sorted(s.name for s in plan.sources) and rec["window_s"] == 0.5
    assert all(sum(c.values()) == 12 for c in rec["choices"].values())  # 6 s of 500 ms windows
    records = pd.concat([pd.read_csv(f) for f in (run_dir / "sources").glob("*.records.csv")])
    assert set(records["policy"]) <= set(rec["policies"])
    chosen = {p for c in rec["choices"].values() for p, n in c.items() if n}
    assert set(records["policy"]) - {"closest"} and set(records["policy"]) - {"closest"} <= chosen
