"""Network dynamics: plan-time rules of events, and every link change applied for real
and read back by measurement on a triangle (real Mininet, OVS userspace, ryu-manager).

The emulation tests share one triangle (A-B 2 ms, B-C 3 ms, A-C 10 ms; hosts at 2 Gbit/s) whose
scenario changes A-B and B-C, so both links have probe hosts. Each test fires its own changes
through :class:`testbed.emu.event_runner.EventRunner` and leaves the links as planned.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from testbed.emu.linkctl import Readback
from testbed.emu.mininet_network import (
    check_interface_names,
    htb_commands,
    probe_hosts,
    switch_port_names,
    tc_change_commands,
)
from testbed.model.timeline import (
    CLUSTER_KINDS,
    EVENT_KINDS,
    LINK_KINDS,
    VALUE_FIELD,
    Change,
    LinkControl,
    LinkKind,
    kind_of,
)
from testbed.plan.build import PlanError, build_plan
from testbed.sim import Simulator
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
EVENTS = [{"at": "1s", "kind": "link_delay", "link": ["A", "B"], "delay": "10ms"},
          {"at": "2s", "kind": "link_down", "link": ["B", "C"]},
          {"at": "3s", "kind": "link_up", "link": ["B", "C"]}]


def _exp(events=EVENTS, **changes) -> Experiment:
    data = copy.deepcopy(yaml.safe_load(TRIANGLE.read_text()))
    data["events"] = events
    data.update(changes)
    return Experiment.model_validate(data)


def _plan(events=EVENTS, **changes):
    return build_plan(_exp(events, **changes), base_dir=TRIANGLE.parent)


# ---------------------------------------------------------------------------------- plan time

@pytest.mark.parametrize("event, message", [
    ({"at": "1s", "kind": "link_delay", "link": ["A", "B"], "ramp": {"to": -5, "over": "2s"}}, "negative"),
    ({"at": "1s", "kind": "link_loss", "link": ["A", "B"], "ramp": {"to": 120, "over": "2s"}}, "outside 0..100"),
    ({"at": "1s", "kind": "link_bandwidth", "link": ["A", "B"], "ramp": {"from": 10, "to": 0, "over": "1s"}},
     "must be > 0"),
    ({"at": "1s", "kind": "link_up", "link": ["A", "B"]}, "is not down then"),
    ({"at": "1s", "kind": "link_delay", "link": ["A", "Z"], "delay": "1ms"}, "Z"),
])
def test_plan_rejects_events_that_cannot_be_applied(event, message):
    with pytest.raises(PlanError, match=message):
        _plan([event])


def test_plan_rejects_a_link_set_down_twice():
    evs = [{"at": "1s", "kind": "link_down", "link": ["A", "B"]}, {"at": "2s", "kind": "link_down", "link": ["B", "A"]}]
    with pytest.raises(PlanError, match=r"events.1 \(link_down\) at 2 s: link s2-s1 is already down \(events.0"):
        _plan(evs)


def test_background_zero_ends_congestion_and_bandwidth_zero_is_refused():
    plan = _plan([{"at": "1s", "kind": "link_congestion", "link": ["A", "B"], "background": "50Mbit/s"},
                  {"at": "2s", "kind": "link_congestion", "link": ["A", "B"], "background": "0Mbit/s"}])
    assert [c.value for c in plan.changes] == [50.0, 0.0]
    with pytest.raises(Exception, match="must be > 0"):
        _plan([{"at": "1s", "kind": "link_bandwidth", "link": ["A", "B"], "bandwidth": "0Mbit/s"}])


class _DoubleDelay(LinkKind):
    """A throwaway kind, registered by the test only: doubles the link's one-way delay."""

    name = "link_delay_double"
    effect = "the link's delay, doubled"

    def apply(self, ch: Change, target: LinkControl) -> None:
        target.set_delay(2 * target.delay_ms)


def _simulate(events) -> tuple[list[dict], float]:
    """Records of the triangle simulated with ``events``, and A-B's delay at the end (ms)."""
    sim = Simulator(_plan(events), record=True)
    sim.run_until(sim.exp.duration_s)
    return sim.records(), sim.net.link("s1", "s2").delay_ms


def test_an_event_kind_is_one_registry_entry_and_the_simulator_applies_it():
    """A kind registered in one place (the test) is validated, expanded, and applied by the
    simulator exactly as the equivalent built-in step (A-B 2 ms -> 4 ms); unregistered, it is refused."""
    doubled = [{"at": "2s", "kind": "link_delay_double", "link": ["A", "B"]}]
    with EVENT_KINDS.temporarily(_DoubleDelay.name, _DoubleDelay()):
        assert "link_delay_double" in LINK_KINDS and "link_delay_double" not in VALUE_FIELD
        with pytest.raises(Exception, match="event 'link_delay_double' takes no value"):
            _exp([{**doubled[0], "delay": "3ms"}])
        got, delay = _simulate(doubled)
    want, want_delay = _simulate([{"at": "2s", "kind": "link_delay", "link": ["A", "B"], "delay": "4ms"}])
    assert delay == want_delay == 4.0
    assert len(got) > 20 and got == want
    assert "link_delay_double" not in EVENT_KINDS
    with pytest.raises(Exception, match=r"unknown event kind 'link_delay_double'; known: link_delay, link_bandwidth"):
        _exp(doubled)


def test_every_builtin_kind_is_registered_with_its_form():
    assert list(EVENT_KINDS) == ["link_delay", "link_bandwidth", "link_loss", "link_down", "link_up",
                                 "link_congestion", "cluster_down", "cluster_up"]
    assert dict(VALUE_FIELD) == {"link_delay": "delay_ms", "link_bandwidth": "bandwidth_mbps",
                                 "link_loss": "loss_pct", "link_congestion": "background_mbps"}
    assert set(CLUSTER_KINDS) == {"cluster_down", "cluster_up"}
    assert {"link_up", "cluster_up"} & LINK_KINDS == {"link_up"}  # as the emulation's bring-up asks
    assert len(LINK_KINDS | CLUSTER_KINDS) == 8
    assert [kind_of(k).shown_unit for k in LINK_KINDS] == ["ms", "Mbit/s", "%", "ms", "ms", "Mbit/s"]


def test_a_change_that_fires_late_or_not_at_all_stops_the_run(tmp_path):
    """A packet train at 1 kbit/s held the event runner for 576 s and
    the later changes never fired, in a run that ended 'ok'. Now a change 1 s late stops it."""


    from testbed.core.errors import RunFailure
    from testbed.emu.event_runner import EventRunner

    changes = [Change(t_s=1.0, kind="link_bandwidth", event=0, link=("s1", "s3"), value=0.001),
               Change(t_s=3.0, kind="cluster_down", event=1, cluster="edgeb"),
               Change(t_s=20.0, kind="cluster_up", event=2, cluster="edgeb")]
    r = EventRunner(SimpleNamespace(run_dir=tmp_path, plan=SimpleNamespace(time_dilation=1.0)), None, changes,
                    t0_s=100.0)
    r.rows.append(r._row(changes[0], 101.01, None, None, "Mbit/s", None, None, "measuring"))
    r.busy = "measuring the changes of 1 s"
    r.check_on_time(103.9, duration_s=12.0)  # events.1 is 0.9 s past its time: not yet late
    with pytest.raises(RunFailure, match=r"events.1 \(cluster_down edgeb\) planned at 3 s has not fired 1.5 s after "
                                         r"its time \(more than 1 s\); the event runner was busy with measuring the "
                                         r"changes of 1 s: the run would measure another scenario") as exc:
        r.check_on_time(104.5, duration_s=12.0)
    assert exc.value.exit_code == 4
    r.rows.append(r._row(changes[1], 104.2, None, None, "", None, None, "server killed"))
    with pytest.raises(RunFailure, match=r"events.1 \(cluster_down edgeb\) planned at 3 s fired 1.2 s after"):
        r.check_on_time(104.5, duration_s=12.0)
    r.rows[-1] = r._row(changes[1], 103.02, None, None, "", None, None, "server killed")
    r.check_on_time(130.0, duration_s=12.0)  # events.2 (20 s) is after the 12 s load: it never counts


def test_an_event_is_late_by_the_emulated_clock_under_dilation(tmp_path):
    """Under dilation k the plan's change times are on the wall clock (k x the scenario's): a change
    is late after 1 emulated second, k wall seconds, not after 1 wall second."""


    from testbed.core.errors import RunFailure
    from testbed.emu.event_runner import EventRunner

    k = 4.0
    changes = [Change(t_s=3.0 * k, kind="cluster_down", event=0, cluster="edgeb")]  # 3 s emulated
    r = EventRunner(SimpleNamespace(run_dir=tmp_path, plan=SimpleNamespace(time_dilation=k)), None, changes,
                    t0_s=100.0)
    r.check_on_time(100.0 + 12.0 + 3.9, duration_s=40.0)  # 3.9 wall s = 0.975 emulated s: on time
    with pytest.raises(RunFailure, match=r"events.0 \(cluster_down edgeb\) planned at 3 s has not fired 1.1 s after "
                                         r"its time \(4.4 s on the wall clock at k = 4\) \(more than 1 s\)"):
        r.check_on_time(100.0 + 12.0 + 4.4, duration_s=40.0)
    r.rows.append(r._row(changes[0], 100.0 + 12.0 + 3.5, None, None, "", None, None, "server killed"))
    r.check_on_time(200.0, duration_s=40.0)  # fired 3.5 wall s = 0.875 emulated s after its time


def test_a_packet_train_never_outlasts_its_bound():
    """Below ~0.1 Mbit/s no train of 8 full frames fits in 1 s: the rate is applied, not measured
    (returned before any probe is asked: no emulation needed). At time dilation k the bound is k s
    on the wall clock, where the links run at 1 / k of their rate: the same links are measured."""
    undilated = SimpleNamespace(dyn=SimpleNamespace(plan=SimpleNamespace(time_dilation=1.0)))
    got = Readback._one_train(undilated, None, None, 0.001)
    assert got == {"not_measured": "a packet train of 8 frames of 1500 bytes would take 96.0 s at 0.001 Mbit/s on "
                                   "the wall clock, more than the 1 s a train may hold up the next events: the rate "
                                   "is applied (the shaper confirmed it), not measured"}
    dilated = SimpleNamespace(dyn=SimpleNamespace(plan=SimpleNamespace(time_dilation=10.0)))
    assert "more than the 10 s" in Readback._one_train(dilated, None, None, 0.0001)["not_measured"]


def test_probe_hosts_ports_and_names():
    plan = _plan()
    probes = probe_hosts(plan)
    assert [p.name for p in probes] == ["P1a", "P1b", "P2a", "P2b"]  # links A-B (1) and B-C (2)
    assert len({p.ip for p in probes}) == len({p.mac for p in probes}) == 4
    assert {p.switch for p in probes if p.link == 1} == {"s1", "s2"}
    ports = switch_port_names(plan)
    # 3 links x 2 ends + 4 hosts + 4 probe hosts, each a switch port
    assert len(ports) == len(set(ports)) == 14
    check_interface_names(plan)


def test_netem_changes_are_tc_change_commands():
    state = {"delay_ms": 2.0, "rate_mbps": 100.0, "loss_pct": 0.0}
    cmds = tc_change_commands("s1-eth1", state, {"delay_ms": 30.0})
    assert cmds == [["tc", "qdisc", "change", "dev", "s1-eth1", "parent", "5:1", "handle", "10:", "netem",
                     "delay", "30.000000ms", "loss", "0.000000%", "limit", "1000"]]
    cmds = tc_change_commands("s1-eth1", state, {"rate_mbps": 2500.0})
    assert cmds[0][:9] == ["tc", "class", "change", "dev", "s1-eth1", "parent", "5:", "classid", "5:1"]
    assert "2500.000000mbit" in cmds[0]


# ---------------------------------------------------------------------------------- emulation

root = pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The triangle with probe hosts on A-B and B-C, hosts at 2 Gbit/s, up for the module."""
    from testbed.emu.bringup import emulated_network, new_run_dir

    plan = _plan(topology={"source": "../topologies/triangle.yaml", "host_bandwidth": "2Gbit/s"})
    run_id, run_dir = new_run_dir(plan, tmp_path_factory.mktemp("dyn"))
    with emulated_network(plan, run_id, run_dir) as lv:
        yield lv


def _fire(live, steps: list[tuple[float, str, tuple[str, str], float | None]]) -> list[dict]:
    """Fire ``(t_s, kind, link, value)`` changes now (+0.3 s) and return their events.csv rows."""
    from testbed.emu.event_runner import EventRunner

    changes = [Change(t_s=t, kind=k, event=i, link=link, value=v) for i, (t, k, link, v) in enumerate(steps)]
    runner = EventRunner(live, None, changes, time.time() + 0.3)
    runner.start()
    runner.join(timeout=steps[-1][0] + 10)
    assert runner.error is None, runner.error
    return runner.rows


@pytest.mark.emulation
@root
def test_delay_steps_are_measured_within_tolerance(live):
    """10 -> 30 -> 0 ms (then back to the planned 2 ms), each read back by the link's probes."""
    ab = ("s1", "s2")
    steps = [(0.0, "link_delay", ab, 10.0), (1.0, "link_delay", ab, 30.0), (2.0, "link_delay", ab, 0.0),
             (3.0, "link_delay", ab, 2.0)]
    rows = _fire(live, steps)
    if any(r["ok"] != 1 for r in rows):
        # A readback judged on one window can miss on a shared machine (1 in ~3 full-suite runs
        # here, never alone): the run records it as ok 0, the test fires the steps once more and
        # the second time must pass. The first rows are kept in the test's warnings.
        warnings.warn(f"delay steps, first attempt: {json.dumps(rows)}", stacklevel=1)
        rows = _fire(live, steps)
    for row, asked in zip(rows, (10, 30, 0, 2), strict=True):
        assert row["kind"] == "link_delay" and float(row["value_asked"]) == asked
        assert row["ok"] == 1, json.dumps(row)
        assert abs(float(row["value_measured"]) - asked) <= float(row["tolerance"]), row
        assert row["effect_ms"] != ""
    # the controller routes by the new delay: at 30 ms, A -> B goes A-C-B (13 ms)
    down = next(e for e in _events(live) if e["kind"] == "link_change" and e["delay_ms"] == 30.0)
    assert any(e["kind"] == "reroute" and e["seq"] > down["seq"] for e in _events(live))


def _events(live) -> list[dict]:
    from testbed.sdn.client import get_events

    return get_events(live.rest_url)


@pytest.mark.emulation
@root
def test_bandwidth_change_is_measured_by_a_bulk_transfer(live):
    if shutil.which("iperf3") is None:
        pytest.skip("needs iperf3 (install.sh installs it)")
    rows = _fire(live, [(0.0, "link_bandwidth", ("s1", "s2"), 20.0)])
    assert rows[0]["ok"] == 1 and abs(float(rows[0]["value_measured"]) - 20) <= 2, rows[0]
    try:
        a, b = live.emu.node("P1a"), live.emu.node("P1b")  # pinned over A-B
        srv = b.popen(["iperf3", "-s", "-1", "-p", "5399"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        out = a.cmd(f"iperf3 -c {live.emu.probes[1].ip} -p 5399 -t 2 -J")
        srv.wait(timeout=10)
        mbps = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
        # TCP goodput through a 20 Mbit/s FIFO shaper: 20 x 1448/1514 = 19.1 Mbit/s at most
        assert 15.0 <= mbps <= 19.5, mbps
    finally:
        _fire(live, [(0.0, "link_bandwidth", ("s1", "s2"), 100.0)])


@pytest.mark.emulation
@root
def test_link_down_reroutes_and_the_time_is_recorded(live):
    srca, edgec = live.plan.host("srca"), live.plan.host("edgec")
    assert live.path_of(srca.mac, edgec.mac)[0] == [1, 2, 3]
    rows = _fire(live, [(0.0, "link_down", ("s2", "s3"), None)])
    row = rows[0]
    assert row["ok"] == 1, row
    assert float(row["value_measured"]) > 0 and "srca>edgec" in row["note"], row
    assert live.path_of(srca.mac, edgec.mac)[0] == [1, 3]  # rerouted over A-C
    assert "0% packet loss" in live.emu.node("srca").cmd(f"ping -c 3 -i 0.05 -W 1 {edgec.ip}")
    evs = _events(live)
    assert any(e["kind"] == "port_status" and e["link_down"] for e in evs)
    assert any(e["kind"] == "reroute_done" and "down" in e["reason"] for e in evs)
    rows = _fire(live, [(0.0, "link_up", ("s2", "s3"), None)])
    assert rows[0]["ok"] == 1, rows[0]
    assert live.path_of(srca.mac, edgec.mac)[0] == [1, 2, 3]


@pytest.mark.emulation
@root
def test_links_above_1gbits_are_shaped_not_clamped(live, tmp_path):
    from testbed.emu.mininet_network import read_htb_rate_mbps

    table = live.emu.applied_table()
    for h in table["hosts"]:  # both ends of every host link at 2000 Mbit/s (Mininet would drop bw > 1000)
        assert h["applied_mbps_host_to_switch"] == h["applied_mbps_switch_to_host"] == 2000.0, h
    host_if, sw_if = live.emu.host_intfs["srca"]
    home = live.emu.port_node(sw_if)  # None: the root namespace (no OVS shards)
    assert read_htb_rate_mbps(sw_if, live.emu.node(home) if home else None) == 2000.0
    # The link emulator shapes any rate: set A-B to 2.5 Gbit/s and read it back.
    got = live.emu.set_link(1, rate_mbps=2500.0)["params"]["rate_mbps"]
    live.emu.set_link(1, rate_mbps=100.0)
    assert got == 2500.0


@pytest.mark.emulation
@root
def test_htb_above_1gbits_measured_on_a_veth_pair(tmp_path):
    """The shaper used for host links above Mininet's limit, measured where this machine can carry
    more than its rate (a bare veth pair, 2.8 Gbit/s unshaped here): a bulk transfer stays at or
    below 1.5 Gbit/s and HTB reports throttling (overlimits)."""
    if os.geteuid() != 0 or shutil.which("iperf3") is None:
        pytest.skip("needs root and iperf3")
    ns = ("tbdyn-a", "tbdyn-b")

    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, check=True).stdout

    try:
        for n in ns:
            sh(f"ip netns add {n}")
        sh(f"ip link add va0 netns {ns[0]} type veth peer name vb0 netns {ns[1]}")
        for n, d, ip in ((ns[0], "va0", "10.96.1.1"), (ns[1], "vb0", "10.96.1.2")):
            sh(f"ip netns exec {n} ethtool -K {d} rx off tx off sg off tso off gso off gro off")
            sh(f"ip -n {n} addr add {ip}/24 dev {d} && ip -n {n} link set {d} up")
        for cmd in htb_commands("va0", 1500.0):
            sh(f"ip netns exec {ns[0]} " + " ".join(cmd))
        srv = subprocess.Popen(["ip", "netns", "exec", ns[1], "iperf3", "-s", "-1", "-p", "5398"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        out = json.loads(sh(f"ip netns exec {ns[0]} iperf3 -c 10.96.1.2 -p 5398 -t 2 -J"))
        srv.wait(timeout=10)
        mbps = out["end"]["sum_received"]["bits_per_second"] / 1e6
        stats = sh(f"ip netns exec {ns[0]} tc -s class show dev va0")
        assert 800 <= mbps <= 1500 * 1.02, mbps
        assert int(stats.split("overlimits ")[1].split()[0]) > 0, stats
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@pytest.mark.emulation
@root
def test_a_bandwidth_too_low_to_measure_is_applied_and_the_next_change_fires_on_time(live):
    """50 kbit/s on A-B: the shaper takes it, the row says it was not measured, and the delay change
    1 s later fires on time (at 1 kbit/s it waited 576 s behind the packet train before). Last in
    the module: the frames queued at 50 kbit/s keep their times after the rate is raised (the link
    model, testbed.model.network), so the link drains for a moment after the test."""
    ab = ("s1", "s2")
    try:
        rows = _fire(live, [(0.0, "link_bandwidth", ab, 0.05), (1.0, "link_delay", ab, 5.0)])
        assert rows[0]["value_measured"] == "" and rows[0]["ok"] == 0, rows[0]
        assert "would take 1.9 s at 0.05 Mbit/s" in rows[0]["note"] and "not measured" in rows[0]["note"], rows[0]
        assert live.emu.applied[live.dynamics.link_index(Change(t_s=0, kind="link_bandwidth", event=0, link=ab))][
            "rate_mbps"] == 0.05
        assert rows[1]["kind"] == "link_delay" and abs(float(rows[1]["lag_ms"])) < 500, rows[1]
    finally:
        _fire(live, [(0.0, "link_bandwidth", ab, 100.0), (0.5, "link_delay", ab, 2.0)])
        time.sleep(3.0)  # the frames queued at 50 kbit/s leave on their times
