"""A dispatch decision's cost lands in dispatch_ms (td - t0), not in network_ms, in both engines.

A ``module:callable`` plug-in that sleeps 50 ms per decision: the plan records its cost (the
median of its plan-time check calls, ``plan.decision_ms``), the simulator charges it to every
decision it makes (the same plan simulated again gives the same records), the summary reports it
per policy and warns (50 ms of a 100 ms deadline); a short real emulation measures it per query.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from emu_checks import expect_run_ok, run_triangle
from plugin_files import modules_on_path

from testbed.plan.build import build_plan
from testbed.plan.resolved import Plan
from testbed.results.figures import DECISION_SHARE_NOTABLE, decision_costs
from testbed.sim import Simulator
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
SLEEP_MS = 50.0
SLOW = '''
import time

from testbed.model.policies import Decision, policy_plugin


@policy_plugin()
def slow_closest(options, deadline_ms, min_accuracy, ctx=None):
    """The closest option, after a 50 ms nap: a decision that costs."""
    time.sleep(0.05)
    best = min(options, key=lambda o: (o.rtt_ms, o.service_ms))
    return Decision(best.cluster, best.model, False)
'''
REF = "tb_slow_policy:slow_closest"


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> Path:
    yield from modules_on_path(tmp_path_factory, "slowpolicy", {"tb_slow_policy.py": SLOW})


def _experiment(policy: str) -> Experiment:
    data = yaml.safe_load(TRIANGLE.read_text())
    data["policy"] = policy
    return Experiment.model_validate(data)


def _records(plan: Plan) -> pd.DataFrame:
    sim = Simulator(plan, record=True)
    sim.arrivals_end = 8.0
    sim.run_until(9.0)
    return pd.DataFrame(sim.records())


def test_the_simulator_charges_the_plugins_cost_to_dispatch_not_network(slow):
    plan = build_plan(_experiment(REF), base_dir=TRIANGLE.parent)
    assert plan.decision_ms[REF] == pytest.approx(SLEEP_MS, abs=15.0)  # measured at plan time
    base = build_plan(_experiment("closest"), base_dir=TRIANGLE.parent)
    assert base.decision_ms == {"closest": 0.0}
    slow_df, base_df = _records(plan), _records(base)
    ans = slow_df[slow_df["http_status"] == 200]
    assert len(ans) > 20
    assert ((ans["dispatch_ms"] - plan.decision_ms[REF]).abs() <= 1e-3).all()
    assert ((ans["td_ns"] - ans["t0_ns"] - ans["dispatch_ms"] * 1e6).abs() <= 500).all()  # ms to 3 decimals
    # the same decisions, the same network: the cost is not network time
    b = base_df[base_df["http_status"] == 200]
    assert ans["network_ms"].median() == pytest.approx(b["network_ms"].median(), abs=0.01)
    assert (ans["e2e_ms"].median() - b["e2e_ms"].median()) == pytest.approx(plan.decision_ms[REF], abs=1.0)
    # re-simulating plan.json: the recorded cost, not a new measurement
    again = Plan.model_validate_json(plan.model_dump_json())
    pd.testing.assert_frame_equal(_records(again), slow_df)


def test_the_summary_reports_the_decision_cost_and_warns():
    df = pd.DataFrame({"policy": ["slow"] * 10 + ["closest"] * 10,
                       "dispatch_ms": [50.0] * 10 + [0.02] * 10, "deadline_ms": [100.0] * 20})
    got = decision_costs(df)
    assert got["slow"]["p50_ms"] == 50.0 and got["slow"]["share_of_deadline"] == 0.5 and got["slow"]["notable"]
    assert not got["closest"]["notable"] and got["closest"]["share_of_deadline"] < DECISION_SHARE_NOTABLE
    from testbed.results.render import _headline

    lines = _headline({"queries": 20, "duration_s": 8.0, "success_ratio": 1.0, "decision_cost": got})
    assert lines[1].startswith("WARNING: policy slow's decisions cost 50.0 ms (p50)")


@pytest.mark.emulation
def test_the_emulation_measures_the_decision_in_dispatch_not_network(slow, tmp_path):
    """A short real emulation with the sleeping plug-in: ~50 ms in dispatch_ms per query, and the
    network excess of the built-in policy's order (a few ms), not +50 ms."""
    code, run_dir = run_triangle(tmp_path, policy=REF, duration="6s")
    expect_run_ok(code, run_dir=run_dir)
    from testbed.results.summary import read_csv_exact

    df = read_csv_exact(run_dir / "records.csv")
    ans = df[pd.to_numeric(df["http_status"], errors="coerce") == 200]
    assert len(ans) > 5
    assert ans["dispatch_ms"].astype(float).median() == pytest.approx(SLEEP_MS, abs=10.0)
    excess = (ans["network_ms"].astype(float) - ans["expected_rtt_ms"].astype(float)).median()
    assert excess < 15.0, f"network excess p50 {excess:.1f} ms: the decision's 50 ms leaked into network time"
    summary = (run_dir / "summary.md").read_text()
    assert f"WARNING: policy {REF}'s decisions cost" in summary
