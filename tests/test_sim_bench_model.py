"""benchmarks/sim_bench.py judges our simulator against plain SimPy on one model: the SimPy
version's (a cluster's workers as servers of drawn unthrottled service times; no shared CPU quota,
no request handling, no cold calls). ``baseline_model`` must give our simulator exactly that, and
on it ours serves what the model's queue admits (pure logic, no SimPy needed)."""

from __future__ import annotations

from bench_modules import load_benchmark

from testbed.sim import Simulator


def test_the_baseline_model_has_no_quota_no_handling_and_no_cold_calls():
    sb = load_benchmark("sim_bench")
    plan = sb.bench_plan(20.0, "closest")
    full = Simulator(plan, seed=1, track_resolved=False)
    assert any(c.shared or c.handles for c in full.clusters)  # the scenario as planned has both
    base_plan = sb.baseline_model(plan)
    base = Simulator(base_plan, seed=1, track_resolved=False)
    for c in base.clusters:
        assert not c.shared and not c.handles and c.cold is None, c.name
        assert c.quota.runner(False) is not c.quota.run  # the unthrottled call's shortcut
    for c, ms in base_plan.services.items():
        for m, f in ms.items():
            old = plan.services[c][m]
            assert f.samples_ms == old.samples_ms and f.workers == old.workers  # the same service times
    base.run_until(5.0)
    assert base.dispatched > 1000 and sum(c.served for c in base.clusters) / base.dispatched > 0.9
