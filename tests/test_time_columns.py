"""The record's time columns in both engines: every instant (t0, td, t1, t1h, t2, t3, t3h, t4) and
the five shares of e2e (dispatch, network, handling, queueing, inference) filled for an answered
query, the shares adding up to e2e, and the server's reading and writing in handling_ms, not in
network_ms.

The simulator's tests are unit tests; the emulation's runs experiments/triangle.yaml for real
(marked ``emulation``: run it under the shared lock, ``flock /tmp/emu.lock``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from emu_checks import expect_run_ok, run_triangle

from testbed.model.cpu import CfsQuota
from testbed.model.records import SHARES
from testbed.plan.build import build_plan, plan_experiment
from testbed.plan.catalog import FixedCatalog
from testbed.results.summary import read_csv_exact
from testbed.sim import Simulator
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
INSTANTS = ("t0_ns", "td_ns", "t1_ns", "t1h_ns", "t2_ns", "t3_ns", "t3h_ns", "t4_ns")


def check_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Assert every answered row has every instant, in order, and its five shares add up to e2e
    (each rounded to 1 us: 5 us at most); returns the answered rows."""
    ans = df[pd.to_numeric(df["http_status"], errors="coerce") == 200]
    assert len(ans) > 0
    for col in (*INSTANTS, *(f"{k}_ms" for k in SHARES), "e2e_ms", "expected_rtt_ms"):
        assert ans[col].notna().all(), col
    t = ans[list(INSTANTS)].astype("int64")
    for a, b in zip(INSTANTS, INSTANTS[1:], strict=False):
        assert (t[b] >= t[a]).all(), f"{b} before {a}"
    total = sum(ans[f"{k}_ms"].astype(float) for k in SHARES)
    assert ((total - ans["e2e_ms"].astype(float)).abs() <= 0.005).all()
    return ans


def test_the_simulator_fills_every_time_column_and_the_shares_add_up(tmp_path):
    plan = plan_experiment(TRIANGLE)
    sim = Simulator(plan, record=True)
    sim.arrivals_end = 8.0
    sim.run_until(9.0)
    ans = check_columns(pd.DataFrame(sim.records()))
    # the server's event loop reads each request and writes each answer on the cluster's quota:
    # the plan's handling (digits_small, handling.json) is in handling_ms, and nothing of it in network_ms
    fig = plan.services["edgec"]["digits_small"]
    assert (ans["handling_ms"] >= fig.request_ms + fig.answer_ms - 1e-3).all()
    assert (ans["dispatch_ms"] == 0).all()  # a built-in policy's decisions cost nothing in the simulator


def _loaded_plan(handling_ms: float, answer_ms: float, rate_qps: float):
    """A cluster at 0.25 core under more load than its quota carries, with request handling."""
    exp = Experiment.model_validate({
        "name": "handling", "duration": "4s", "seed": 2, "policy": "closest", "report_interval": "100ms",
        "topology": {"source": str(REPO / "topologies/triangle.yaml")},
        "clusters": [{"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": 0.25, "workers": 1,
                      "queue_limit": 64, "models": ["m"]}],
        "sources": [{"name": "s", "site": "A"}],
        "applications": [{"name": "app", "deadline": "2s", "min_accuracy": 0.5}],
        "workload": [{"application": "app", "sources": "all", "rate_qps": rate_qps}]})
    catalog = FixedCatalog({"m": ("digits", 0.9, [4.0])}, handling_ms=handling_ms, answer_ms=answer_ms)
    return build_plan(exp, base_dir=REPO / "experiments", catalog=catalog)


def test_the_answer_is_written_on_the_quota_after_the_call():
    """t3 -> t3h is the event loop writing the answer on the same CFS quota: at low load it takes
    the answer's CPU; under a throttled quota it waits for the next period, in handling_ms."""
    plan = _loaded_plan(handling_ms=2.0, answer_ms=0.5, rate_qps=2)
    sim = Simulator(plan, record=True)
    sim.arrivals_end = 4.0
    sim.run_until(7.0)
    qt = sim.query_table().dropna(subset=["t3h_s"])
    assert len(qt) > 3
    assert ((qt["t3h_s"] - qt["t3_s"]) * 1e3).min() == pytest.approx(0.5, abs=1e-6)  # alone: its CPU only
    assert ((qt["t1h_s"] - qt["t1_s"]) * 1e3).min() == pytest.approx(1.5, abs=1e-6)  # handling - answer
    busy = Simulator(_loaded_plan(handling_ms=2.0, answer_ms=0.5, rate_qps=80), record=True)
    busy.arrivals_end = 4.0
    busy.run_until(7.0)
    qb = busy.query_table().dropna(subset=["t3h_s"])
    write = (qb["t3h_s"] - qb["t3_s"]) * 1e3
    assert write.max() > 10.0  # an answer that waited for the quota's next period (or the loop)
    ans = check_columns(pd.DataFrame(busy.records()))
    assert ans["handling_ms"].median() > 2.0


def test_the_isolated_query_reads_computes_and_writes_on_one_quota():
    from testbed.model.service import isolated_query_s

    q = CfsQuota(0.25, 1, 1, handling=True)
    alone = q.handle(q.run(q.handle(0.0, 0.0015), 0.004), 0.0005)
    assert isolated_query_s(0.25, 1, 1, 0.004, 0.002, 1.0, 0.0005) == pytest.approx(alone)
    assert alone == pytest.approx(0.006)  # 6 ms of CPU within the first period's 25 ms of quota


@pytest.mark.emulation
def test_the_emulation_fills_every_time_column_and_the_shares_add_up(tmp_path):
    """A short real emulation of the triangle: every instant from the source and the server's
    headers (T1 the kernel's receive stamp, T1h, T2, T3, T3h), the shares adding up to e2e, and the
    server's reading and writing in handling_ms: the network excess stays below the handling."""
    code, run_dir = run_triangle(tmp_path, duration="8s")
    expect_run_ok(code, run_dir=run_dir)
    df = read_csv_exact(run_dir / "records.csv")
    ans = check_columns(df)
    assert (ans["handling_ms"] > 0).all()  # the server read and wrote every answered query
    assert (ans["dispatch_ms"] < 5.0).all()  # a built-in decision: microseconds, not milliseconds
