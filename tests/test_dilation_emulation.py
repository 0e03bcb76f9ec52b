"""Time dilation in a real emulation (Mininet, OVS, ryu-manager, inference servers): the triangle
at k = 2. The network runs every delay x 2 and TCP's minimum RTO x 2; the RTT self-check judges the
emulated RTTs against the undilated plan; the records, the summary and run.json are in
emulated time and say k. Root only, marked ``emulation``; run under ``flock /tmp/emu.lock``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from emu_checks import expect_run_ok

from testbed.core.clock import EmulatedClock
from testbed.emu.lifecycle import emulated_network, new_run_dir
from testbed.emu.selfcheck import check_rtts_twice
from testbed.plan.build import plan_experiment
from testbed.plan.dilation import dilate, with_time_dilation
from testbed.results.runs import run_emulation, run_simulation

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
K = 2.0

pytestmark = [pytest.mark.emulation, pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")]

#: The triangle's planned RTTs (ms, undilated): A-B 2 ms, B-C 3 ms, A -> C over B.
PLANNED_RTT_MS = {("srca", "edgeb"): 4.0, ("srca", "edgec"): 10.0, ("srcc", "edgeb"): 6.0, ("srcc", "edgec"): 0.0}


def test_dilated_network_delays_rto_and_self_check(tmp_path):
    plan = with_time_dilation(plan_experiment(TRIANGLE), K)
    wall = dilate(plan)
    run_id, run_dir = new_run_dir(wall, tmp_path)
    with emulated_network(wall, run_id, run_dir) as live:
        # the controller holds the wall-clock delays: A -> C over B is 2 x (2 + 3) ms
        srca, edgec = wall.host("srca"), wall.host("edgec")
        dpids, one_way = live.path_of(srca.mac, edgec.mac)
        assert dpids == [1, 2, 3] and one_way == pytest.approx(K * 5.0)
        # TCP's minimum RTO on every host's route: 200 ms x k
        for h in wall.hosts:
            route = live.emu.node(h.name).cmd("ip route")
            assert "rto_min 400ms" in route or "rto_min lock 400ms" in route, (h.name, route)
            # and a congestion window kept across idle periods (the model's transfer: a warm window)
            got = live.emu.node(h.name).cmd("sysctl -n net.ipv4.tcp_slow_start_after_idle").strip()
            assert got == "0", (h.name, got)
        em = wall.experiment.emulation
        results = check_rtts_twice(live.emu, wall, live.path_of, 10, em.rtt_tolerance_ms, em.rtt_tolerance_pct,
                                   em.rtt_tolerance_per_switch_ms, clock=EmulatedClock(K))
        for r in results:
            # judged in emulated ms against the undilated plan, with the experiment's own tolerance
            assert r.expected_ms == pytest.approx(PLANNED_RTT_MS[(r.source, r.cluster)])
            assert r.ok, f"{r.source}->{r.cluster}: {r.median_ms:.2f} ms vs {r.expected_ms:.2f} ms"
            assert min(r.samples) >= r.expected_ms  # no packet beats the emulated propagation delay
    assert json.loads((run_dir / "plan.json").read_text())["links"][0]["delay_ms"] == \
        plan.links[0].delay_ms  # plan.json is the emulated plan


def test_dilated_run_records_are_in_emulated_time(tmp_path):
    duration = 4.0
    plan = with_time_dilation(plan_experiment(TRIANGLE), K)
    expect_run_ok(run_emulation(plan, runs_dir=tmp_path / "emu", duration_s=duration), tmp_path / "emu")
    run_dir = next((tmp_path / "emu").iterdir())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["time_dilation"] == K and run["duration_s"] == duration and run["wall_duration_s"] == K * duration
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["time_dilation"] == K
    df = pd.read_csv(run_dir / "records.csv")
    # the same arrivals as the simulator on the same seed (drawn in emulated time, played 2 x slower)
    _, sim = run_simulation(plan, runs_dir=tmp_path / "sim", duration_s=duration, quiet=True)
    assert len(df) == sim["queries"] > 20
    # every instant within the emulated load: the run took 2 x 4 s on the wall clock
    start_ns = json.loads((run_dir / "load_start.json").read_text())["start_ns"]
    assert start_ns <= df["t0_ns"].min() and df["t0_ns"].max() <= start_ns + duration * 1e9
    # the plan's figures undilated in every row, and no answer faster than the emulated RTT
    assert set(df["deadline_ms"]) == {100.0}
    assert {(s, c): r for s, c, r in df[["source", "cluster", "expected_rtt_ms"]].itertuples(index=False)} \
        .items() <= PLANNED_RTT_MS.items()
    ok = df[df["outcome"] == "success"]
    assert len(ok) / len(df) > 0.5
    assert (ok["network_ms"] >= ok["expected_rtt_ms"] - 0.05).all()
    for a, b in (("t0_ns", "t1_ns"), ("t1_ns", "t2_ns"), ("t2_ns", "t3_ns"), ("t3_ns", "t4_ns")):
        assert (ok[a] <= ok[b]).all()
    rtt = pd.read_csv(run_dir / "rtt_check.csv")
    assert rtt["ok"].all()
    for row in rtt.itertuples(index=False):
        assert row.expected_rtt_ms == pytest.approx(PLANNED_RTT_MS[(row.source, row.cluster)])
