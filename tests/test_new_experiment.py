"""``testbed new-experiment`` (a scenario of one's own) and the messages of the hand edits people
make to an experiment file: each names the file and the field, and says what to write instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.cli.new_experiment import host_name
from testbed.core.errors import InputError
from testbed.core.util import REPO_ROOT
from testbed.plan.build import plan_experiment
from testbed.spec.experiment import load_experiment
from testbed.spec.topology import load_topohub
from testbed.spec.units import parse_rate_mbps

TRIANGLE = REPO_ROOT / "topologies" / "triangle.yaml"
ABILENE = (REPO_ROOT / "experiments" / "digits-abilene.yaml").read_text()


def _new(tmp_path: Path, capsys, *args: str, name: str = "mine.yaml") -> tuple[int, str, Path]:
    out = tmp_path / name
    code = main(["new-experiment", *args, "--out", str(out)])
    return code, capsys.readouterr().out, out


def _simulated_queries(tmp_path: Path, experiment: Path) -> int:
    runs = tmp_path / "runs"
    assert main(["simulate", str(experiment), "--duration", "2", "--runs-dir", str(runs)]) == 0
    (summary,) = runs.glob("*/summary.json")
    return json.loads(summary.read_text())["queries"]


@pytest.mark.parametrize("args", [
    ["--topology", "topohub:topozoo/Abilene"],
    ["--topology", "topohub:sndlib/polska", "--clusters", "auto:2", "--cloud", "auto", "--sources", "auto:3",
     "--family", "digits,parity"],
    ["--topology", "topohub:gabriel/25/0", "--clusters", "auto:4", "--sources", "auto:6"],
], ids=["abilene", "polska-cloud", "gabriel"])
def test_topohub_experiment_plans_and_simulates(tmp_path, capsys, args):
    code, out, path = _new(tmp_path, capsys, *args)
    assert code == 0 and f"wrote {path}" in out
    text = path.read_text()
    assert text.startswith("# Written by: testbed new-experiment --topology " + args[1])
    assert "# times in us, ms or s; rates in bit/s" in text and "cpu_cores: the host's CPU share in cores" in text
    plan = plan_experiment(path)
    n_clusters = int(re.search(r"auto:(\d+)", " ".join(args[2:]) or "auto:3")[1]) if "--clusters" in args else 3
    assert len([h for h in plan.hosts if h.role == "cluster"]) == n_clusters + ("--cloud" in args)
    assert plan.experiment.topology.source == args[1]
    assert _simulated_queries(tmp_path, path) > 0


def test_continental_topology_places_clusters_within_every_sources_deadline(tmp_path, capsys):
    """backbone/americas (1,138 nodes): the most central nodes are 33-370 ms of RTT from the
    peripheral sources, past the 100 ms deadline; new-experiment places the clusters so that every
    source has a (cluster, model) within it at zero load (the plan's own check), and the file says
    so; its simulation succeeds."""
    from testbed.plan.checks import zero_load_feasibility

    code, out, path = _new(tmp_path, capsys, "--topology", "topohub:backbone/americas", "--clusters", "auto:6",
                           "--sources", "auto:8")
    assert code == 0 and "note:" not in out
    assert "# Placement: 6 clusters placed to bring the sources within the deadline at zero load" in path.read_text()
    plan = plan_experiment(path)
    (f,) = zero_load_feasibility(plan)
    assert f.ok and not f.late_sources and len(f.fastest) == 8
    assert max(p.e2e_ms for p in f.fastest.values()) <= 100
    assert not [n for n in plan.notes if "WARNING" in n]
    runs = tmp_path / "runs"
    assert main(["simulate", str(path), "--duration", "5", "--runs-dir", str(runs)]) == 0
    (summary,) = runs.glob("*/summary.json")
    assert json.loads(summary.read_text())["success_ratio"] > 0.9


def test_continental_topology_refuses_a_deadline_no_placement_meets_and_names_the_nearest(tmp_path, capsys):
    """A deadline below a model's service time plus the host links' transfers (imagenet: 3-4 ms of
    service at best, while digits fits within the 1 ms floor of a deadline): no placement can
    meet it; nothing is written, and the message names the fastest pair and the nearest deadline
    (whole ms), which then writes a file."""
    code, out, path = _new(tmp_path, capsys, "--topology", "topohub:backbone/americas", "--clusters", "auto:6",
                           "--sources", "auto:8", "--family", "imagenet", "--deadline", "2ms",
                           "--bandwidth", "10Gbit/s")
    assert code == 2 and not path.exists()
    m = re.search(r"application 'imagenet': no \(source, cluster, model\) meets its deadline of 2 ms even at zero "
                  r"load \(the fastest: .* (\d+\.\d) ms \(RTT .*\)\); the nearest deadline that would work: (\d+) ms",
                  out)
    assert m, out
    assert int(m[2]) - 1 < float(m[1]) <= int(m[2])  # the fastest pair's time, rounded up to a whole ms
    code, out, path = _new(tmp_path, capsys, "--topology", "topohub:backbone/americas", "--clusters", "auto:6",
                           "--sources", "auto:8", "--family", "imagenet", "--deadline", f"{m[2]}ms",
                           "--bandwidth", "10Gbit/s")
    assert code == 0 and path.exists()


def test_local_topology_by_node_names(tmp_path, capsys):
    code, _, path = _new(tmp_path, capsys, "--topology", str(TRIANGLE), "--clusters", "B:0.5,C:near_edge:1",
                         "--sources", "A,C", "--family", "digits", "--deadline", "80ms", "--rate", "3")
    assert code == 0
    exp = load_experiment(path)
    assert [(c.site, c.tier, c.cpu_cores) for c in exp.clusters] == [("B", "far_edge", 0.5), ("C", "near_edge", 1.0)]
    assert [s.site for s in exp.sources] == ["A", "C"]
    assert exp.applications[0].deadline_ms == 80 and exp.workload[0].rate_qps == 3
    # the topology is written relative to the file, so the file plans from wherever it is read
    assert not Path(exp.topology.source).is_absolute()
    assert (path.parent / exp.topology.source).resolve() == TRIANGLE.resolve()
    assert _simulated_queries(tmp_path, path) > 0


def test_auto_picks_central_clusters_and_peripheral_sources(tmp_path, capsys):
    code, _, path = _new(tmp_path, capsys, "--topology", "topohub:topozoo/Abilene", "--clusters", "auto:1",
                         "--sources", "auto:2")
    assert code == 0
    exp = load_experiment(path)
    # Abilene: Kansas City is the most central PoP by hops; Seattle and New York lie at its ends
    assert exp.clusters[0].site == "Kansas City" and exp.clusters[0].tier == "near_edge"
    assert {s.site for s in exp.sources} == {"Seattle", "New York"}


@pytest.mark.parametrize("option, value, close", [
    ("--clusters", "Sunyvale:near_edge", "did you mean 'Sunnyvale'"),
    ("--sources", "Seatle,Denver", "did you mean 'Seattle'"),
    ("--cloud", "Kansas", "did you mean 'Kansas City'"),
])
def test_unknown_node_is_refused_with_the_nearest_and_the_list(tmp_path, capsys, option, value, close):
    code, out, path = _new(tmp_path, capsys, "--topology", "topohub:topozoo/Abilene", option, value)
    assert code == 2 and not path.exists()
    assert close in out and "its nodes: 'New York', 'Chicago'" in out


def test_unknown_family_and_topohub_key_are_refused_with_the_nearest(tmp_path, capsys):
    code, out, _ = _new(tmp_path, capsys, "--topology", "topohub:topozoo/Abilene", "--family", "digit")
    assert code == 2 and "--family 'digit'" in out and "did you mean 'digits'" in out
    code, out, _ = _new(tmp_path, capsys, "--topology", "topohub:topozoo/abilene")
    assert code == 2 and "did you mean 'topozoo/Abilene'" in out


def test_existing_file_is_not_replaced_without_force(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("mine\n")
    code, out, _ = _new(tmp_path, capsys, "--topology", str(TRIANGLE), "--clusters", "B", "--sources", "A")
    assert code == 2 and "the file exists; pass --force" in out and path.read_text() == "mine\n"
    code, _, _ = _new(tmp_path, capsys, "--topology", str(TRIANGLE), "--clusters", "B", "--sources", "A", "--force")
    assert code == 0 and load_experiment(path).clusters[0].site == "B"


def test_options_that_would_not_plan_write_nothing(tmp_path, capsys):
    # 0.5 ms deadline: refused with the schema's bound, named as the option, before anything is written
    code, out, path = _new(tmp_path, capsys, "--topology", str(TRIANGLE), "--clusters", "B", "--sources", "A",
                           "--deadline", "0.5ms")
    assert code == 2 and not path.exists() and "--deadline 0.5ms: a deadline is from 1 ms" in out


def test_printed_without_out(capsys):
    assert main(["new-experiment", "--topology", str(TRIANGLE), "--clusters", "B", "--sources", "A"]) == 0
    assert "clusters:\n  - {name: feb, site: \"B\"" in capsys.readouterr().out


def test_topology_data_never_becomes_an_unchecked_name():
    used: set[str] = set()
    names = [host_name(t, used, p) for t, p in [("Kansas City", "ne"), ("s1", ""), ("l12", ""), ("'; rm -rf /", ""),
                                                 ("Kraków", ""), ("Kraków", ""), ("12345", "")]]
    assert all(re.fullmatch(r"[a-z][a-z0-9]{0,9}", n) for n in names) and len(set(names)) == len(names)
    assert names[:3] == ["nekansasci", "hs1", "hl12"]
    with pytest.raises(InputError, match="expected GROUP/NAME"):
        load_topohub("../../../etc/passwd")


# --------------------------------------------------------------------------- hand edits

def _edited(tmp_path: Path, old: str, new: str, base: str = ABILENE) -> str:
    assert old in base, old
    path = tmp_path / "edited.yaml"
    path.write_text(base.replace(old, new, 1))
    with pytest.raises(InputError) as err:
        plan_experiment(path)
    msg = str(err.value)
    assert str(path) in msg  # the file
    return msg


EVENTS = "events:\n  - {at: 5s, kind: link_down, link: [Chicago, Indianapolis]}\n"


@pytest.mark.parametrize("old, new, where, fix", [
    # units written into numbers, and units of another size
    ("duration: 40s", "duration: 10min", "duration:", "'10min' is 600s: write '600s'"),
    ("duration: 40s", "duration: 40", "duration:", "'duration: 40s' or 'duration_s: 40'"),
    ("duration: 40s", "duration_s: 10min", "duration_s:", "write 'duration_s: 600' or 'duration: 600s'"),
    ("duration: 40s", "duration: 0s", "  duration in s:", "greater than 0"),  # as written, not duration_s
    ("deadline: 60ms", "deadline_ms: 60ms", "applications.0.deadline_ms", "write 'deadline_ms: 60'"),
    ("deadline: 60ms", "deadline_ms: 0.1", "applications.0.deadline_ms",
     "if you meant 0.1 s, write 'deadline_ms: 100' or 'deadline: 100ms'"),
    ("deadline: 60ms", "deadline: 60 ms", "applications.0", "write '60ms'"),
    ("bandwidth: 100Mbit/s ", "bandwidth: 1 Gbit/s", "topology", "write '1Gbit/s'"),
    ("bandwidth: 100Mbit/s ", "bandwidth: 100MB/s", "topology", "bytes per second (capital B); in bits per second "
                                                                 "it is 800Mbit/s: write '800Mbit/s'"),
    ("bandwidth: 100Mbit/s ", "bandwidth: 100mbps", "topology", "write '100Mbit/s'"),
    ("bandwidth: 100Mbit/s ", "bandwidth_mbps: 100Mbps", "topology.bandwidth_mbps", "write 'bandwidth_mbps: 100'"),
    ("delay: 20ms", "delay: 20", "cloud", "'delay: 20ms' or 'delay_ms: 20'"),
    ("delay: 20ms", "delay: 20sec", "cloud", "write '20s'"),
    ("rate_qps: 3", "rate_qps: 3/s", "workload.0.rate_qps", "write 'rate_qps: 3'"),
    # unknown names
    ("site: Sunnyvale", "site: Sunyvale", "cluster 'fesv'", "did you mean 'Sunnyvale'"),
    ("site: Seattle", "site: Vancouver", "source 'sea'", "the topology's nodes: 'New York', 'Chicago'"),
    ("models: [digits_small]}", "models: [digits_smal]}", "cluster 'fesv'", "did you mean 'digits_small'"),
    ("{name: digits, deadline", "{name: digits, family: digit, deadline", "application 'digits'",
     "did you mean 'digits'"),
    ("policy: closest", "policy: closets", "policy:", "did you mean 'closest'"),
    ("{application: digits, sources", "{application: digit, sources", "workload[0]", "did you mean 'digits'"),
    ("topozoo/Abilene", "topozoo/Abilen", "topohub", "did you mean 'topozoo/Abilene'"),
    ("tier: far_edge", "tier: faredge", "clusters.0.tier", "got 'faredge' (did you mean 'far_edge'"),
    ("name: fesv", "name: FeSV", "clusters.0.name", "e.g. 'fesv'"),
    # misspelled fields, wrong nesting
    ("seed: 1", "sed: 1", "sed:", "unknown key (did you mean 'seed'"),
    ("queue_limit: 16, models: [digits_small]}", "queue_limt: 16, models: [digits_small]}",
     "clusters.0.queue_limt", "did you mean 'queue_limit'"),
    ("cpu_cores: 0.25, workers", "cpus: 0.25, workers", "clusters.0.cpus", "did you mean 'cpu_cores'"),
    ("topology:\n", "topology:\n  clusters: []\n", "topology.clusters",
     "'clusters' is a key of the top level, not of 'topology'; move it there"),
    ("seed: 1", "seed: 1\nhost_bandwidth: 1Gbit/s", "host_bandwidth", "is a key of 'topology', not of the top level"),
    ("deadline: 60ms", "deadline_s: 0.06", "applications.0.deadline_s",
     "this quantity's key is 'deadline_ms' (milliseconds): write 'deadline_ms: 60' or 'deadline: 0.06s'"),
    ("duration: 40s", "duration_ms: 40000", "duration_ms", "write 'duration_s: 40' or 'duration: 40000ms'"),
    ("topology:\n  source: topohub:topozoo/Abilene\n", "topology: topohub:topozoo/Abilene\nx:\n",
     "topology:", "write 'topology: {source: topohub:topozoo/Abilene}'"),
    ("models: [digits_small]}", "models: digits_small}", "clusters.0.models",
     "write a list, e.g. 'models: [digits_small]'"),
    ("{application: digits, sources: all", "{application: digits, sources: sea", "workload.0.sources:",
     "Input should be a valid list or 'all'; got 'sea': for a list write 'sources: [sea]'"),
    ("cpu_cores: 0.25", "cpu_cores: 0.25cores", "clusters.0.cpu_cores", "write 'cpu_cores: 0.25'"),
    ("cpu_cores: 0.25", "cpu_cores: 0.25, memory_mib: 2GiB", "memory_mib",
     "memory_mib is in MiB: write 'memory_mib: 2048'"),
])
def test_hand_edit_error_says_where_and_what_to_write(tmp_path, old, new, where, fix):
    msg = _edited(tmp_path, old, new)
    assert where in msg and fix in msg, msg


@pytest.mark.parametrize("event, fix", [
    ("{at: 5s, kind: link_dwn, link: [Chicago, Indianapolis]}", "did you mean 'link_down'"),
    ("{at: 5, kind: link_down, link: [Chicago, Indianapolis]}", "'at: 5s' or 'at_s: 5'"),
    ("{at: 5s, kind: link_down, link: [Chicago, Seattle]}",
     "'Chicago' links to 'New York', 'Indianapolis'; 'Seattle' links to 'Sunnyvale', 'Denver'"),
    ("{at: 5s, kind: cluster_down, cluster: fesx}", "did you mean 'fesv'"),
    ("{at: 5s, kind: link_delay, link: [Chicago, Indianapolis], delay: 30 ms}", "write '30ms'"),
])
def test_hand_edited_event_error_points_at_the_fix(tmp_path, event, fix):
    msg = _edited(tmp_path, "workload:", f"events:\n  - {event}\nworkload:")
    assert "events" in msg and fix in msg, msg


def test_hand_edited_topology_file_error_points_at_the_fix(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text(TRIANGLE.read_text().replace("delay: 2ms", "delay_ms: 2ms", 1))
    exp = (REPO_ROOT / "experiments" / "triangle.yaml").read_text().replace("../topologies/triangle.yaml", "t.yaml")
    path = tmp_path / "e.yaml"
    path.write_text(exp)
    with pytest.raises(InputError, match=r"links\.0\.delay_ms: .*write 'delay_ms: 2' or 'delay: 2ms'"):
        plan_experiment(path)


def test_loose_reading_only_feeds_the_message():
    with pytest.raises(InputError, match="write '1Gbit/s'"):
        parse_rate_mbps("1 Gbit/s", "x")
    assert parse_rate_mbps("1Gbit/s", "x") == 1000.0


@pytest.mark.parametrize("old, new, fix", [
    ("seed: 1", "seed: 1\n\tpolicy: closest", "line 6, column 1: .* YAML indents with spaces, never tabs"),
    ("site: Seattle}", "site: Seattle: WA}", "line 26, .*a ':' inside a value of a \\{...\\}: quote the value"),
    ("models: [digits_small]}", "models: [digits_small}", "line 20, .*an unclosed \\[...\\] or a ',' missing"),
    ("policy: closest", "clusters_x: [a, b\npolicy: closest",
     "line 8, .*an unclosed \\[...\\] \\(its '\\]' missing before the next key\\)"),
    ("policy: closest", "policy closest", "line 9, .*could not find expected ':'; .* add the ':'"),
    ("  - {name: sea, site: Seattle}", "  sea: {site: Seattle}",
     "line 27, .*a list item \\('- '\\) where a key was expected: indent a list's items under the key"),
])
def test_yaml_syntax_error_says_where_and_what_to_change(tmp_path, old, new, fix):
    msg = _edited(tmp_path, old, new)
    assert re.search("not valid YAML at " + fix, msg), msg

