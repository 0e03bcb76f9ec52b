"""The pre-flight estimate: a run that needs more memory than the machine has is refused before
anything is built (exit code 3), saying what it needs and what there is; a fake memory limit
(``$TESTBED_MEM_AVAILABLE_MIB``, or ``Machine`` given to the check) stands for a small machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.core.errors import EXIT_BRINGUP, RunFailure
from testbed.emu.capacity import (
    COSTS,
    MEM_ENV,
    MEMORY_SHARE,
    Machine,
    check_capacity,
    count_items,
    estimate,
    machine,
    refuse_unfit,
)
from testbed.emu.netplan import probe_hosts
from testbed.plan.build import plan_experiment

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "experiments" / "default.yaml"


def test_estimate_counts_the_parts_the_bring_up_builds():
    """default.yaml: 11 switches + the cloud, 15 links in one link emulator, no OVS shards (<= 16
    switches), 4 clusters of 1 LiteRT worker, 4 sources; memory is the items times their costs."""
    plan = plan_experiment(DEFAULT)
    items = count_items(plan)
    assert (items["switch"], items["link"], items["link emulator"], items["ovs shard"]) == (12, 15, 1, 0)
    assert (items["server litert"], items["server tensorflow"], items["source"]) == (4, 0, 4)
    probes = len(probe_hosts(plan))
    assert items["mininet node"] == len(plan.hosts) + probes + 1  # + the link emulator's namespace
    assert items["interface"] == 15 * 4 + 2 * (len(plan.hosts) + probes)  # veth ends
    needs = estimate(plan)
    assert needs.memory_mib == pytest.approx(sum(n * COSTS[i].mib for i, n in items.items()))
    assert needs.processes == sum(n * COSTS[i].processes for i, n in items.items())


def test_a_run_needing_more_memory_than_the_machine_has_is_refused_with_the_figures():
    plan = plan_experiment(DEFAULT)
    need = estimate(plan).memory_mib
    small = Machine(mem_available_mib=need / 2, nofile=65536, pids_left=30000, cpus=2, fake=True)
    cap = check_capacity(plan, have=small)
    assert not cap.fits and len(cap.problems) == 1
    assert cap.problems[0].startswith(f"memory: it needs about {need:,.0f} MiB, over 90% of the {need / 2:,.0f} MiB "
                                      f"available (${MEM_ENV})")
    assert check_capacity(plan, have=Machine(need / MEMORY_SHARE + 1, 65536, 30000, 2)).fits
    few_fds = check_capacity(plan, have=Machine(10 * need, 32, 30000, 2))
    assert [p.split(":")[0] for p in few_fds.problems] == ["file descriptors"]


def test_the_cpu_guess_counts_the_cores_other_jobs_take_now():
    plan = plan_experiment(DEFAULT)
    have = Machine(mem_available_mib=1e6, nofile=65536, pids_left=30000, cpus=2)
    idle, busy = check_capacity(plan, have=have), check_capacity(plan, have=have, others=1.5)
    assert "other jobs" not in idle.k_why and "other jobs take 1.50 cores now" in busy.k_why
    # two CPUs, 1.5 cores taken: at least the share CFS gives beside them, 2 / 2.5 = 0.8 core, less the idle network
    idle_net = estimate(plan).idle_cores
    assert f"on {0.8 - idle_net:.2f} available cores" in busy.k_why and f"on {2 - idle_net:.2f}" in idle.k_why
    assert busy.k >= idle.k


def test_the_fake_memory_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(MEM_ENV, "512")
    assert machine().mem_available_mib == 512 and machine().fake
    plan = plan_experiment(DEFAULT)
    with pytest.raises(RunFailure, match=r"does not fit this machine: memory: .* 512 MiB available") as err:
        refuse_unfit(plan, None)
    assert err.value.exit_code == EXIT_BRINGUP
    monkeypatch.setenv(MEM_ENV, "lots")
    with pytest.raises(RunFailure, match="not a number of MiB"):
        machine()


@pytest.mark.skipif(os.geteuid() != 0, reason="testbed run checks root first")
def test_testbed_run_refuses_before_building_anything(tmp_path):
    """``testbed run`` with a fake 300 MiB machine: exit 3 after the pre-flight line, no run
    directory, no network (nothing of the run's was created)."""
    runs = tmp_path / "runs"
    env = dict(os.environ, **{MEM_ENV: "300"})
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(DEFAULT), "--duration", "5s",
                        "--runs-dir", str(runs)], capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_BRINGUP, out
    assert "pre-flight: needs" in out and "this run does not fit this machine: memory" in out
    assert "nothing was built" in out and not runs.exists()


def test_the_continuous_probes_keep_their_rate_in_emulated_time():
    """Under time dilation k the continuous probes send BASE_HZ / k a wall second, per link and per
    path, as every other rate of the emulated system; a path budget that binds at the wall clock's
    rate binds the same way at any k, until BASE_HZ / k is below it."""
    from testbed.emu.netplan import BASE_HZ, PATH_PROBE_BUDGET, continuous_probe_hz, path_probe_cores, path_probe_hz
    from testbed.plan.dilation import with_time_dilation

    small = plan_experiment(REPO / "experiments" / "scenario-linkfail.yaml")
    assert continuous_probe_hz(small) == (BASE_HZ, BASE_HZ)
    assert continuous_probe_hz(with_time_dilation(small, 9)) == pytest.approx((BASE_HZ / 9, BASE_HZ / 9))
    big = plan_experiment(REPO / "experiments" / "continent-americas.yaml")
    budget_hz = path_probe_hz(big, BASE_HZ, PATH_PROBE_BUDGET)
    assert budget_hz < BASE_HZ / 9
    assert continuous_probe_hz(with_time_dilation(big, 9)) == pytest.approx((BASE_HZ / 9, budget_hz))
    assert continuous_probe_hz(with_time_dilation(big, 50)) == pytest.approx((BASE_HZ / 50, BASE_HZ / 50))
    assert BASE_HZ / 50 < budget_hz
    assert path_probe_cores(with_time_dilation(small, 4)) == pytest.approx(path_probe_cores(small) / 4)


def test_the_path_probes_keep_to_their_budget_and_the_pre_flight_counts_them():
    """continent-americas probes 48 paths of 925 switch links in all: at 20 Hz that would be 37,000
    packet-hops/s, so the rate is lowered to the budget (continuously and while boosted); a small
    network with a link failure keeps the full rate; the probes' CPU is part of the idle estimate.
    On isp-att the paths cross a 449-port hub, alone in its OVS shard, whose every port is polled
    per packet: that costs beyond the packet-hops, and the rate is lowered though the hops alone
    would keep it."""
    from testbed.emu.netplan import (
        BASE_HZ,
        PATH_BOOST_BUDGET,
        PATH_PROBE_BUDGET,
        PROBE_US_PER_PACKET_HOP,
        SHARD_MAX_PORTS,
        ovs_ports,
        ovs_shards,
        path_probe_cores,
        path_probe_hz,
        path_probe_us,
    )

    big = plan_experiment(REPO / "experiments" / "continent-americas.yaml")
    hops = sum(len(p.switches) - 1 for p in big.paths)
    assert hops == 925 and max(ovs_ports(big, "user").values()) <= SHARD_MAX_PORTS
    assert path_probe_us(big) == pytest.approx(hops * PROBE_US_PER_PACKET_HOP)
    hz = path_probe_hz(big, BASE_HZ, PATH_PROBE_BUDGET)
    assert hz == pytest.approx(PATH_PROBE_BUDGET * 1e6 / (2 * hops * PROBE_US_PER_PACKET_HOP)) and hz < BASE_HZ
    one = {big.sources[0].name}
    boost = path_probe_hz(big, 100.0, PATH_BOOST_BUDGET, one)
    assert boost == pytest.approx(PATH_BOOST_BUDGET * 1e6 / (2 * path_probe_us(big, one)))
    assert path_probe_cores(big) == pytest.approx(PATH_PROBE_BUDGET)
    att = plan_experiment(REPO / "experiments" / "isp-att.yaml")
    att_hops = sum(len(p.switches) - 1 for p in att.paths)
    assert 2 * BASE_HZ * att_hops * PROBE_US_PER_PACKET_HOP / 1e6 < PATH_PROBE_BUDGET  # the hops alone: full rate
    ports = ovs_ports(att, "user")  # per switch, its shard's ports
    hub = max(ports, key=ports.get)
    assert [hub] in ovs_shards(att, "user") and ports[hub] > 400
    assert all(len(g) == 1 or ports[g[0]] <= SHARD_MAX_PORTS for g in ovs_shards(att, "user"))
    assert path_probe_hz(att, BASE_HZ, PATH_PROBE_BUDGET) < BASE_HZ / 2
    assert path_probe_us(att, datapath="kernel") == pytest.approx(att_hops * PROBE_US_PER_PACKET_HOP)
    small = plan_experiment(REPO / "experiments" / "scenario-linkfail.yaml")
    assert path_probe_hz(small, BASE_HZ, PATH_PROBE_BUDGET) == BASE_HZ
    assert path_probe_cores(small) == pytest.approx(2 * BASE_HZ * path_probe_us(small) / 1e6)
    assert path_probe_cores(plan_experiment(DEFAULT)) == 0.0  # no event moves a path: no path probes
    assert estimate(big).idle_cores > estimate(big.model_copy(update={"changes": []})).idle_cores
