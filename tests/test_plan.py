"""Planning and validation: one test per rule of testbed.plan.build / testbed.spec.units (no root needed)."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.plan.build import PlanError, build_plan, plan_experiment
from testbed.spec.experiment import ConfigError, Experiment, load_experiment
from testbed.spec.topology import TopologyError, great_circle_km, load_graphml, raw_from_dict
from testbed.spec.units import UnitError, parse_delay_ms, parse_rate_mbps

REPO = Path(__file__).resolve().parent.parent

BASE = {
    "name": "t", "duration": "5s",
    "topology": {"source": "unused.yaml"},
    "clusters": [{"name": "edge", "site": "B", "tier": "far_edge", "cpu_cores": 0.5, "models": ["digits_small"]}],
    "sources": [{"name": "src", "site": "A"}],
    "applications": [{"name": "app", "deadline": "50ms", "min_accuracy": 0.5}],
    "workload": [{"application": "app", "rate_qps": 1}],
}
TRIANGLE = {
    "name": "tri",
    "nodes": [{"id": "A", "label": "A", "lat": 45.0, "lon": 7.0},
              {"id": "B", "label": "B", "lat": 46.0, "lon": 7.0},
              {"id": "C", "label": "C", "lat": 45.0, "lon": 8.0}],
    "links": [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}, {"a": "A", "b": "C", "delay_ms": 20.0}],
}


def exp(**changes) -> Experiment:
    d = copy.deepcopy(BASE)
    d.update(changes)
    return Experiment.model_validate(d)


def topo(origin="yaml", **changes):
    d = copy.deepcopy(TRIANGLE)
    d.update(changes)
    return raw_from_dict(d, origin)


# --- units ---

@pytest.mark.parametrize("value,ms", [("5ms", 5.0), ("0.5ms", 0.5), ("250us", 0.25), ("2s", 2000.0)])
def test_delay_units_accepted(value, ms):
    assert parse_delay_ms(value) == pytest.approx(ms)


@pytest.mark.parametrize("value,fragment", [
    ("5msms", "unknown unit 'msms'"),
    ("10 ms", "no spaces"),
    (10, "bare number"),
    ("10", "cannot parse"),
    ("5min", "unknown unit"),
    ("-1ms", "delay for link X-Y: .-1ms. is negative; a delay must be positive"),
])
def test_delay_units_rejected(value, fragment):
    with pytest.raises(UnitError, match=fragment):
        parse_delay_ms(value, item="link X-Y")


def test_rate_units():
    assert parse_rate_mbps("1Gbit/s") == 1000.0
    assert parse_rate_mbps("100Mbps") == 100.0
    with pytest.raises(UnitError, match="bare number"):
        parse_rate_mbps(100)
    with pytest.raises(UnitError, match="MB/s"):
        parse_rate_mbps("100MB/s")  # bytes are not accepted: ambiguous


def test_unit_in_key_takes_plain_number_only():
    assert exp(applications=[{"name": "app", "deadline_ms": 50, "min_accuracy": 0.5}]).applications[0].deadline_ms == 50
    with pytest.raises(Exception, match="carries its unit"):
        exp(applications=[{"name": "app", "deadline_ms": "50ms", "min_accuracy": 0.5}])


def test_experiment_file_errors_name_the_item(tmp_path):
    d = copy.deepcopy(BASE)
    d["applications"][0]["deadline"] = "10 ms"
    d["bogus"] = 1
    import yaml

    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as ei:
        load_experiment(f)
    msg = str(ei.value)
    assert "applications.0" in msg and "no spaces" in msg
    assert "bogus: unknown key" in msg


# --- names and references ---

def test_shell_metacharacters_in_names_rejected():
    with pytest.raises(Exception, match="pattern"):
        exp(clusters=[{"name": "e;reboot", "site": "B", "tier": "far_edge", "cpu_cores": 1,
                       "models": ["digits_small"]}])
    with pytest.raises(PlanError, match="lower-case letters and digits"):
        build_plan(exp(), topo(nodes=[dict(TRIANGLE["nodes"][0], name="s1$(id)")] + TRIANGLE["nodes"][1:]))


def test_interface_name_longer_than_15_bytes_rejected():
    long = "clusterabcdefgh"  # 15 chars -> "clusterabcdefgh-eth0" is 20 bytes
    e = exp(clusters=[{"name": long, "site": "B", "tier": "far_edge", "cpu_cores": 1, "models": ["digits_small"]}])
    msg = r"interface name 'clusterabcdefgh-eth0' is 20 bytes, over the Linux limit of 15"
    with pytest.raises(PlanError, match=msg):
        build_plan(e, topo())


def test_unknown_site_suggests_close_match():
    e = exp(sources=[{"name": "src", "site": "Bb"}])
    with pytest.raises(PlanError, match=r"source 'src': unknown node 'Bb' \(did you mean 'B'"):
        build_plan(e, topo())


def test_unknown_application_in_workload():
    with pytest.raises(Exception, match="unknown application 'nope'"):
        exp(workload=[{"application": "nope", "rate_qps": 1}])


def test_name_clash_between_host_and_switch():
    e = exp(sources=[{"name": "s1", "site": "A"}])
    with pytest.raises(PlanError, match="source name 's1' clashes with switch"):
        build_plan(e, topo())


# --- DPIDs ---

def test_duplicate_dpid_rejected():
    nodes = copy.deepcopy(TRIANGLE["nodes"])
    nodes[0]["dpid"], nodes[1]["dpid"] = 7, 7
    with pytest.raises(PlanError, match="DPID 0x7 is used by nodes 'A' and 'B'"):
        build_plan(exp(), topo(nodes=nodes))


def test_zero_dpid_rejected():
    nodes = copy.deepcopy(TRIANGLE["nodes"])
    nodes[2]["dpid"] = 0
    with pytest.raises(PlanError, match="DPID 0 out of range"):
        build_plan(exp(), topo(nodes=nodes))


def test_default_dpids_are_unique_and_nonzero():
    plan = build_plan(exp(), topo())
    assert [s.dpid for s in plan.switches] == [1, 2, 3]


# --- delays ---

def test_delay_from_geography():
    plan = build_plan(exp(), topo())
    ab = next(lk for lk in plan.links if {lk.a, lk.b} == {"s1", "s2"})
    km = great_circle_km(45.0, 7.0, 46.0, 7.0)
    assert km == pytest.approx(111.2, abs=0.1)  # one degree of latitude
    assert ab.delay_source == "geo" and ab.delay_ms == pytest.approx(km * 0.005)
    ac = next(lk for lk in plan.links if {lk.a, lk.b} == {"s1", "s3"})
    assert ac.delay_ms == 20.0 and ac.delay_source == "config"


def test_delay_floor_applies():
    nodes = copy.deepcopy(TRIANGLE["nodes"])
    nodes[1].update(lat=45.0001, lon=7.0)  # ~11 m from A
    plan = build_plan(exp(), topo(nodes=nodes))
    ab = next(lk for lk in plan.links if {lk.a, lk.b} == {"s1", "s2"})
    assert ab.delay_ms == 0.1 and ab.delay_source == "floor"


def test_node_without_coordinates_needs_explicit_delay():
    nodes = copy.deepcopy(TRIANGLE["nodes"])
    nodes[1].update(lat=None, lon=None)
    with pytest.raises(PlanError, match="node 'B' has no coordinates"):
        build_plan(exp(), topo(nodes=nodes))
    links = [{"a": "A", "b": "B", "delay_ms": 1.0}, {"a": "B", "b": "C", "delay_ms": 1.0},
             {"a": "A", "b": "C", "delay_ms": 20.0}]
    assert len(build_plan(exp(), topo(nodes=nodes, links=links)).links) == 3


# --- graph shape ---

def test_self_loop_is_an_error_in_our_yaml():
    with pytest.raises(PlanError, match="self-loop on node 'A'"):
        build_plan(exp(), topo(links=TRIANGLE["links"] + [{"a": "A", "b": "A"}]))


def test_self_loop_is_dropped_and_noted_for_datasets():
    plan = build_plan(exp(), topo("topohub", links=TRIANGLE["links"] + [{"a": "A", "b": "A"}]))
    assert len(plan.links) == 3
    assert any("self-loop on 'A' dropped" in n for n in plan.notes)


def test_parallel_link_is_an_error_in_our_yaml():
    with pytest.raises(PlanError, match=r"link #3 \(B - A\): parallel link between 'B' and 'A'"):
        build_plan(exp(), topo(links=TRIANGLE["links"] + [{"a": "B", "b": "A", "delay_ms": 1.0}]))


def test_parallel_links_merged_for_datasets(tmp_path):
    f = tmp_path / "zoo.graphml"
    f.write_text("""<?xml version="1.0" encoding="utf-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key attr.name="Latitude" attr.type="double" for="node" id="d1"/>
  <key attr.name="Longitude" attr.type="double" for="node" id="d2"/>
  <key attr.name="label" attr.type="string" for="node" id="d3"/>
  <graph edgedefault="undirected">
    <node id="0"><data key="d1">45.0</data><data key="d2">7.0</data><data key="d3">Torino</data></node>
    <node id="1"><data key="d1">45.46</data><data key="d2">9.19</data><data key="d3">Milano</data></node>
    <edge source="0" target="1"/>
    <edge source="0" target="1"/>
  </graph>
</graphml>""")
    raw = load_graphml(f)
    assert raw.origin == "graphml" and len(raw.links) == 2
    e = exp(clusters=[{"name": "edge", "site": "Milano", "tier": "far_edge", "cpu_cores": 1,
                       "models": ["digits_small"]}], sources=[{"name": "src", "site": "Torino"}])
    plan = build_plan(e, raw)
    assert len(plan.links) == 1 and plan.links[0].bandwidth_mbps == 200.0
    assert any("merged into one" in n for n in plan.notes)


def test_disconnected_graph_rejected_then_kept_largest():
    nodes = TRIANGLE["nodes"] + [{"id": "D", "label": "D", "lat": 40.0, "lon": 7.0}]
    with pytest.raises(PlanError, match=r"disconnected: 2 components: \{A, B, C\}; \{D\}"):
        build_plan(exp(), topo(nodes=nodes))
    e = exp(topology={"source": "x.yaml", "keep_largest_component": True})
    plan = build_plan(e, topo(nodes=nodes))
    assert len(plan.switches) == 3 and any("dropped 1 node(s)" in n and "D" in n for n in plan.notes)


def test_unknown_link_endpoint():
    with pytest.raises(PlanError, match=r"link #3 \(A - Z\): unknown node 'Z'"):
        build_plan(exp(), topo(links=TRIANGLE["links"] + [{"a": "A", "b": "Z", "delay_ms": 1.0}]))


def test_duplicate_node_id():
    with pytest.raises(PlanError, match="node id 'A' appears twice"):
        build_plan(exp(), topo(nodes=TRIANGLE["nodes"] + [{"id": "A", "label": "A2", "lat": 1.0, "lon": 1.0}]))


# --- paths and the shipped files ---

def test_expected_paths_follow_least_delay():
    plan = build_plan(exp(), topo())
    p = plan.paths[0]
    assert (p.source, p.cluster, p.switches) == ("src", "edge", ["s1", "s2"])
    plan2 = build_plan(exp(clusters=[{"name": "edge", "site": "C", "tier": "far_edge", "cpu_cores": 1,
                                      "models": ["digits_small"]}]), topo())
    via_b = plan2.links[0].delay_ms + plan2.links[1].delay_ms
    assert via_b < 20.0
    assert plan2.paths[0].switches == ["s1", "s2", "s3"] and plan2.paths[0].rtt_ms == pytest.approx(2 * via_b)


def test_default_experiment_plans():
    plan = plan_experiment(REPO / "experiments" / "digits-abilene.yaml")
    assert len(plan.switches) == 12 and len(plan.links) == 15  # Abilene 11 + cloud, 14 + cloud link
    tiers = {h.tier for h in plan.clusters}
    assert tiers == {"far_edge", "near_edge", "cloud"} and len(plan.sources) >= 4
    sea_fesv = next(p for p in plan.paths if (p.source, p.cluster) == ("sea", "fesv"))
    assert sea_fesv.switches == ["s4", "s5"]  # Seattle - Sunnyvale, 1139 km
    assert sea_fesv.rtt_ms == pytest.approx(2 * 1139.0 * 0.005, rel=0.01)


def test_unknown_topohub_key():
    e = exp(topology={"source": "topohub:topozoo/Nowhere"})
    with pytest.raises(TopologyError, match="topohub has no topology 'topozoo/Nowhere'"):
        build_plan(e)


def test_plan_cli_needs_no_root_and_reports_errors(tmp_path):
    abilene = REPO / "experiments" / "digits-abilene.yaml"
    ok = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(abilene)],
                        capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0, ok.stderr
    assert "Kansas City" in ok.stdout and "expected RTT ms" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration: 5\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "duration" in r.stdout and "bare number" in r.stdout


def test_switch_named_like_a_link_emulator_rejected():
    nodes = copy.deepcopy(TRIANGLE["nodes"])
    nodes[0]["name"] = "l1"
    with pytest.raises(PlanError, match="switch name 'l1' .* is reserved for the link emulator of link #1"):
        build_plan(exp(), topo(nodes=nodes))


def test_infinite_values_and_cloud_source_without_cloud_rejected():
    with pytest.raises(Exception, match="finite"):
        exp(clusters=[{"name": "edge", "site": "B", "tier": "far_edge", "cpu_cores": float("inf"),
                       "models": ["digits_small"]}])
    with pytest.raises(Exception, match="source 'src' sits in the cloud"):
        exp(sources=[{"name": "src", "site": "cloud"}])


def test_non_utf8_experiment_and_bad_graphml_coordinates(tmp_path):
    f = tmp_path / "e.yaml"
    f.write_bytes(b"\xff\xfe\x00name: x\x80")
    with pytest.raises(ConfigError, match=r"e.yaml: not UTF-8 text \(byte 0\)"):
        load_experiment(f)
    with pytest.raises(ConfigError, match="/dev/zero is not a regular file"):  # it used to read forever
        load_experiment("/dev/zero")
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_experiment(tmp_path)
    g = tmp_path / "g.graphml"
    g.write_text('<?xml version="1.0"?><graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
                 '<key attr.name="Latitude" attr.type="string" for="node" id="d1"/>'
                 '<graph edgedefault="undirected"><node id="0"><data key="d1">north</data></node></graph></graphml>')
    with pytest.raises(TopologyError, match="Latitude 'north' is not a number"):
        load_graphml(g)


def test_error_text_with_brackets_is_printed_verbatim(tmp_path):
    d = copy.deepcopy(BASE)
    d["clusters"][0]["name"] = "Bad Name"
    import yaml

    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and "^[a-z][a-z0-9]*$" in r.stdout


def test_plan_warns_when_no_pair_meets_the_deadline_at_zero_load_and_names_the_nearest_deadline():
    """Deadline 5 ms under the RTT from A to the edge at B (A-B 5 ms one-way): a WARNING naming the
    application, the fastest pair with its parts (the plan's RTT, the messages' transfers, the
    model's expected_ms) and the nearest whole-ms deadline, which then plans without it; the
    verdict is the one function testbed run and simulate print (feasibility_warnings)."""
    from testbed.plan.checks import INFEASIBLE_WARNING, feasibility_warnings, zero_load_feasibility

    slow = topo(links=[{"a": "A", "b": "B", "delay_ms": 5.0}, *TRIANGLE["links"][1:]])
    plan = build_plan(exp(applications=[{"name": "app", "deadline": "5ms", "min_accuracy": 0.5}]), slow)
    (f,) = zero_load_feasibility(plan)
    best = f.fastest["src"]
    rtt, service = plan.rtt_ms("src", "edge"), plan.services["edge"]["digits_small"].expected_ms
    assert (best.cluster, best.model, best.rtt_ms, best.service_ms) == ("edge", "digits_small", rtt, service)
    assert rtt >= 10 and best.network_ms > rtt and not f.ok and f.late_sources == ["src"]
    nearest = f.nearest_deadline_ms()
    assert nearest == math.ceil(best.network_ms + service)
    warnings = [n for n in plan.notes if n.startswith(INFEASIBLE_WARNING)]
    assert warnings == feasibility_warnings(plan) and len(warnings) == 1
    assert "'app'" in warnings[0] and "deadline of 5 ms" in warnings[0]
    assert "src -> edge with digits_small" in warnings[0]
    assert f"nearest deadline that would work: {nearest:g} ms" in warnings[0]
    ok = build_plan(exp(applications=[{"name": "app", "deadline": f"{nearest:g}ms", "min_accuracy": 0.5}]), slow)
    assert zero_load_feasibility(ok)[0].ok and not feasibility_warnings(ok)
    short = build_plan(exp(applications=[{"name": "app", "deadline": f"{nearest - 1:g}ms", "min_accuracy": 0.5}]),
                       slow)
    assert not zero_load_feasibility(short)[0].ok


def test_simulate_prints_the_plans_feasibility_warning_before_it_starts(tmp_path):
    """testbed simulate prints the same WARNING as testbed plan, before the simulation's output."""
    import yaml

    d = copy.deepcopy(BASE)
    d["topology"]["source"] = "t.yaml"
    d["applications"][0]["deadline"] = "5ms"
    t = copy.deepcopy(TRIANGLE)
    t["links"][0]["delay_ms"] = 5.0
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(t))
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(d))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "simulate", str(tmp_path / "e.yaml"), "--duration", "2s",
                        "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    warn = [i for i, line in enumerate(lines) if line.startswith("WARNING: no query of application 'app'")]
    assert r.returncode == 6 and len(warn) == 1, r.stdout + r.stderr
    assert warn[0] < next(i for i, line in enumerate(lines) if line.startswith("simulated "))




def test_a_load_beyond_every_clusters_cores_is_noted_and_a_light_one_is_not():
    light = build_plan(exp(), topo())
    assert not any("offers at least" in n for n in light.notes)
    heavy = build_plan(exp(workload=[{"application": "app", "rate_qps": 5000}]), topo())
    note = next(n for n in heavy.notes if "offers at least" in n)
    f = heavy.services["edge"]["digits_small"]
    work = 5000 * (sum(f.samples_ms) / len(f.samples_ms) + f.handling_ms) / 1e3  # cores of work at the profile's speed
    assert work > 0.5 and f"at least {work:.2f} cores of work" in note and "clusters of 0.5 cores" in note
    # run and simulate print it before they start, as testbed plan lists it
    from rich.console import Console

    from testbed.cli.common import print_feasibility
    out = Console(record=True, width=400)
    print_feasibility(heavy, out)
    assert f"note: {note}" in out.export_text()
