"""What ``testbed plan`` refuses with exit code 2 and a message naming the item, before anything is
built: a workload that creates no query or is too short for one, a minimum accuracy no served model
reaches, a model listed twice, links too slow for one request within its deadline, deadlines, report
intervals and link delays past their bounds, an empty node id, a topology that is not a regular file,
and the mutated files that once passed. Fast: no emulation.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from triangle_inputs import plan_cli, triangle

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


def test_a_workload_that_creates_no_query_is_refused(tmp_path, capsys):
    code, out = plan_cli(capsys, triangle(tmp_path, **{"rate_qps: 4": "rate_qps: 0"}))
    assert code == 2
    assert ("the workload creates no query in 8 s (workload.0 (digits): its poisson rates are 0 q/s): the run would "
            "measure nothing; give some entry a rate above 0") in out
    # an entry at 0 beside one that sends is a choice, not an error
    ok = triangle(tmp_path, "ok.yaml", **{"rate_qps: 4}": "rate_qps: 4}\n  - {application: digits, rate_qps: 0}"})
    assert plan_cli(capsys, ok)[0] == 0


def test_a_load_too_short_for_one_query_is_refused_before_anything_is_built(tmp_path, capsys):
    """``--duration=0.0001ms`` creates no query: refused before the emulation is built, not a run that
    exits 5 after its bring-up."""
    path = triangle(tmp_path)
    code = main(["run", str(path), "--duration=0.0001ms", "--runs-dir", str(tmp_path / "runs")])
    got = capsys.readouterr()
    out = " ".join((got.out + got.err).split())
    assert code == 2 and "fewer than 1" in out and not (tmp_path / "runs").exists()
    # 2 sources x 4 q/s x 0.2 s = 1.6 queries: a short run, but not an empty one
    assert main(["plan", str(triangle(tmp_path, "short.yaml", **{"duration: 8s": "duration: 200ms"}))]) == 0


def test_a_min_accuracy_no_served_model_reaches_is_refused(tmp_path, capsys):
    from testbed.plan.zoo import load_manifest

    best = load_manifest(REPO / "models" / "zoo")["variants"]["digits_large"]["accuracy"]  # as this zoo measured it
    code, out = plan_cli(capsys, triangle(tmp_path, **{"min_accuracy: 0.5": "min_accuracy: 0.9999"}))
    assert code == 2
    assert ("application 'digits': min_accuracy 0.9999 is above every model of its family 'digits' the clusters "
            f"serve (the best: digits_large {best:.4f}), so every query would fail 'accuracy'") in out
    assert plan_cli(capsys, triangle(tmp_path, "ok.yaml", **{"min_accuracy: 0.5": f"min_accuracy: {best}"}))[0] == 0


def test_a_model_listed_twice_in_a_cluster_is_refused(tmp_path, capsys):
    twice = {"models: [digits_small]}": "models: [digits_small, digits_small]}"}
    code, out = plan_cli(capsys, triangle(tmp_path, **twice))
    assert code == 2
    assert "clusters.0.models: 'digits_small' listed twice: a cluster serves each model once" in out


def test_a_host_link_one_request_cannot_cross_within_its_deadline_is_refused(tmp_path, capsys):
    """19,335 request bytes are 14 frames at MTU 1500: (19,335 + 14 x 66) x 8 bits at 1 kbit/s =
    162.1 s (testbed.model.network.transfer_ms), against a deadline of 100 ms. The run built
    everything and failed the warm-up after 34 s with an empty TimeoutError."""
    code, out = plan_cli(capsys, triangle(tmp_path, **{"host_bandwidth: 1Gbit/s": "host_bandwidth: 1kbit/s"}))
    assert code == 2
    assert ("topology.host_bandwidth (the host link of source 'srca'): 0.001 Mbit/s: one request of application "
            "'digits' (19,335 bytes) takes 162.1 s to cross it, over its deadline of 100 ms, so no such query could "
            "succeed; raise the bandwidth") in out
    # 2 Mbit/s: 81.0 ms, within the deadline
    two = {"host_bandwidth: 1Gbit/s": "host_bandwidth: 2Mbit/s"}
    assert plan_cli(capsys, triangle(tmp_path, "ok.yaml", **two))[0] == 0


def test_a_backbone_link_on_a_path_too_slow_for_one_request_is_refused(tmp_path, capsys):
    topo = (REPO / "topologies" / "triangle.yaml").read_text().replace(
        "{a: A, b: B, delay: 2ms, bandwidth: 100Mbit/s}", "{a: A, b: B, delay: 2ms, bandwidth: 1Mbit/s}")
    (tmp_path / "tri.yaml").write_text(topo)
    exp = triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): str(tmp_path / "tri.yaml")})
    code, out = plan_cli(capsys, exp)
    assert code == 2
    assert ("link 'A' - 'B' (l1, on the path srca -> edgeb): 1 Mbit/s: one request of application 'digits' "
            "(19,335 bytes) takes 162.1 ms to cross it, over its deadline of 100 ms") in out


@pytest.mark.parametrize("mutant", ["rate_zero", "minacc_unserv", "models_dup", "tl_bw1k", "hostbw_bps"])
def test_files_with_a_load_accuracy_model_or_bandwidth_that_cannot_work_are_refused(mutant, tmp_path, capsys):
    """The triangle with one change each that no run can carry out: no load, an accuracy no model
    reaches, a model listed twice, a host link too slow for one request."""
    changes = {"rate_zero": {"rate_qps: 4": "rate_qps: 0"},
               "minacc_unserv": {"min_accuracy: 0.5": "min_accuracy: 0.9999"},
               "models_dup": {"models: [digits_small]}": "models: [digits_small, digits_small]}"},
               "tl_bw1k": {"host_bandwidth: 1Gbit/s": "host_bandwidth: 1kbit/s"},
               "hostbw_bps": {"host_bandwidth: 1Gbit/s": "host_bandwidth: 1bit/s"}}[mutant]
    assert plan_cli(capsys, triangle(tmp_path, **changes))[0] == 2


def test_a_deadline_beyond_the_bound_is_refused_naming_why(tmp_path, capsys):
    """``deadline: 1e12s`` passed the plan, and the simulator, stepping through the drain after the
    load (the longest deadline + 2 s grace) once per report interval, never ended."""
    code, out = plan_cli(capsys, triangle(tmp_path, **{"deadline: 100ms": "deadline: 1e12s"}))
    assert code == 2
    assert ("applications.0.deadline in ms: 1e+12 s is over the bound of 600 s "
            "(testbed.spec.experiment.MAX_DEADLINE_S): after the load a run waits up to the longest deadline + 2 s "
            "for the last answers") in out


def test_the_longest_deadline_drains_in_bounded_time(tmp_path):
    """At the bound (600 s) the simulator ends at the load + 600 s + 2 s grace, in seconds of wall time."""
    import json

    from testbed.plan.build import plan_experiment
    from testbed.results.runs import run_simulation

    plan = plan_experiment(triangle(tmp_path, **{"deadline: 100ms": "deadline: 600s"}))
    t = time.perf_counter()
    run_dir, s = run_simulation(plan, run_dir=tmp_path / "run", quiet=True)
    assert time.perf_counter() - t < 30 and s["queries"] > 0
    assert json.loads((run_dir / "run.json").read_text())["duration_s"] == pytest.approx(8 + 600 + 2)


def test_the_report_interval_bound_counts_the_drain(tmp_path, capsys):
    """(99,999 s of load + 602 s of drain) / 0.5 s = 201,202 intervals: over 200,000, though the
    load alone (199,998) is not."""
    code, out = plan_cli(capsys, triangle(tmp_path, **{"deadline: 100ms": "deadline: 600s",
                                                     "duration: 8s": "duration: 99999s\nreport_interval: 500ms",
                                                     "rate_qps: 4": "rate_qps: 0.001"}))
    assert code == 2
    assert ("duration 99999 s + the drain after it (602 s: the longest deadline + 2 s grace) / report_interval 0.5 s "
            "= 201202 report intervals, over the bound of 200000") in out


def test_link_delays_above_600_s_are_refused_naming_them(tmp_path, capsys):
    """A cloud, topology or event delay of 1e308 ms summed to an infinite RTT, and ``testbed plan
    --json`` wrote ``Infinity`` (not JSON); each is now refused, naming it."""
    cloud = triangle(tmp_path, "c.yaml",
                      **{"policy: closest": "policy: closest\ncloud: {attach_to: C, delay: 1e308ms}"})
    code, out = plan_cli(capsys, cloud)
    assert code == 2 and "cloud.delay in ms: Input should be less than or equal to 600000" in out
    topo = (REPO / "topologies" / "triangle.yaml").read_text().replace("delay: 10ms", "delay: 1e12ms")
    (tmp_path / "t.yaml").write_text(topo)
    code, out = plan_cli(capsys, triangle(tmp_path, "e.yaml", **{str(REPO / "topologies" / "triangle.yaml"):
                                                               str(tmp_path / "t.yaml")}))
    assert code == 2 and "links.2.delay in ms: Input should be less than or equal to 600000" in out
    event = triangle(tmp_path, "v.yaml", **{"policy: closest": "policy: closest\nevents:\n"
                                            "  - {at: 1s, kind: link_delay, link: [A, B], delay: 1e15ms}"})
    code, out = plan_cli(capsys, event)
    assert code == 2 and "events.0.delay in ms: Input should be less than or equal to 600000" in out


def test_an_empty_node_id_is_refused_naming_the_node(tmp_path, capsys):
    topo = tmp_path / "t.yaml"
    topo.write_text((REPO / "topologies" / "triangle.yaml").read_text().replace("{id: C,", "{id: '',")
                    .replace("{a: B, b: C,", "{a: B, b: '',").replace("{a: A, b: C,", "{a: A, b: '',"))
    path = triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): str(topo)})
    code, out = plan_cli(capsys, path)
    assert code == 2 and "node 3 of topology 'triangle' has an empty id" in out


def test_a_topology_that_is_not_a_regular_file_is_named_as_such(tmp_path, capsys):
    path = triangle(tmp_path, **{str(REPO / "topologies" / "triangle.yaml"): "/dev/null"})
    code, out = plan_cli(capsys, path)
    assert code == 2 and "/dev/null is not a regular file" in out and "not found" not in out
