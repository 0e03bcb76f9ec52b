"""A query that fails because its path was cut, or no route exists, has a network cause
(``unreachable``: :func:`testbed.model.records.classify` with the spans of
:func:`testbed.model.network.no_route_spans`), in both engines; the summary counts it, and a run in
which every query failed exits 6 (:data:`testbed.core.errors.EXIT_ALL_FAILED`) with a headline
that says why.

The triangle (A-B 2 ms, B-C 3 ms, A-C 10 ms) with srca alone: A's two links down cut it off from
both clusters. The simulator tests are fast; the emulation test (real Mininet, OVS, ryu-manager and
servers, about 40 s) runs under the shared lock like every emulation test."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from emu_checks import expect_run_ok

from testbed.cli.main import main
from testbed.core.errors import EXIT_ALL_FAILED
from testbed.model.network import NetworkState, no_route_spans, path_cut
from testbed.model.records import classify
from testbed.plan.build import build_plan
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _experiment(tmp_path: Path, events: list[dict], duration: str = "8s") -> Path:
    data = copy.deepcopy(yaml.safe_load(TRIANGLE.read_text()))
    data["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    data["sources"] = [{"name": "srca", "site": "A"}]
    data["duration"] = duration
    data["events"] = events
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _down(at: str, a: str, b: str) -> dict:
    return {"at": at, "kind": "link_down", "link": [a, b]}


def _up(at: str, a: str, b: str) -> dict:
    return {"at": at, "kind": "link_up", "link": [a, b]}


def test_the_model_rule_spans_without_a_route_and_the_cause():
    net = NetworkState([("A", "B", 2.0, 100.0, 0.0), ("B", "C", 3.0, 100.0, 0.0), ("A", "C", 10.0, 100.0, 0.0)],
                       ["A", "B", "C"])
    data = copy.deepcopy(yaml.safe_load(TRIANGLE.read_text()))
    data["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    data["events"] = [_down("1s", "A", "B"), _down("2s", "A", "C"), _up("4s", "A", "B")]
    plan = build_plan(Experiment.model_validate(data), base_dir=TRIANGLE.parent)
    sw = {h.name: h.switch for h in plan.hosts}
    spans = no_route_spans(plan.network_state(), plan.changes, [(sw["srca"], sw["edgeb"]), (sw["srcc"], sw["edgeb"])])
    assert spans[(sw["srca"], sw["edgeb"])] == [(2.0, 4.0)]  # A-B down at 1 s: A still reaches B over C
    assert spans[(sw["srcc"], sw["edgeb"])] == []
    assert plan.no_route_spans()[("srca", "edgec")] == [(2.0, 4.0)]
    assert no_route_spans(net, [], [("A", "C")]) == {("A", "C"): []}
    # a query's life meets the span, or not
    assert path_cut([(2.0, 4.0)], 1.0, 2.1) and path_cut([(2.0, math.inf)], 9.0, 10.0)
    assert not path_cut([(2.0, 4.0)], 0.0, 1.9) and not path_cut([(2.0, 4.0)], 4.0, 5.0)
    # the cause: a query without an answer in time on a cut path is the network's
    assert classify(None, None, 100.0, 0.9, 0.5, cut=True) == ("failure", "unreachable")
    assert classify(0, 5.0, 100.0, 0.9, 0.5, cut=True) == ("failure", "unreachable")
    assert classify(200, 900.0, 100.0, 0.9, 0.5, cut=True) == ("failure", "unreachable")  # late, after the cut
    assert classify(200, 900.0, 100.0, 0.9, 0.5) == ("failure", "deadline_miss")
    assert classify(503, 5.0, 100.0, 0.9, 0.5, cut=True) == ("failure", "dropped")
    assert classify(None, None, 100.0, 0.9, 0.5) == ("failure", "deadline_miss")
    assert classify(200, 50.0, 100.0, 0.9, 0.5, cut=True) == ("success", "")
    assert classify(-1, 5.0, 100.0, 0.9, 0.5, cut=True) == ("failure", "server_down")


def test_a_source_cut_off_from_every_cluster_fails_unreachable_and_the_run_exits_6(tmp_path, capsys):
    """With every cluster cut off at 0 s all queries failed as
    deadline_miss and the run exited 0, nothing in the summary saying why."""
    path = _experiment(tmp_path, [_down("0s", "A", "B"), _down("0s", "A", "C")])
    code = main(["simulate", str(path), "--runs-dir", str(tmp_path / "runs")])
    said = " ".join(capsys.readouterr().out.split())
    assert code == EXIT_ALL_FAILED == 6
    run_dir = next((tmp_path / "runs").iterdir())
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["queries"] > 0 and s["failures"] == {"unreachable": s["queries"]}
    assert s["all_failed"].startswith(f"every one of the {s['queries']} queries failed: unreachable {s['queries']} "
                                      f"(no route from the source to its cluster: a link cut by an event")
    assert f"ALL QUERIES FAILED (exit code 6): {s['all_failed']}" in said
    assert "ALL QUERIES FAILED" in (run_dir / "summary.md").read_text()


def test_every_query_failed_for_another_cause_also_exits_6(tmp_path, capsys):
    """Whatever the cause: both clusters killed at 0 s."""
    path = _experiment(tmp_path, [{"at": "0s", "kind": "cluster_down", "cluster": c, "mode": "kill"}
                                  for c in ("edgeb", "edgec")])
    code = main(["simulate", str(path), "--runs-dir", str(tmp_path / "runs")])
    said = " ".join(capsys.readouterr().out.split())
    assert code == 6 and "every one of the" in said, said
    assert "server_down" in said and "nothing listened at the cluster" in said


def test_a_cut_during_the_run_is_counted_apart_from_deadline_misses(tmp_path):
    path = _experiment(tmp_path, [_down("3s", "A", "B"), _down("3s", "A", "C"), _up("5s", "A", "B"),
                                  _up("5s", "A", "C")])
    assert main(["simulate", str(path), "--runs-dir", str(tmp_path / "runs")]) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    df = pd.read_csv(run_dir / "records.csv")
    t = (df["t0_ns"] - df["t0_ns"].min()) / 1e9  # close enough to the load's start for 4 q/s
    cut = df[(df["t0_ns"] >= 3e9) & (df["t0_ns"] < 5e9)]
    assert len(cut) > 0 and (cut["failure_cause"] == "unreachable").all(), cut
    assert (df.loc[t > 5.2, "outcome"] == "success").all()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["failures"]["unreachable"] == len(cut) and "deadline_miss" not in s["failures"]


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_an_emulated_source_whose_links_go_down_records_unreachable(tmp_path):
    """The same cut on real packets, 3 s long (more than the deadline + 2 s of grace): the queries
    srca creates while A's links are down get no answer, or one after the link is back and long
    past their deadline, and their cause is ``unreachable``, tied to the planned event, not
    ``deadline_miss``."""
    from testbed.results.runs import run_emulation

    path = _experiment(tmp_path, [_down("2s", "A", "B"), _down("2s", "A", "C"), _up("5s", "A", "B"),
                                  _up("5s", "A", "C")], duration="7s")
    plan = build_plan(Experiment.model_validate(yaml.safe_load(path.read_text())), base_dir=path.parent)
    expect_run_ok(run_emulation(plan, runs_dir=tmp_path / "runs", duration_s=7), tmp_path / "runs")
    run_dir = next((tmp_path / "runs").iterdir())
    df = pd.read_csv(run_dir / "records.csv")
    ev = pd.read_csv(run_dir / "events.csv")
    down_ns = ev.loc[ev["kind"] == "link_down", "applied_unix_s"].max() * 1e9
    up_ns = ev.loc[ev["kind"] == "link_up", "applied_unix_s"].min() * 1e9
    during = df[(df["t0_ns"] > down_ns + 0.1e9) & (df["t0_ns"] < up_ns - 0.1e9)]
    assert len(during) >= 4 and during["http_status"].isna().any(), during.to_dict("records")
    assert (during["failure_cause"] == "unreachable").all(), during.to_dict("records")
    after = df[df["t0_ns"] > up_ns + 0.3e9]  # created once the links were back
    assert len(after) > 0 and (after["failure_cause"] != "unreachable").all(), after.to_dict("records")
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["failures"]["unreachable"] == int((df["failure_cause"] == "unreachable").sum()) >= len(during)
