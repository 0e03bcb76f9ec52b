"""What `testbed plan` refuses before anything is built, one test per rule, and the
pieces of a trustworthy run that need no root: the health watch, storage, the summary's tables."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from test_plan import BASE, TRIANGLE

from testbed.core.errors import EXIT_BRINGUP, EXIT_COMPONENT_DIED, RunFailure
from testbed.emu.health import Component, HealthWatch, LinkCheck, RunRecord, describe_exit
from testbed.emu.storage import Storage, StorageEstimate
from testbed.model.records import RECORD_FIELDS, make_record
from testbed.plan.build import PlanError, build_plan, check_load_bounds, run_dir_limit_problem
from testbed.results.summary import _headline, _tables, merge_records, print_summary, summarize
from testbed.spec.experiment import ConfigError, Experiment, load_experiment
from testbed.spec.schema import DuplicateKeyError, load_yaml
from testbed.spec.topology import TopologyError, graphml_link_speed, load_graphml, load_yaml_topology, raw_from_dict

REPO = Path(__file__).resolve().parent.parent

NODES, LINKS = TRIANGLE["nodes"], TRIANGLE["links"]


def exp(**changes) -> Experiment:
    d = copy.deepcopy(BASE)
    d.update(changes)
    return Experiment.model_validate(d)


def topo(origin="yaml", nodes=None, links=None):
    return raw_from_dict({"name": "tri", "nodes": copy.deepcopy(nodes or NODES),
                          "links": copy.deepcopy(links or LINKS)}, origin)


def write(tmp_path: Path, text: str, name: str = "e.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


# ------------------------------------------------------------------ duplicate keys, booleans

def test_duplicate_yaml_key_names_the_key_and_both_lines(tmp_path):
    f = write(tmp_path, "name: x\nduration: 5s\nseed: 1\nduration: 9s\n")
    with pytest.raises(ConfigError, match=r"key 'duration' appears twice in the same mapping, at line 2 and at line 4"):
        load_experiment(f)
    nested = "clusters:\n  - {name: a, site: B, name: b}\n"
    with pytest.raises(DuplicateKeyError, match="key 'name' appears twice.*line 2 and at line 2"):
        load_yaml(nested)
    assert load_yaml("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n")["c"] == {"x": 2}  # a merge key may be overridden


def test_duplicate_key_in_a_yaml_topology(tmp_path):
    f = write(tmp_path, "name: t\nnodes:\n  - {id: A}\nlinks: []\nnodes:\n  - {id: B}\n", "t.yaml")
    with pytest.raises(TopologyError, match="key 'nodes' appears twice.*line 2 and at line 5"):
        load_yaml_topology(f)


@pytest.mark.parametrize("where,value,fragment", [
    (("clusters", 0, "workers"), True, "workers: got the boolean true where a number is expected"),
    (("clusters", 0, "cpu_cores"), True, "boolean"),
    (("workload", 0, "rate_qps"), False, "boolean"),
    (("seed",), True, "seed: got the boolean true"),
    (("seed",), "3", "seed: expected an integer, got the string '3'"),
    (("emulation", "rtt_check"), 1, "rtt_check: expected true or false, got 1"),
    (("topology", "keep_largest_component"), "yes", "expected true or false, got 'yes'"),
])
def test_booleans_numbers_and_integers_are_never_converted(where, value, fragment):
    d = copy.deepcopy(BASE)
    d.setdefault("emulation", {})
    node = d
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    with pytest.raises(ValueError, match=fragment):
        Experiment.model_validate(d)


# ------------------------------------------------------------------ bounds the engines can execute

@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_bounds(seed):
    with pytest.raises(ValueError, match="seed"):
        exp(seed=seed)
    assert exp(seed=2**32 - 1).seed == 2**32 - 1 and exp(seed=0).seed == 0


def test_huge_rate_is_refused_before_the_simulator_runs_out_of_memory():
    with pytest.raises(ValueError, match="rate_qps"):
        exp(workload=[{"application": "app", "rate_qps": 1e12}])
    # within the per-stream bound, but a spatial weight concentrates it on one source
    e = exp(sources=[{"name": "src", "site": "A"}, {"name": "srcb", "site": "B"}],
            workload=[{"application": "app", "rate_qps": 6000, "weights": {"src": 1, "srcb": 0}}])
    with pytest.raises(PlanError, match=r"source 'src' would get 6000 q/s x spatial weight 2 = 12000 q/s"):
        build_plan(e, topo())


def test_expected_queries_of_a_run_are_bounded():
    e = exp(duration="400s", workload=[{"application": "app", "rate_qps": 5000}])
    with pytest.raises(PlanError, match=r"about 2e\+06 queries in 400 s.*bound of 1,000,000"):
        build_plan(e, topo())
    plan = build_plan(exp(), topo())
    assert check_load_bounds(plan.experiment, plan.weights, 5.0) == 5  # 1 q/s x 1 source x 5 s
    with pytest.raises(PlanError, match="duration 2e\\+06 s"):
        check_load_bounds(plan.experiment, plan.weights, 2e6)  # e.g. --duration on the command line


def test_tiny_report_interval_and_too_many_windows():
    with pytest.raises(ValueError, match="report_interval_s"):
        exp(report_interval="1ms")
    with pytest.raises(ValueError, match="200000 report intervals|report intervals, over the bound of 200000"):
        exp(duration="100000s", report_interval="100ms")


def test_interval_bounds_of_the_controller_and_aset():
    with pytest.raises(ValueError, match="stats_interval_s"):
        exp(emulation={"stats_interval": "10ms"})
    with pytest.raises(ValueError, match="window_s"):
        exp(aset={"window": "1ms"})


def test_mmpp_dwell_bounds():
    with pytest.raises(ValueError, match=r"mmpp: dwell_s.0: 1e-09 s is under the bound of 0.001 s"):
        exp(workload=[{"application": "app", "process": "mmpp", "rates_qps": [1, 2], "dwell_s": [1e-9, 1]}])
    e = exp(duration="20000s", report_interval="1s",
            workload=[{"application": "app", "process": "mmpp", "rates_qps": [0, 1], "dwell_s": [0.001, 1]}])
    with pytest.raises(PlanError, match="state changes per source"):
        build_plan(e, topo())


def test_trace_is_read_at_plan_time(tmp_path):
    e = exp(workload=[{"application": "app", "process": "trace", "trace": "missing.csv"}])
    with pytest.raises(PlanError, match="workload.0 .*missing.csv"):
        build_plan(e, topo(), base_dir=tmp_path)
    (tmp_path / "t.csv").write_text("t_s\n0.5\n1.0\n9.0\n")
    e = exp(workload=[{"application": "app", "process": "trace", "trace": "t.csv"}])
    plan = build_plan(e, topo(), base_dir=tmp_path)
    assert check_load_bounds(plan.experiment, plan.weights, 5.0, tmp_path) == 2  # 9.0 s is past the 5 s


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\x00t_s\n", r"not UTF-8 text \(byte 0\)"),
    (b"t_s\n" + b"1" * 200_000 + b"\n", r"line 2: not CSV \(field larger than field limit"),
    ("fifo", "is not a regular file"), ("/dev/zero", "is not a regular file")])
def test_a_trace_or_demand_matrix_that_is_not_csv_text_is_named_not_a_traceback_or_a_hang(tmp_path, content, message):
    """A non-UTF-8 or over-long field gave a traceback, /dev/zero or a
    FIFO made `testbed plan` read forever."""
    import os

    f = tmp_path / "t.csv"
    if content == "fifo":
        os.mkfifo(f)
    elif content == "/dev/zero":
        f = Path("/dev/zero")
    else:
        f.write_bytes(content)
    e = exp(workload=[{"application": "app", "process": "trace", "trace": str(f)}])
    with pytest.raises(PlanError, match=f"workload.0 .*trace {f}.*{message}"):
        build_plan(e, topo(), base_dir=tmp_path)
    from testbed.core.errors import InputError
    from testbed.plan.traces import read_demand_matrix

    with pytest.raises(InputError, match=f"demand matrix {f}.*{message}"):
        read_demand_matrix(f)


def test_ports_must_differ():
    with pytest.raises(ValueError, match="of_port and rest_port are both 6653"):
        exp(emulation={"of_port": 6653, "rest_port": 6653})
    with pytest.raises(ValueError, match="rest_port and server_port are both 8501"):
        exp(emulation={"rest_port": 8501})


def test_name_and_path_limits():
    with pytest.raises(ValueError, match="at most 100 characters"):
        exp(name="x" * 101)
    plan = build_plan(exp(), topo())
    assert run_dir_limit_problem(Path("/tmp"), plan) is None
    deep = Path("/tmp/" + "/".join(["d" * 200] * 21))
    assert "over the Linux limit of 4095" in run_dir_limit_problem(deep, plan)
    with pytest.raises(PlanError, match="runs_dir: the run's files would have paths of"):
        build_plan(exp(runs_dir=str(deep)), topo())


# ------------------------------------------------------------------ topology rules

def test_every_node_without_coordinates_is_named():
    nodes = copy.deepcopy(NODES) + [{"id": "D", "label": "Dee"}]
    nodes[1].update(lat=None, lon=None)
    links = LINKS + [{"a": "C", "b": "D"}]
    with pytest.raises(PlanError) as ei:
        build_plan(exp(), topo(nodes=nodes, links=links))
    msg = str(ei.value)
    assert "2 node(s) lack coordinates" in msg
    assert "node 'B' has no coordinates (links to 'A', 'C')" in msg and "node 'Dee' has no coordinates" in msg
    assert "lat/lon in the topology file" in msg


def test_graphml_advice_and_coordinates_override():
    nodes = copy.deepcopy(NODES)
    nodes[1].update(lat=None, lon=None)
    advice = r"set topology.coordinates: \{NODE: \[lat, lon\], \.\.\.\}.*Latitude/Longitude"
    with pytest.raises(PlanError, match=advice):
        build_plan(exp(), topo("graphml", nodes=nodes, links=LINKS[:2]))
    e = exp(topology={"source": "unused.yaml", "coordinates": {"B": [46.0, 7.0]}})
    plan = build_plan(e, topo("graphml", nodes=nodes, links=LINKS[:2]))
    assert plan.switch("s2").lat == 46.0 and plan.links[0].delay_source == "geo"
    with pytest.raises(PlanError, match="topology.coordinates: no node 'Zed'"):
        build_plan(exp(topology={"source": "u.yaml", "coordinates": {"Zed": [1, 2]}}), topo())
    with pytest.raises(ValueError, match="give \\[lat, lon\\] in degrees"):
        exp(topology={"source": "u.yaml", "coordinates": {"B": [99, 0]}})


def test_a_node_without_coordinates_in_a_dropped_component_does_not_block():
    nodes = copy.deepcopy(NODES) + [{"id": "D", "label": "D"}, {"id": "E", "label": "E"}]
    links = LINKS + [{"a": "D", "b": "E"}]
    e = exp(topology={"source": "u.yaml", "keep_largest_component": True})
    plan = build_plan(e, topo("graphml", nodes=nodes, links=links))
    assert {s.label for s in plan.switches} == {"A", "B", "C"}


def test_site_in_a_dropped_component_is_reported_as_dropped():
    nodes = copy.deepcopy(NODES) + [{"id": "D", "label": "Dee", "lat": 40.0, "lon": 1.0},
                                    {"id": "E", "label": "E", "lat": 41.0, "lon": 1.0}]
    links = LINKS + [{"a": "D", "b": "E"}]
    keep = {"source": "u.yaml", "keep_largest_component": True}
    with pytest.raises(PlanError, match="source 'src': node 'Dee' was dropped with its component"):
        build_plan(exp(topology=keep, sources=[{"name": "src", "site": "Dee"}]), topo("graphml", nodes, links))
    with pytest.raises(PlanError, match="cloud.attach_to: node 'E' was dropped with its component"):
        build_plan(exp(topology=keep, cloud={"attach_to": "E"}), topo("graphml", nodes, links))


def test_unknown_site_on_topohub_says_topohub_drops_nodes_without_coordinates():
    with pytest.raises(PlanError, match="topohub drops nodes that have no coordinates"):
        build_plan(exp(sources=[{"name": "src", "site": "Nowhere"}]), topo("topohub"))


def test_an_application_whose_family_no_cluster_serves():
    with pytest.raises(PlanError, match="application 'app': no cluster serves a model of its family 'cancer'"):
        build_plan(exp(applications=[{"name": "app", "deadline": "50ms", "min_accuracy": 0.5, "family": "cancer"}]),
                   topo())


@pytest.mark.parametrize("attrs,mbps,rule", [
    ({"LinkSpeedRaw": "2500000000.0", "LinkSpeed": "2.5", "LinkSpeedUnits": "G"}, 2500.0, "LinkSpeedRaw"),
    ({"LinkSpeed": "45", "LinkSpeedUnits": "M"}, 45.0, "LinkSpeed"),
    ({"LinkSpeed": "100-155", "LinkSpeedUnits": "M"}, 100.0, "LinkSpeed (range 100-155 M, lower bound)"),
    ({"LinkLabel": "100-155 Mbit/s"}, 100.0, "LinkLabel range '100-155 Mbit/s', lower bound"),
    ({"LinkLabel": "10-20Gbps"}, 10000.0, "LinkLabel range '10-20Gbps', lower bound"),
    ({"LinkLabel": "2.5 Gbps"}, 2500.0, "LinkLabel '2.5 Gbps'"),
    ({"LinkLabel": "OC-3"}, None, None),
    ({"LinkLabel": "1 GB/s"}, None, None),  # bytes: not guessed
    ({"LinkLabel": "< 10 Gbps"}, None, None),
    ({"LinkSpeedRaw": "0", "LinkSpeed": "10"}, None, None),  # no units: not guessed
])
def test_graphml_link_speed_rules(attrs, mbps, rule):
    assert graphml_link_speed(attrs) == (mbps, rule)


def test_graphml_capacities_are_read_and_reported(tmp_path):
    g = tmp_path / "g.graphml"
    data = ['<key attr.name="Latitude" attr.type="double" for="node" id="lat"/>',
            '<key attr.name="Longitude" attr.type="double" for="node" id="lon"/>',
            '<key attr.name="label" attr.type="string" for="node" id="lb"/>',
            '<key attr.name="LinkSpeedRaw" attr.type="double" for="edge" id="raw"/>',
            '<key attr.name="LinkLabel" attr.type="string" for="edge" id="ll"/>']
    nodes = "".join(f'<node id="{i}"><data key="lat">{45 + i}</data><data key="lon">7</data>'
                    f'<data key="lb">N{i}</data></node>' for i in range(3))
    edges = ('<edge source="0" target="1"><data key="raw">45000000.0</data></edge>'
             '<edge source="1" target="2"><data key="ll">100-155 Mbit/s</data></edge>'
             '<edge source="0" target="2"><data key="raw">10000000000.0</data></edge>')
    g.write_text('<?xml version="1.0"?><graphml xmlns="http://graphml.graphdrawing.org/xmlns">' + "".join(data)
                 + f'<graph edgedefault="undirected">{nodes}{edges}</graph></graphml>')
    raw = load_graphml(g)
    assert sorted(lk.bandwidth_mbps for lk in raw.links) == [45.0, 100.0, 10000.0]
    e = exp(clusters=[{"name": "edge", "site": "N1", "tier": "far_edge", "cpu_cores": 0.5, "models": ["digits_small"]}],
            sources=[{"name": "src", "site": "N0"}])
    plan = build_plan(e, raw)
    assert sorted(lk.bandwidth_mbps for lk in plan.links) == [45.0, 100.0, 10000.0]
    notes = " ".join(plan.notes)
    assert "GraphML link capacities: 1 from LinkLabel, 2 from LinkSpeedRaw" in notes
    assert "link 'N1' - 'N2': LinkLabel range '100-155 Mbit/s', lower bound -> 100 Mbit/s" in notes
    off = exp(topology={"source": "u", "bandwidth": "50Mbit/s", "dataset_link_speeds": False},
              clusters=e.model_dump()["clusters"], sources=[{"name": "src", "site": "N0"}])
    assert {lk.bandwidth_mbps for lk in build_plan(off, load_graphml(g)).links} == {50.0}


# ------------------------------------------------------------------ untrusted text never formats the console

MARKUP_TOPO = ('name: "[bold]topo[/bold]"\nnodes:\n  - {id: A, label: "Markup[/bold]", lat: 45.0, lon: 7.0}\n'
               '  - {id: B, label: "B[/i]", lat: 46.0, lon: 7.0}\nlinks:\n  - {a: A, b: B}\n')


def test_markup_in_labels_and_errors_is_printed_verbatim(tmp_path):
    write(tmp_path, MARKUP_TOPO, "t.yaml")
    d = copy.deepcopy(BASE)
    d["topology"] = {"source": "t.yaml"}
    d["sources"][0]["site"] = "Markup[/bold]"
    d["clusters"][0]["site"] = "B[/i]"
    f = write(tmp_path, json.dumps(d))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(f)], capture_output=True, text=True,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Markup[/bold]" in r.stdout and "B[/i]" in r.stdout and "'[bold]topo[/bold]'" in r.stdout
    d["sources"][0]["site"] = "Nowhere[/i]"
    f = write(tmp_path, json.dumps(d))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown node 'Nowhere[/i]'" in r.stdout and "Traceback" not in r.stderr


def test_one_error_handler_with_the_error_s_exit_code(tmp_path):
    f = write(tmp_path, "name: x\nname: y\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout.startswith("error: ") and "key 'name' appears twice" in r.stdout


# ------------------------------------------------------------------ the health watch (fake processes)

class FakeProc:
    def __init__(self, code=None):
        self.returncode = code
        self.pid = 2**22 + 1  # above the largest pid Linux gives (pid_max <= 2^22): never a real process

    def poll(self):
        return self.returncode


def _watch(tmp_path, providers, **kw):
    out = io.StringIO()
    record = RunRecord(tmp_path / "run.json", {"run_id": "x"})
    failed = []
    w = HealthWatch(record, Console(file=out, markup=False, width=200), providers, on_failure=lambda: failed.append(1),
                    **kw)
    w.t_load0 = 0.0
    return w, out, record, failed


def test_an_unplanned_death_is_reported_at_once_and_fails_the_run(tmp_path):
    log = tmp_path / "server-edge.log"
    log.write_text("serving\nTraceback: boom\n")
    server = FakeProc()
    w, out, record, failed = _watch(tmp_path, [lambda: [Component("server-edge", "inference server", server, log)]])
    w.check()
    assert w.failure is None
    server.returncode = -9
    w.check()
    assert isinstance(w.failure, RunFailure) and w.failure.exit_code == EXIT_COMPONENT_DIED and failed == [1]
    assert "inference server server-edge died: killed by SIGKILL (exit code -9)" in out.getvalue()
    inc = json.loads((tmp_path / "run.json").read_text())["health"]["incidents"][0]
    assert inc["component"] == "server-edge" and inc["exit_code"] == -9 and inc["last_lines"][-1] == "Traceback: boom"
    w.check()  # reported once
    assert len(record.data["health"]["incidents"]) == 1 and failed == [1]
    w.write_epitaphs()
    assert log.read_text().splitlines()[-1].endswith("died: killed by SIGKILL (exit code -9) during the run "
                                                    "(reported in run.json)")


def test_a_planned_death_and_a_normal_end_do_not_fail_the_run(tmp_path):
    down, source = {"edge": False}, FakeProc()
    server = FakeProc()
    comps = [Component("server-edge", "inference server", server, None, planned=lambda: down["edge"]),
             Component("source-a", "query source", source, None, normal_exit=frozenset({0}))]
    w, out, record, failed = _watch(tmp_path, [lambda: comps])
    down["edge"] = True
    server.returncode = -9
    source.returncode = 0
    w.check()
    assert w.failure is None and failed == [] and out.getvalue() == ""
    assert record.data["health"]["planned"][0]["how"] == "went down as planned: killed by SIGKILL (exit code -9)"
    # the restarted server is a new process object: its own death is judged afresh
    comps[0] = Component("server-edge", "inference server", FakeProc(1), None, planned=lambda: False)
    w.check()
    assert w.failure is not None and "exit code 1" in str(w.failure)


def test_a_source_that_fails_fails_the_run(tmp_path):
    comps = [Component("source-a", "query source", FakeProc(2), None, normal_exit=frozenset({0}))]
    w, _out, _record, _failed = _watch(tmp_path, [lambda: comps])
    w.check()
    assert w.failure is not None and "query source source-a died: exit code 2" in str(w.failure)


def test_unplanned_link_down_and_planned_link_down(tmp_path, monkeypatch):
    plan = build_plan(exp(), topo())
    import testbed.sdn.client as ctl

    monkeypatch.setattr(ctl, "get_status", lambda url, timeout_s=5.0: {"missing_links": [[1, 2]]})
    planned: set = set()
    links = LinkCheck("http://x", plan, lambda: planned, interval_s=0.0)
    w, out, _record, _failed = _watch(tmp_path, [], links=links)
    planned.add(frozenset(("s1", "s2")))
    w.check()
    assert w.failure is None
    planned.clear()
    w.check()
    assert "network link s1-s2 (l1) went down without a planned event" in str(w.failure)
    # a link that a planned link_up brings back and that the controller has not rediscovered is named so
    links.brought_up = {frozenset(("s1", "s2"))}
    w2, _out, _record, _failed = _watch(tmp_path / "2", [], links=links)
    w2.check()
    assert ("network link s1-s2 (l1) is missing at the controller with no planned event holding it down (lost "
            "again, or not rediscovered by LLDP within 10 s, wall clock, of its planned link_up)") in str(w2.failure)


def test_storage_full_frees_the_reserve_and_fails_the_run(tmp_path, monkeypatch):
    st = Storage(tmp_path, StorageEstimate(1000, 0, 0, 0, 4096))
    st.check()
    assert st.reserve_path.stat().st_size == 4096
    monkeypatch.setattr(st, "free_bytes", lambda: 10)
    w, out, _record, _failed = _watch(tmp_path, [], storage=st)
    w.check()
    assert not st.reserve_path.exists() and "is full (0.00 MiB free" in str(w.failure)


def test_storage_checks_before_bringup(tmp_path, monkeypatch):
    st = Storage(tmp_path, StorageEstimate(50 * 2**20, 2**20, 2**20, 0, 8 * 2**20))
    monkeypatch.setattr(st, "free_bytes", lambda: 10 * 2**20)
    with pytest.raises(RunFailure, match=r"10.0 MiB free, and this run writes about 60.0 MiB \(records 50.0 MiB") as ei:
        st.check()
    assert ei.value.exit_code == EXIT_BRINGUP
    with pytest.raises(RunFailure, match="is not writable"):
        Storage(Path("/proc/1"), StorageEstimate(0, 0, 0, 0, 1)).check()


def test_describe_exit():
    assert describe_exit(-9) == "killed by SIGKILL (exit code -9)" and describe_exit(3) == "exit code 3"
    assert describe_exit(None).startswith("exit code unknown")


# ------------------------------------------------------------------ the summary agrees with the records

def _records(tmp_path: Path) -> pd.DataFrame:
    (tmp_path / "sources").mkdir()
    (tmp_path / "clusters").mkdir()
    (tmp_path / "linkemu").mkdir()
    common = {"application": "app", "policy": "closest", "fallback": False, "deadline_ms": 50.0, "min_accuracy": 0.5,
              "model_accuracy": 0.9, "expected_rtt_ms": 4.0, "model": "m"}
    rows = []
    t0 = 1_700_000_000_000_000_000
    outcomes = [("c1", 200, 10), ("c1", 200, 10), ("c1", -1, 1), ("c1", 503, 2), ("c2", 200, 10), ("c2", None, None),
                ("c2", 200, 80), ("c2", 0, 1)]
    for i, (cl, st, e2e) in enumerate(outcomes, start=1):
        t = t0 + i * 100_000_000
        times = {"t1_ns": t + 2_000_000, "t2_ns": t + 3_000_000, "t3_ns": t + 4_000_000} if st == 200 else {}
        rows.append(make_record(query_id=f"a-{i}", source="a", cluster=cl, t0_ns=t, status=st,
                                t4_ns=None if e2e is None else t + e2e * 1_000_000, **times,
                                drop_reason="queue_full" if st == 503 else "", cold=(i == 1), **common))
    pd.DataFrame(rows, columns=RECORD_FIELDS).to_csv(tmp_path / "sources" / "a.records.csv", index=False)
    # c1's server was restarted: its first life's stats kept apart; they disagree with the records on purpose
    (tmp_path / "clusters" / "c1.stats.1.json").write_text(json.dumps({"served": 1, "dropped": 0, "per_model": {
        "m": {"timed": 1, "late": 1}}}))
    (tmp_path / "clusters" / "c1.stats.json").write_text(json.dumps({"served": 3, "dropped_queue_full": 2,
                                                                      "dropped": 2, "utilization": 0.1, "per_model": {
                                                                          "m": {"timed": 3, "late": 0}}}))
    (tmp_path / "clusters" / "c1.lives.json").write_text(json.dumps({"lives": 3, "ready": 2}))
    (tmp_path / "linkemu" / "l1.json").write_text(json.dumps({"frames_ab": 10, "frames_ba": 5, "lost_ab": 1,
                                                              "max_lateness_us": 21000.0, "mean_lateness_us": 300.0,
                                                              "overflow_ba": 2, "shaper_drops_ab": 7,
                                                              "delay_ms": 2.0}))
    return pd.DataFrame(rows)


def test_per_cluster_and_per_cause_tables_agree_with_the_records(tmp_path):
    rows = _records(tmp_path)
    s = summarize(tmp_path, 1.0)
    df = pd.read_csv(tmp_path / "records.csv")
    assert len(df) == len(rows) == s["queries"]
    for cl, g in df.groupby("cluster"):
        row = s["per_cluster"][cl]
        assert row["queries"] == len(g) and row["success"] == int((g["outcome"] == "success").sum())
        assert row["failures"] == {c: int((g["failure_cause"] == c).sum()) for c in row["failures"]}
    assert s["failures"] == {"deadline_miss": 2, "server_down": 1, "dropped": 1, "error": 1}
    assert s["drop_reasons"] == {"queue_full": 1}
    assert s["per_cluster"]["c1"]["server"] == {"lives": 3, "lives_not_ready": 1, "served": 4, "dropped": 2,
                                                "dropped_queue_full": 2, "dropped_admission": 0, "errors": 0,
                                                "utilization": 0.1, "calls": {"m": {"timed": 4, "late": 1}}}
    # (a third life killed while loading; the late calls summed over the lives)
    assert s["per_cluster"]["c1"]["success"] == 2  # the records, not the server's 4
    assert s["link_emulators"]["total"] == {"frames": 15, "lost": 1, "overflow": 2, "shaper_drops": 7,
                                            "dropped_down": 0, "kernel_drops": 0, "send_errors": 0,
                                            "max_late_ms": 21.0}
    assert s["cold_queries"] == 1 and s["e2e_ms"]["p50"] == 10.0
    assert s["records_check"] == {"rows_per_source_file": {"a": 8}, "rows_merged": 8, "missing_query_ids": {},
                                  "queries_created": {}, "queries_written": {}, "sources_without_tally": ["a"],
                                  "cut_last_line": {}, "records_file_missing": [], "rows_lost": {},
                                  "records_restored": []}


def test_summary_md_holds_markdown_tables(tmp_path):
    _records(tmp_path)
    s = summarize(tmp_path, 1.0)
    print_summary(s, Console(file=io.StringIO()), tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "┃" not in md and "│" not in md
    assert "| cluster   | queries   | success   |" in md.replace("  |", "  |")
    assert "\n|:--" in md and "### Per cluster (from the records; fail <cause>: failed queries by cause)" in md
    assert "### Link emulators" in md
    assert "New connections (cold = 1): 1 queries here; every source -> cluster/model path was warmed" in md
    assert "(over every answered query (HTTP 200 with an e2e time), cold ones (new connections) included)" in md


def test_a_lost_record_shows_as_a_gap_in_the_query_ids(tmp_path):
    _records(tmp_path)
    f = tmp_path / "sources" / "a.records.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    assert summarize(tmp_path, 1.0)["records_check"]["missing_query_ids"] == {"a": 1}


def test_records_lost_at_the_end_of_a_file_are_counted_from_the_sources_tally(tmp_path):
    from testbed.core.util import write_json_atomic
    from testbed.plan.boundaries import SourceTally, tally_path

    _records(tmp_path)
    f = tmp_path / "sources" / "a.records.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:-2]) + "\n")  # the last two records lost: no gap in the ids left
    assert summarize(tmp_path, 1.0)["records_check"]["missing_query_ids"] == {}  # without a tally: unseen
    write_json_atomic(tally_path(f), SourceTally(source="a", created=8, written=8, unwritten=0, failed=0))
    rc = summarize(tmp_path, 1.0)["records_check"]
    assert rc["missing_query_ids"] == {"a": 2} and rc["queries_created"] == {"a": 8}
    assert rc["sources_without_tally"] == []


def test_a_source_file_whose_last_line_is_cut_keeps_its_whole_rows_and_says_so(tmp_path):
    """`testbed report` of a killed run whose source file ended in a
    cut line was refused, naming a glob and a row of the merged frame. The whole rows are kept, the
    cut line is said; a bad line before the last is refused naming the file."""
    from testbed.results.summary import RecordsError, _headline

    _records(tmp_path)
    f = tmp_path / "sources" / "a.records.csv"
    whole = f.read_bytes()
    f.write_bytes(whole[:-30])  # the last row cut inside
    df = merge_records(tmp_path, write=False)
    assert len(df) == whole.count(b"\n") - 2 == 7  # 8 records, the header, the cut one left out
    s = summarize(tmp_path, 1.0)
    note = "its last line is cut short and left out (line 9 has 24 fields, the header 37 (the file is truncated " \
           "or not a records file))"
    assert s["records_check"]["cut_last_line"] == {"a": note}
    assert f"WARNING: sources/a.records.csv: {note}; its whole rows are kept." in _headline(s)
    lines = whole.decode().splitlines(keepends=True)
    f.write_text("".join(lines[:2] + [lines[2][:20] + "\n"] + lines[3:]))  # a cut line in the middle
    with pytest.raises(RecordsError, match=r"a.records.csv: line 3 has \d+ fields, the header \d+"):
        merge_records(tmp_path, write=False)


def test_a_source_whose_records_file_is_gone_is_counted_from_its_tally(tmp_path):
    """A records file deleted during the run left its source out of the
    summary and of the records check, while its tally said 19 records were written."""
    from testbed.core.util import write_json_atomic
    from testbed.plan.boundaries import SourceTally, tally_path
    from testbed.results.summary import _headline

    _records(tmp_path)
    f = tmp_path / "sources" / "b.records.csv"
    write_json_atomic(tally_path(f), SourceTally(source="b", created=19, written=19, unwritten=0, failed=0))
    s = summarize(tmp_path, 1.0)
    rc = s["records_check"]
    assert rc["records_file_missing"] == ["b"] and rc["missing_query_ids"] == {"b": 19}
    assert rc["rows_per_source_file"] == {"a": 8, "b": 0}
    assert ("WARNING: sources/b.records.csv is missing while the source's tally says it wrote 19 records: none of "
            "its queries is in this summary.") in _headline(s)


def test_the_merge_never_truncates_records(tmp_path, monkeypatch):
    _records(tmp_path)
    merge_records(tmp_path)
    before = (tmp_path / "records.csv").read_bytes()

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(RunFailure, match="No space left on device; the records are intact in"):
        merge_records(tmp_path)
    assert (tmp_path / "records.csv").read_bytes() == before
    assert not list(tmp_path.glob(".records.csv.*.tmp"))


def test_cold_is_what_the_source_saw_and_the_merge_marks_nothing(tmp_path):
    """Cold = 1 is a query that opened a new connection (the source's tracing); the merge used to
    mark the first query of each (source, cluster) pair of an emulated run when no query was cold,
    though the source had opened that connection before the load."""
    _records(tmp_path)
    f = tmp_path / "sources" / "a.records.csv"
    df = pd.read_csv(f)
    df["cold"] = 0
    df.to_csv(f, index=False)
    (tmp_path / "run.json").write_text(json.dumps({"mode": "emulation"}))
    s = summarize(tmp_path, 1.0)
    assert pd.read_csv(tmp_path / "records.csv")["cold"].eq(0).all()
    assert s["cold_queries"] == 0 and "opened a new TCP connection" in s["cold_rule"]
    assert "first query" not in s["cold_rule"]


def test_queries_that_opened_a_connection_count_in_the_latency_figures(tmp_path):
    """A query that opened a new connection mid-load (a burst) is the system's behaviour: it counts
    in the percentiles and the mean breakdown (they left it out, optimistic p95 and p99)."""
    _records(tmp_path)
    f = tmp_path / "sources" / "a.records.csv"
    df = pd.read_csv(f)
    df["cold"] = (df["query_id"] == "a-7").astype(int)  # the 80 ms query, sent during a burst
    df.to_csv(f, index=False)
    (tmp_path / "run.json").write_text(json.dumps({"mode": "emulation"}))
    s = summarize(tmp_path, 1.0)
    # answered e2e 10, 10, 10, 80 ms: p95 = 10 + 0.85 x 70 (linear), p99 = 10 + 0.97 x 70
    assert s["e2e_ms"] == {"p50": 10.0, "p95": 69.5, "p99": 77.9}
    assert s["cold_queries"] == 1 and s["per_cluster"]["c2"]["e2e_p95_ms"] == 76.5  # 10 and 80 ms
    # network = (t1 - t0) + (t4 - t3): 2 + 6 ms for the 10 ms answers, 2 + 76 for the 80 ms one
    assert s["breakdown_ms"] == {"dispatch": 0.0, "network": 25.5, "handling": 0.0, "queueing": 1.0,
                                 "inference": 1.0}  # network (3 x 8 + 78) / 4


def test_links_a_link_event_takes_down_are_planned_from_the_timeline(monkeypatch):
    from testbed.emu import lifecycle

    e = exp(events=[{"at": "2s", "kind": "link_down", "link": ["A", "B"]}, {"at": "5s", "kind": "link_up",
                                                                          "link": ["A", "B"]}])
    plan = build_plan(e, topo())
    ab = frozenset(("s1", "s2"))
    monkeypatch.setattr(lifecycle.time, "time", lambda: 1000.0)
    assert lifecycle._planned_links(plan, None) == set()  # before the load: nothing is planned down
    assert lifecycle._planned_links(plan, 1000.0 - 0.5) == set()
    assert lifecycle._planned_links(plan, 1000.0 - 1.5) == {ab}  # prepared ahead of its time
    assert lifecycle._planned_links(plan, 1000.0 - 20.0) == {ab}  # link_up not applied (reported) yet
    up = [{"event": 1, "step": 0, "kind": "link_up", "applied_s": 5.2, "applied_unix_s": 1000.0 - 14.8}]
    assert lifecycle._planned_links(plan, 1000.0 - 20.0, up) == set()
    up[0]["applied_unix_s"] = 1000.0 - 3.0  # applied late (the runner lagged): rediscovery grace from then
    assert lifecycle._planned_links(plan, 1000.0 - 20.0, up) == {ab}


def test_capture_points_and_cpu_share_are_checked_at_plan_time():
    """A capture interface the network does not have, and a CPU share below the emulation's
    smallest quota (1 ms per 100 ms), are refused by the plan, naming them."""
    with pytest.raises(PlanError, match="'srcx' is not a host"):
        build_plan(exp(capture={"interfaces": ["srcx"]}), topo())
    clusters = copy.deepcopy(BASE["clusters"])
    clusters[0]["cpu_cores"] = 0.001
    with pytest.raises(ValueError, match="cpu_cores"):
        exp(clusters=clusters)


def test_events_after_the_load_are_noted():
    plan = build_plan(exp(events=[{"at": "10s", "kind": "cluster_down", "cluster": "edge"}]), topo())
    assert any("do not happen" in n and "events.0 cluster_down at 10 s" in n for n in plan.notes), plan.notes


# ------------------------------------------------------------------ bounds and empty lists, named

def _plan_cli(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    write(tmp_path, yaml_dump({"name": "tri", "nodes": NODES, "links": LINKS}), "tri.yaml")
    f = write(tmp_path, text)
    return subprocess.run([sys.executable, "-m", "testbed.cli", "plan", str(f)], capture_output=True, text=True,
                          cwd=REPO, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})


def yaml_dump(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)


EXP_YAML = """Name: t
duration: 5s
topology: {source: tri.yaml}
clusters: [{name: edge, site: B, tier: far_edge, cpu_cores: 0.5, WORKERS models: [digits_small]}]
sources: [{name: src, site: A}]
applications: [{name: app, deadline: 50ms, min_accuracy: 0.5}]
workload: [{application: app, RATE}]
"""


def test_a_rate_in_exponent_form_states_the_value_the_bound_and_the_item(tmp_path):
    r = _plan_cli(tmp_path, EXP_YAML.replace("WORKERS ", "").replace("RATE", "rate_qps: 1e12"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert ("workload.0.rate_qps: 1e+12 q/s is over the bound of 10,000 q/s per stream and source "
            "(testbed.spec.experiment.MAX_RATE_QPS") in r.stdout
    assert load_yaml("a: 1e12\nb: -2E-3\nc: 1.5e3\nd: '1e12'\ne: 1e12ms\n") == \
        {"a": 1e12, "b": -0.002, "c": 1500.0, "d": "1e12", "e": "1e12ms"}  # YAML 1.2 numbers; text stays text
    r = _plan_cli(tmp_path, EXP_YAML.replace("WORKERS ", "").replace("RATE", "rate_qps: '2e3'"))
    assert r.returncode == 2 and "workload.0.rate_qps: '2e3' is a string, not a number; write it without quotes" \
        in r.stdout
    assert exp(workload=[{"application": "app", "rate_qps": 1e4}]).workload[0].rate_qps == 1e4  # the bound itself
    with pytest.raises(ValueError, match=r"steps.1.rate_qps\n.*20000 q/s is over the bound of 10,000 q/s"):
        exp(workload=[{"application": "app", "process": "step", "steps": [{"at": "0s", "rate_qps": 1},
                                                                         {"at": "1s", "rate_qps": 2e4}]}])
    with pytest.raises(ValueError, match=r"mmpp: rates_qps.1: 20000 q/s is over the bound of 10,000 q/s"):
        exp(workload=[{"application": "app", "process": "mmpp", "rates_qps": [1, 2e4], "dwell_s": [1, 1]}])


def test_workers_are_bounded_per_cluster(tmp_path):
    r = _plan_cli(tmp_path, EXP_YAML.replace("WORKERS", "workers: 100000,").replace("RATE", "rate_qps: 1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert ("clusters.0.workers: 100000 workers is over the bound of 64 per cluster "
            "(testbed.spec.experiment.MAX_WORKERS") in r.stdout
    clusters = copy.deepcopy(BASE["clusters"])
    clusters[0]["workers"] = 64
    assert build_plan(exp(clusters=clusters), topo()).host("edge").workers == 64
    clusters[0]["workers"] = 65
    with pytest.raises(ValueError, match="65 workers is over the bound of 64 per cluster"):
        exp(clusters=clusters)


def test_empty_lists_that_would_measure_nothing_are_refused_by_name(tmp_path):
    r = _plan_cli(tmp_path, EXP_YAML.replace("WORKERS ", "").replace("RATE", "rate_qps: 1, sources: []"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "workload.0.sources: [] selects no source, so this entry would send no query" in r.stdout
    for key in ("clusters", "sources", "applications", "workload"):
        with pytest.raises(ValueError, match=rf"{key}\n +List should have at least 1 item"):
            exp(**{key: []})
    clusters = copy.deepcopy(BASE["clusters"])
    clusters[0]["models"] = []
    with pytest.raises(ValueError, match=r"clusters.0.models\n +List should have at least 1 item"):
        exp(clusters=clusters)
    with pytest.raises(PlanError, match="capture.interfaces: the list is empty"):
        build_plan(exp(capture={"interfaces": []}), topo())
    # events: [] is meaningful (the default): a run without scenario events
    plan = build_plan(exp(events=[]), topo())
    assert plan.changes == [] and plan.experiment.events == []
    assert build_plan(exp(workload=[{"application": "app", "rate_qps": 1, "sources": ["src"]}]), topo()).weights \
        == [{"src": 1.0}]


def test_bound_errors_of_pydantic_show_the_value(tmp_path):
    f = write(tmp_path, json.dumps({**BASE, "seed": -1}))
    with pytest.raises(ConfigError, match=r"seed: Input should be greater than or equal to 0 \(got -1\)"):
        load_experiment(f)


# ------------------------------------------------------------------ commands that must not pretend

def test_aset_bench_help_is_help_and_a_missing_checkpoint_is_named(tmp_path):
    r = subprocess.run([sys.executable, "-m", "testbed.aset.bench", "--help"], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m testbed.aset.bench"), r.stdout + r.stderr
    assert "checkpoint" in r.stdout and "decisions to time (default: 20000)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "testbed.aset.bench", str(tmp_path / "none")], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: checkpoint {tmp_path / 'none'}: no file {tmp_path / 'none'}.npz" in r.stderr
    r = subprocess.run([sys.executable, "-m", "testbed.aset.bench", "a", "b", "0"], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 2 and "argument n: '0': give at least 1 decision" in r.stderr


def _fake_training(root: Path, steps: int, episodes: int):
    """What testbed.aset.dqn.train_seeds writes for one seed (files only, no TensorFlow)."""
    from testbed.aset.scenarios import TrainResult

    def train_seeds(cfg, base, **kw):
        out = root / "seed-1"
        (out / "checkpoints").mkdir(parents=True, exist_ok=True)
        (out / "tb").mkdir(exist_ok=True)
        for f in ("policy.npz", "policy.json", f"checkpoints/ckpt-{steps}.index", "tb/events.out.1", "episodes.csv"):
            (out / f).write_text("x")
        eps = [{"step": 10 * (i + 1), "success_ratio": 0.5} for i in range(episodes)]
        if eps:
            for f in (out / "curve.png", root / "curves.png"):
                f.write_text("png")
        return [TrainResult(out, out / "policy", 1, eps, 0.1, steps)]
    return train_seeds


def test_train_says_what_it_wrote_and_never_shows_curves_it_did_not_write(tmp_path, monkeypatch, capsys):
    import testbed.aset.dqn as train_mod
    from testbed.cli.main import main

    cfg = tmp_path / "experiments" / "tiny.yaml"
    cfg.parent.mkdir()
    cfg.write_text((REPO / "experiments" / "aset-tiny.yaml").read_text().replace(
        "out_dir: runs/aset-train", f"out_dir: {tmp_path / 'train'}", 1))
    (cfg.parent / "triangle.yaml").write_text((REPO / "experiments" / "triangle.yaml").read_text().replace(
        "../topologies/", f"{REPO / 'topologies'}/"))  # the command plans the training scenarios first
    root = tmp_path / "train" / "aset-tiny"
    root.mkdir(parents=True)
    (root / "curves.png").write_text("an earlier run's")
    monkeypatch.setattr(train_mod, "train_seeds", _fake_training(root, 1, 0))
    assert main(["train", str(cfg), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "seed 1: 1 step in 0 s; no episode finished (an episode is 10 steps)" in out  # 5 s / 500 ms
    assert f"not written: the learning curves: no episode finished in 1 step (an episode is 10 steps); the " \
           f"{root / 'curves.png'} there is an earlier run's" in " ".join(out.split())
    assert f"{root / 'seed-1' / 'policy'}.npz/.json (the exported policy)" in out
    assert f"{root / 'seed-1' / 'episodes.csv'} (0 episodes)" in out
    assert f"{root / 'seed-1' / 'checkpoints' / 'ckpt-1'} (the last checkpoint)" in out
    assert "(the learning curves)" not in out and "curve.png (this seed" not in out
    monkeypatch.setattr(train_mod, "train_seeds", _fake_training(root, 20, 2))
    assert main(["train", str(cfg), "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert f"{root / 'curves.png'} (the learning curves)" in out and "not written" not in out
    assert "2 episodes, success ratio of the last 2: 0.500" in out and f"{root / 'seed-1' / 'curve.png'}" in out


def test_a_dead_link_emulator_process_is_named_with_its_pid_and_every_link_it_served(tmp_path):
    """One link emulator process (E0) serves l1, l2 and l3 of the triangle: its death is one
    incident naming the process, its pid and every link (it was reported as linkemu-l1 and
    linkemu-l2, l3 missing, no pid, no log)."""
    from testbed.emu.bringup import Live
    from testbed.emu.lifecycle import _network_components
    from testbed.emu.mininet_network import Emulation
    from testbed.plan.build import plan_experiment

    plan = plan_experiment(REPO / "experiments" / "triangle.yaml")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "linkemu-E0.log").write_text("forwarding 3 links\n")
    emu = Emulation(plan=plan, link_emulator="userspace", datapath="user", run_dir=tmp_path)
    proc = FakeProc()
    emu._controls = {"E0": (None, proc, None)}
    emu.emulator_procs = {lk.emu_name: proc for lk in plan.links}
    live = Live(plan=plan, emu=emu, run_id="x", run_dir=tmp_path, rest_url="", link_emulator="userspace",
                datapath="user", bringup_s=0.0)
    w, out, record, failed = _watch(tmp_path, [lambda: _network_components(live)])
    w.check()
    assert sorted(w.seen) == ["linkemu-E0"]
    proc.returncode = -9
    w.check()
    said = ("HEALTH: link emulator linkemu-E0 (pid 4194305; serving 3 link(s): l1 (A-B), l2 (B-C), l3 (A-C)) died: "
            "killed by SIGKILL (exit code -9) at")
    assert said in " ".join(out.getvalue().split()) and failed == [1]
    (inc,) = json.loads((tmp_path / "run.json").read_text())["health"]["incidents"]
    assert inc["pid"] == 4194305 and inc["serves"] == ["l1 (A-B)", "l2 (B-C)", "l3 (A-C)"]
    assert inc["last_lines"] == ["forwarding 3 links"] and inc["log"] == str(tmp_path / "logs" / "linkemu-E0.log")
    assert "serving 3 link(s): l1 (A-B), l2 (B-C), l3 (A-C)" in str(w.failure)
    from testbed.results.summary import _tables

    (health,) = [t for t in _tables({"health": {"incidents": [inc]}}) if t[0].startswith("Health")]
    assert health[2][0][-1] == "pid 4194305: l1 (A-B), l2 (B-C), l3 (A-C)"


def test_summary_tables_read_as_what_they_are(tmp_path):
    """Review nits: link emulators in link order (l2 before l10), the cause columns labelled as the
    failure counts they are ('fail accuracy', not 'accuracy 0'), utilization rounded, 'n/a' for a
    latency not measured (not 'p50 None'), and a simulated run's link table not titled after a
    controller it does not have."""
    _records(tmp_path)
    for k in (10, 2):
        (tmp_path / "linkemu" / f"l{k}.json").write_text(json.dumps({"frames_ab": k, "delay_ms": 1.0}))
    (tmp_path / "clusters" / "c1.stats.json").write_text(json.dumps({"served": 3, "utilization": 0.144836}))
    s = summarize(tmp_path, 1.0)
    assert list(s["link_emulators"]["per_emulator"]) == ["l1", "l2", "l10"]
    tables = {t[0].split(" (")[0]: t for t in _tables(s)}
    cols = tables["Per cluster"][1]
    assert cols[5:10] == ["fail deadline_miss", "fail server_down", "fail dropped", "fail error", "fail accuracy"]
    server = tables["Server counters"]
    assert server[2][0][server[1].index("utilization")] == "0.145"
    nothing = {"queries": 3, "duration_s": 1.0, "e2e_ms": {"p50": None, "p95": None, "p99": None},
               "breakdown_ms": {"network": None, "queueing": None, "inference": None},
               "per_cluster": {"c": {"queries": 3, "success": 0, "success_ratio": 0.0, "answered": 0,
                                     "failures": {"deadline_miss": 3}, "e2e_p95_ms": None}}}
    headline = _headline(nothing)
    assert ("e2e ms: p50 n/a  p95 n/a  p99 n/a;  mean breakdown ms: dispatch n/a  network n/a  handling n/a  "
            "queueing n/a  inference n/a") in headline[1] and "None" not in " ".join(headline)
    assert _tables(nothing)[0][2][0][-1] == "n/a"
    link = {"s1-s2": {"capacity_mbps": 100.0, "util_ab_mean": 0.1, "util_ab_max": 0.2, "util_ba_mean": 0.0,
                      "util_ba_max": 0.0, "drops": 0}}
    simulated = _tables({"links": link, "mode": "simulation"})
    assert [t[0] for t in simulated] == ["Busiest links (the simulator's link load)"]
    assert [t[0] for t in _tables({"links": link})] == [
        "Busiest links (controller port stats: the bytes each link delivered at its far end, after its shaper)"]


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="preflight checks root first")
def test_preflight_names_a_dead_ovs_vswitchd_before_anything_is_built(monkeypatch):
    """With ovs-vswitchd killed (its monitor does not restart it after a
    SIGKILL), `ovs-vsctl show` still answered from the database, and the run failed 60 s later
    creating the bridges. Each daemon is asked now (the OVS answers faked: a pure-logic test)."""
    import testbed.emu.bringup as bringup

    real = subprocess.run

    def fake(cmd, *a, **k):
        if cmd[:1] == ["ovs-appctl"]:
            return subprocess.CompletedProcess(cmd, 1, "", "failed to connect to /var/run/openvswitch/ovs-vswitchd")
        if cmd[:1] == ["ovs-vsctl"]:
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real(cmd, *a, **k)

    monkeypatch.setattr(bringup.subprocess, "run", fake)
    with pytest.raises(RunFailure, match=r"Open vSwitch is not running \(ovs-vswitchd does not answer `ovs-appctl "
                                         r"--timeout=5 -t ovs-vswitchd version`\): start it with") as exc:
        bringup.preflight()
    assert exc.value.exit_code == 2


def test_a_run_records_the_command_and_the_code_that_reproduce_it():
    """No output named the command line or the code version of its
    run; run.json now has them (testbed.core.util.provenance) and the summary says them."""
    import re as _re

    from testbed.core.util import provenance
    from testbed.results.summary import _headline

    got = provenance(["/work/x/.venv/bin/testbed", "run", "my exp.yaml", "--duration", "5s"])
    assert got["command"] == "testbed run 'my exp.yaml' --duration 5s"
    assert got["git_commit"] is None or _re.fullmatch(r"[0-9a-f]{40}", got["git_commit"])
    s = {"queries": 1, "duration_s": 1.0, "provenance": {"command": got["command"], "git_commit": "ab" * 20,
                                                          "git_dirty": True}}
    assert (f"Reproduce: testbed run 'my exp.yaml' --duration 5s (git {'ab' * 6} with local changes)."
            in _headline(s))


def test_records_parquet_has_one_schema_whatever_values_a_run_had(tmp_path):
    """Pandas guessed each run's Parquet types (failure_cause double in a
    run without failures, label int64 in one and double in another), so an emulated and a simulated
    file did not concatenate. The record columns now have their one type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _records(a)
    _records(b)
    f = b / "sources" / "a.records.csv"
    df = pd.read_csv(f)
    df = df[df["outcome"] == "success"]  # no failure: failure_cause, drop_reason, error all empty
    df["label"] = float("nan")
    df.to_csv(f, index=False)
    merge_records(a)
    merge_records(b)
    ta, tb = pq.read_table(a / "records.parquet"), pq.read_table(b / "records.parquet")
    assert ta.schema.equals(tb.schema), (ta.schema, tb.schema)
    assert ta.schema.field("failure_cause").type == pa.string() and ta.schema.field("label").type == pa.int64()
    assert pa.concat_tables([ta, tb]).num_rows == ta.num_rows + tb.num_rows


def test_simulate_says_a_capture_section_is_not_simulated(tmp_path, capsys):
    """`testbed simulate` of experiments/capture.yaml ignored its
    capture: section in silence, and the report then gave a wrong reason for the missing hops."""
    from testbed.cli.main import main

    exp = REPO / "experiments" / "capture.yaml"
    assert main(["simulate", str(exp), "--duration", "2s", "--runs-dir", str(tmp_path)]) == 0
    assert "note: the experiment's capture: section applies to an emulation only" in capsys.readouterr().out
