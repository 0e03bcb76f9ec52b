"""``expected_rtt_ms`` is the RTT of the path in force when the query was sent (at td), with the
delays in force then: after a ``link_delay`` event the slowed path's, after a ``link_down``
reroute the new path's. One function of the model computes it from the plan's timeline
(:func:`testbed.model.network.rtt_timeline`, :func:`~testbed.model.network.rtt_at`), which both
engines use (the simulator directly, the emulated source through ``SourceConfig.rtt_steps``)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from testbed.model.network import rtt_at
from testbed.plan.boundaries import SourceConfig
from testbed.plan.build import build_plan
from testbed.sim import Simulator
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"  # A-B 2 ms, B-C 3 ms, A-C 10 ms: srca -> edgec goes A-B-C


def _plan(events: list[dict]):
    data = yaml.safe_load(TRIANGLE.read_text())
    data["events"] = events
    data["sources"] = [{"name": "srca", "site": "A", "policy": "max_accuracy"}, {"name": "srcc", "site": "C"}]
    data["workload"] = [{"application": "digits", "sources": ["srca"], "rate_qps": 20}]
    return build_plan(Experiment.model_validate(data), base_dir=TRIANGLE.parent)


EVENTS = [{"at": "2s", "kind": "link_delay", "link": ["B", "C"], "delay": "6ms"},
          {"at": "4s", "kind": "link_down", "link": ["A", "B"]}]


def test_the_timeline_follows_a_delay_change_and_a_reroute():
    plan = _plan(EVENTS)
    steps = plan.rtt_timelines()[("srca", "edgec")]
    assert steps == [(0.0, 10.0), (2.0, 16.0), (4.0, 20.0)]  # A-B-C; slowed B-C; A-B down: A-C direct
    assert rtt_at(steps, 1.999) == 10.0 and rtt_at(steps, 2.0) == 16.0 and rtt_at(steps, 5.0) == 20.0
    assert plan.rtt_timelines()[("srca", "edgeb")][-1] == (4.0, 32.0)  # A-C-B once A-B is down: 2 x (10 + 6) ms


def test_a_cut_path_has_no_rtt():
    plan = _plan([{"at": "1s", "kind": "link_down", "link": ["A", "B"]},
                  {"at": "1s", "kind": "link_down", "link": ["A", "C"]}])
    steps = plan.rtt_timelines()[("srca", "edgec")]
    assert steps[-1][0] == 1.0 and math.isinf(steps[-1][1])
    cfg = SourceConfig.from_plan(plan, "srca", 0, plan.experiment.duration_s, Path("/tmp"))
    assert cfg.rtt_steps["edgec"][-1] == (1.0, None)  # None in the source's config: the record's cell is empty


def test_simulated_records_carry_the_rtt_in_force_at_td():
    plan = _plan(EVENTS)
    sim = Simulator(plan, record=True)
    sim.arrivals_end = 6.0
    sim.run_until(7.0)
    df = pd.DataFrame(sim.records())
    df = df[df["cluster"] == "edgec"]
    td = df["td_ns"] / 1e9
    want = td.map(lambda t: 10.0 if t < 2 else 16.0 if t < 4 else 20.0)
    assert len(df) > 50 and set(want) == {10.0, 16.0, 20.0}
    assert (df["expected_rtt_ms"] == want).all()
    ans = df[df["http_status"] == 200]
    excess = ans["network_ms"] - ans["expected_rtt_ms"]
    assert excess.min() >= 0 and excess.max() < 5.0  # transfer only: the new path's delay is not excess


def test_the_emulated_source_gets_the_same_timeline_on_the_wall_clock():
    from testbed.plan.dilation import dilate, with_time_dilation

    plan = _plan(EVENTS)
    k = 3.0
    wall = dilate(with_time_dilation(plan, k))
    cfg = SourceConfig.from_plan(wall, "srca", 0, wall.experiment.duration_s, Path("/tmp"))
    assert cfg.rtt_steps["edgec"] == [(0.0, 30.0), (6.0, 48.0), (12.0, 60.0)]
    # the source's record: the step in force at td on the wall clock, back to emulated ms through its clock
    assert cfg.clock.emulated(rtt_at(cfg.rtt_steps["edgec"], 7.0)) == pytest.approx(16.0)


def test_all_sources_configs_route_once_and_match_one_by_one():
    plan = _plan(EVENTS)
    plan.experiment.workload[0].sources.append("srcc")
    plan = build_plan(plan.experiment, base_dir=TRIANGLE.parent)
    every = SourceConfig.all_from_plan(plan, 0, 6.0, Path("/tmp"))
    assert list(every) == ["srca", "srcc"]
    for name, cfg in every.items():
        assert cfg == SourceConfig.from_plan(plan, name, 0, 6.0, Path("/tmp"))
    assert every["srcc"].rtt_steps["edgeb"] == [(0.0, 6.0), (2.0, 12.0)]  # C-B: 3 ms, then 6 ms; A-B down: no change
    assert SourceConfig.all_from_plan(plan, 0, 6.0, Path("/tmp"), ["srcc", "nosuch"]).keys() == {"srcc"}
