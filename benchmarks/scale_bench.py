"""Scale benchmarks of the emulation (issue 15, part 1). Root; every emulation takes
``/tmp/testbed-emulation.lock`` itself (do not wrap in ``flock``).

``profile``: where a hop's time goes in Open vSwitch's userspace datapath. A chain of N bridges
(``fail-mode standalone``, no controller, no link emulator), two hosts 10 bridges apart; ping RTT
per switch on that fixed path as N grows, with every bridge in one ``ovs-vswitchd`` or split over
K private ones (``NxK``; each vswitchd in its own namespace, as the testbed's OVS shards)::

    sudo .venv/bin/python benchmarks/scale_bench.py profile 10x1 40x1 100x1 100x20

``bringup``: per topology, plain Mininet (the same switches and links, userspace datapath, no
delays, no controller: ``build()`` + ``start()``) against the testbed's network bring-up (Mininet,
link emulators, OVS shards, ryu-manager, until every switch, link and flow is there; with the
time since its start at which each of its steps ended, ``testbed_phases_s``), their ratio,
the peak memory of the run's processes (RSS summed every 0.5 s: Mininet's shells, link emulators,
OVS shards, ryu-manager, plus the growth of the system's ovs-vswitchd), and the RTT self-check
(20 pings per source -> cluster pair; error median/max, pass) on 2 sources x 2 clusters chosen
far apart, after the datapath compensation a run applies (``calibrate_datapath``: the RTT per
switch it measured, ``rtt_per_switch_before_ms``, and the offset per link, ``link_offset_ms``)::

    sudo .venv/bin/python benchmarks/scale_bench.py bringup topohub:topozoo/Abilene \\
        topohub:topozoo/Geant2012 topohub:gabriel/100/0 topohub:topozoo/TataNld [--runs 2] [--json F]

``load``: the offered query rate at which the testbed's own processes become the bottleneck on an
experiment (default ``experiments/scenario-failure.yaml`` without its events): for each total rate,
a short run; the testbed is the bottleneck (``network_bottleneck``) where the median network time
exceeds the planned RTT by more than ``--margin-ms`` (the queries' own transfer and the forwarding
cost included); ``bottleneck`` also flags a success ratio below 0.9, which a saturated cluster
gives before the testbed is (``--policy round_robin`` spreads the load over every cluster: every
source's policy). Both are null for a rate whose run failed or answered nothing (``message`` says why).
Each rate also reports the machine's CPU over the load, per process role (``cpu_cores_by_role``: link
emulators, inference servers, sources, controller, ovs-vswitchd, ..., ``other``; mean cores) and in all
(``cpu_busy_cores``), from the run's ``summary.json`` ``machine_cpu`` (:mod:`testbed.emu.machine`)::

    sudo .venv/bin/python benchmarks/scale_bench.py load --rates 100 200 500 800 [--seconds 10] \\
        [--runtime litert]   # every cluster's models on LiteRT: the servers' own CPU out of the way

``costs``: what a run's parts cost (the pre-flight's :data:`testbed.emu.capacity.COSTS`): per
topology, the testbed's network brought up and left idle, per role of its processes their
number, threads, memory (PSS) and descriptors, the kernel's own memory grown, and the idle
network's CPU; with ``--run EXPERIMENT`` a short run of it (servers and sources), the largest
sample of each role::

    sudo .venv/bin/python benchmarks/scale_bench.py costs topohub:gabriel/50/0 topohub:gabriel/100/0
    sudo .venv/bin/python benchmarks/scale_bench.py costs --run experiments/default.yaml --seconds 15

``big``: one whole emulation per experiment file or topohub topology (which gets ``testbed
new-experiment`` and the events of the shipped big experiments): the pre-flight's estimate and k,
plain Mininet's ``build()`` + ``start()`` on the same graph in a child process stopped after
``--plain-timeout-s``, the run at k (``--k``, default the pre-flight's) with every check on and the
peak memory of its processes, then from its run directory the bring-up times, the RTT self-check's
median / max error, the events read back within their tolerance, success, and the simulator's
success on the same plan and seed (docs/scale-out.md, "The largest networks on one machine")::

    sudo .venv/bin/python benchmarks/scale_bench.py big topohub:gabriel/500/0 experiments/isp-att.yaml \\
        experiments/continent-americas.yaml [--plain-timeout-s 1800] [--json F] [--result]

``--result`` merges each network measured into ``benchmarks/results/scale.json`` (one row per network
and time dilation k; a row of the same network and k is replaced, the others stay, each with when,
on which commit and by which command it was measured); a row whose plain Mininet was not measured
(``--plain-timeout-s 0``) shows the network's earlier figure with its date.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LOCK = "/tmp/testbed-emulation.lock"


@contextlib.contextmanager
def emulation_lock(shared: str | None = None):
    """The testbed's emulation lock, and ``shared`` too when given (taken first)."""
    with contextlib.ExitStack() as stack:
        for path in ([shared] if shared else []) + [LOCK]:
            f = stack.enter_context(open(path, "a"))
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _sh(cmd: str, check: bool = True) -> str:
    res = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and res.returncode:
        raise RuntimeError(f"{cmd}: {res.stderr[-400:]}")
    return res.stdout


# ------------------------------------------------------------------------------------- profile

class _Shard:
    """A private ovsdb-server + ovs-vswitchd (in namespace ``ns``), as the testbed's OVS shards."""

    def __init__(self, k: int, base: Path):
        self.ns, self.dir = f"tbprof{k}", base / f"ovs{k}"
        self.dir.mkdir(parents=True)
        _sh(f"ip netns add {self.ns} && ip -n {self.ns} link set lo up && ip netns exec {self.ns} sysctl -qw "
            f"net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
        _sh(f"ovsdb-tool create {self.dir}/conf.db /usr/share/openvswitch/vswitch.ovsschema")
        self.db = f"unix:{self.dir}/db.sock"
        self.procs = [subprocess.Popen(["ovsdb-server", f"{self.dir}/conf.db", f"--remote=punix:{self.dir}/db.sock",
                                        f"--unixctl={self.dir}/ovsdb.ctl", "--no-chdir", "-vconsole:off"])]
        while not (self.dir / "db.sock").exists():
            time.sleep(0.02)
        _sh(f"ovs-vsctl --db={self.db} --no-wait init")
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "chrt", "-f", "10", "ovs-vswitchd", self.db,
             f"--unixctl={self.dir}/vswitchd.ctl", "--no-chdir", "-vconsole:off"],
            env=dict(os.environ, OVS_RUNDIR=str(self.dir))))

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        _sh(f"ip netns del {self.ns}", check=False)


def _chain(n: int, shards: list[_Shard], path_len: int = 10) -> None:
    """Bridges pb1..pbN in a chain, bridge i in shard (i-1) * K // N; hosts pha at pb1, phb at pb10."""
    of = [shards[(i - 1) * len(shards) // n] for i in range(1, n + 2)]
    _sh("ip netns add pha && ip netns add phb")
    cmds = [f"link add pl{i}a netns {of[i - 1].ns} type veth peer name pl{i}b netns {of[i].ns}" for i in range(1, n)]
    cmds += [f"link add pha0 netns pha type veth peer name phaS netns {of[0].ns}",
             f"link add phb0 netns phb type veth peer name phbS netns {of[path_len - 1].ns}"]
    batch = Path(tempfile.mktemp())
    batch.write_text("\n".join(cmds) + "\n")
    _sh(f"ip -batch {batch}")
    off = "rx off tx off sg off tso off gso off gro off"
    for i in range(1, n):
        for d, sd in ((f"pl{i}a", of[i - 1]), (f"pl{i}b", of[i])):
            _sh(f"ip netns exec {sd.ns} ethtool -K {d} {off}; ip -n {sd.ns} link set {d} up")
    for d, sd in (("phaS", of[0]), ("phbS", of[path_len - 1])):
        _sh(f"ip netns exec {sd.ns} ethtool -K {d} {off}; ip -n {sd.ns} link set {d} up")
    for ns, d, ip in (("pha", "pha0", "10.94.0.1"), ("phb", "phb0", "10.94.0.2")):
        _sh(f"ip netns exec {ns} ethtool -K {d} {off}; ip -n {ns} addr add {ip}/24 dev {d}; ip -n {ns} link set {d} up;"
            f" ip netns exec {ns} sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
    per: dict[_Shard, list[str]] = {}
    for i in range(1, n + 1):
        ports = ([f"pl{i - 1}b"] if i > 1 else []) + ([f"pl{i}a"] if i < n else []) + (["phaS"] if i == 1 else []) \
            + (["phbS"] if i == path_len else [])
        br = f"-- add-br pb{i} -- set bridge pb{i} datapath_type=netdev fail-mode=standalone "
        per.setdefault(of[i - 1], []).append(br + " ".join(f"-- add-port pb{i} {p}" for p in ports))
    for sd, parts in per.items():
        _sh(f"ovs-vsctl --db={sd.db} --timeout=120 " + " ".join(parts))


def cmd_profile(args) -> dict:
    rows = []
    for spec in args.sizes:
        n, k = map(int, spec.split("x"))
        with emulation_lock():
            base = Path(tempfile.mkdtemp(prefix="ovsprof-"))
            shards = [_Shard(j, base) for j in range(k)]
            try:
                _chain(n, shards)
                _sh("ip netns exec pha ping -c 50 -i 0.02 -W 2 10.94.0.2", check=False)  # learning settles
                time.sleep(3)
                out = _sh("ip netns exec pha ping -n -c 200 -i 0.02 -W 2 10.94.0.2", check=False)
                rtts = [float(x.split("time=")[1].split()[0]) for x in out.splitlines() if "time=" in x]
                row = {"bridges": n, "ovs_vswitchd": k, "path_switches": 10, "replies": len(rtts),
                       "rtt_median_ms": round(statistics.median(rtts), 3) if rtts else None,
                       "rtt_per_switch_ms": round(statistics.median(rtts) / 10, 3) if rtts else None,
                       "load": round(os.getloadavg()[0], 2)}
            finally:
                _sh("ip netns del pha; ip netns del phb", check=False)
                for sd in shards:
                    sd.stop()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"profile": rows}


# ------------------------------------------------------------------------------------- bringup

def scale_experiment(source: str, seed: int = 1, duration_s: float = 5.0):
    """A plan on ``source``: 2 sources and 2 clusters on nodes far apart (breadth-first from the
    first node: the first and 1/3 of the way as sources, 2/3 and the last as clusters), 100 Mbit/s
    links, 4 q/s per source, a wide deadline."""
    import networkx as nx

    from testbed.plan.build import build_plan
    from testbed.spec.experiment import Experiment
    from testbed.spec.topology import load_topology

    raw = load_topology(source, REPO)
    g = nx.Graph()
    g.add_edges_from((lk.a, lk.b) for lk in raw.links)
    comp = max(nx.connected_components(g), key=len)
    order = list(nx.bfs_tree(g, next(n.id for n in raw.nodes if n.id in comp)))
    pick = [order[0], order[len(order) // 3], order[2 * len(order) // 3], order[-1]]
    exp = Experiment.model_validate({
        "name": f"scale-{raw.name}".replace(" ", "")[:40], "seed": seed, "duration": f"{duration_s}s",
        "policy": "closest",
        "topology": {"source": source, "bandwidth": "100Mbit/s", "host_bandwidth": "1Gbit/s",
                     "keep_largest_component": True},
        "clusters": [{"name": f"c{i}", "site": site, "tier": "far_edge", "cpu_cores": 0.5, "workers": 1,
                      "queue_limit": 16, "models": ["digits_small"]} for i, site in enumerate(pick[2:])],
        "sources": [{"name": f"src{i}", "site": site} for i, site in enumerate(pick[:2])],
        "applications": [{"name": "digits", "deadline": "2s", "min_accuracy": 0.5}],
        "workload": [{"application": "digits", "sources": "all", "rate_qps": 4}]})
    return build_plan(exp, raw, REPO)


class _MemSampler(threading.Thread):
    """Every 0.5 s: the peak of the summed RSS (MiB) of processes tagged with ``run_id`` (or, with
    None, of Mininet's shells and the system's ovs-vswitchd), ``peak_mib``; and the largest drop of
    the machine's ``MemAvailable`` (proc(5)) below its value at the start, ``taken_mib``: what the
    pre-flight's estimate is judged against (summed RSS counts each process's shared pages again,
    so it overstates; the drop also counts the kernel's memory for the network, and other jobs')."""

    def __init__(self, run_id: str | None):
        super().__init__(daemon=True)
        self.run_id, self.peak_mib, self.stop = run_id, 0.0, threading.Event()
        self.base = self._system_ovs()
        self.available0, self.taken_mib = _mem_available_mib(), 0.0

    @staticmethod
    def _system_ovs() -> float:
        import psutil

        return sum(p.memory_info().rss for p in psutil.process_iter(["name", "cmdline"])
                   if p.info["name"] == "ovs-vswitchd" and "/var/run/openvswitch" in " ".join(p.info["cmdline"] or [])
                   ) / 2**20

    def sample(self) -> float:
        import psutil

        total = 0
        for p in psutil.process_iter(["name", "cmdline"]):
            try:
                env = p.environ() if self.run_id else {}
                cmd = " ".join(p.info["cmdline"] or [])
                tagged = env.get("TESTBED_RUN_ID") == self.run_id or (self.run_id == "*" and "TESTBED_RUN_ID" in env)
                if (self.run_id and tagged) or \
                        (not self.run_id and ("mnexec" in cmd or cmd.startswith("bash --norc"))):
                    total += p.memory_info().rss
            except (psutil.Error, OSError):
                continue
        return total / 2**20 + max(0.0, self._system_ovs() - self.base)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak_mib = max(self.peak_mib, self.sample())
            self.taken_mib = max(self.taken_mib, self.available0 - _mem_available_mib())


def _mem_available_mib() -> float:
    """The machine's ``MemAvailable`` (MiB; psutil's ``available`` on Linux), as the pre-flight reads it."""
    import psutil

    return psutil.virtual_memory().available / 2**20


#: Process roles of the CPU breakdown (``load``): the first whose pattern is in the command line.
def plain_mininet(plan) -> dict:
    """Plain Mininet on the plan's switches and links (module doc); seconds and peak memory."""
    from testbed.emu.mininet_network import _import_mininet

    mn_net, mn_node, mn_link = _import_mininet()
    mem = _MemSampler(None)
    mem.start()
    t0 = time.monotonic()
    net = mn_net.Mininet(topo=None, build=False, controller=None, autoSetMacs=False, autoStaticArp=False,
                         waitConnected=False)
    try:
        for s in plan.switches:
            net.addSwitch(s.name, cls=mn_node.OVSSwitch, dpid=f"{s.dpid:016x}", datapath="user",
                          protocols="OpenFlow13", failMode="standalone")
        for lk in plan.links:
            net.addLink(net.get(lk.a), net.get(lk.b), cls=mn_link.Link)
        for h in plan.hosts:
            net.addLink(net.addHost(h.name, ip=f"{h.ip}/8"), net.get(h.switch), cls=mn_link.Link)
        net.build()
        net.start()
        up = time.monotonic() - t0
        mem.peak_mib = max(mem.peak_mib, mem.sample())
    finally:
        mem.stop.set()
        net.stop()
    return {"plain_up_s": round(up, 2), "plain_peak_mib": round(mem.peak_mib)}


def testbed_bringup(plan, pings: int = 20) -> dict:
    """The testbed's network bring-up and RTT self-check (module doc)."""
    from rich.console import Console

    from testbed.emu.bringup import calibrate_datapath, emulated_network, new_run_dir
    from testbed.emu.selfcheck import check_rtts

    run_id, run_dir = new_run_dir(plan, Path(tempfile.mkdtemp(prefix="scale-")))
    mem = _MemSampler(run_id)
    mem.start()
    try:
        with emulated_network(plan, run_id, run_dir) as live:
            em = plan.experiment.emulation
            t_cal = time.monotonic()
            cal = calibrate_datapath(live, Console(quiet=True))
            t_cal = time.monotonic() - t_cal
            res = check_rtts(live.emu, plan, live.path_of, pings, em.rtt_tolerance_ms, em.rtt_tolerance_pct,
                             em.rtt_tolerance_per_switch_ms)
            mem.peak_mib = max(mem.peak_mib, mem.sample())
            shards = len(live.emu.shards)
            errs = sorted(abs(r.error_ms) for r in res)
            per_switch = [r.error_ms / len(r.dpids) for r in res]
            out = {"testbed_up_s": round(live.bringup_s, 2), "testbed_phases_s": live.phases,
                   "calibration_s": round(t_cal, 2), "rtt_per_switch_before_ms": cal.get("rtt_per_switch_ms"),
                   "link_offset_ms": cal.get("link_offset_one_way_ms"),
                   "links_at_zero": len(cal.get("links_at_zero", [])),
                   "testbed_peak_mib": round(mem.peak_mib),
                   "ovs_shards": shards, "rtt_error_median_ms": round(statistics.median(errs), 3),
                   "rtt_error_max_ms": round(errs[-1], 3), "rtt_error_per_switch_median_ms":
                   round(statistics.median(per_switch), 3), "rtt_paths_ok": f"{sum(r.ok for r in res)}/{len(res)}",
                   "rtt": [{"pair": f"{r.source}>{r.cluster}", "switches": len(r.dpids), "expected_ms":
                            round(r.expected_ms, 3), "median_ms": round(r.median_ms, 3), "tolerance_ms":
                            round(r.tolerance_ms, 3), "ok": r.ok} for r in res]}
    finally:
        mem.stop.set()
    return out


def cmd_bringup(args) -> dict:
    from testbed.emu.mininet_network import _import_mininet

    _import_mininet()  # both sides are timed without Python's import of Mininet
    rows = []
    for source in args.topologies:
        plan = scale_experiment(source)
        for run in range(args.runs):
            with emulation_lock():
                load = os.getloadavg()[0]
                plain = plain_mininet(plan)
                tb = testbed_bringup(plan)
            row = {"topology": source, "switches": len(plan.switches), "links": len(plan.links), "run": run,
                   "load_before": round(load, 2), **plain, **tb,
                   "ratio": round(tb["testbed_up_s"] / plain["plain_up_s"], 2)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "rtt"}), flush=True)
    print(f"\n{'topology':28} {'sw':>4} {'links':>5} {'plain s':>8} {'testbed s':>9} {'ratio':>5} {'MiB':>6} "
          f"{'shards':>6} {'err med/max ms':>15} {'ok':>5} {'load':>5}")
    for r in rows:
        print(f"{r['topology'][:28]:28} {r['switches']:4d} {r['links']:5d} {r['plain_up_s']:8.2f} "
              f"{r['testbed_up_s']:9.2f} {r['ratio']:5.2f} {r['testbed_peak_mib']:6d} {r['ovs_shards']:6d} "
              f"{r['rtt_error_median_ms']:7.2f}/{r['rtt_error_max_ms']:<7.2f} {r['rtt_paths_ok']:>5} "
              f"{r['load_before']:5.1f}")
    return {"bringup": rows}


# ------------------------------------------------------------------------------------- big

def _plain_capped(plan, timeout_s: float) -> dict:
    """:func:`plain_mininet` in a child process, stopped after ``timeout_s`` (then: how many of the
    plan's bridges the system's Open vSwitch had, and what the child left is removed: its process
    group, the bridges and their interfaces, by name)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child() -> None:
        os.setpgrp()
        q.put(plain_mininet(plan))

    t0 = time.monotonic()
    proc = ctx.Process(target=child)
    proc.start()
    proc.join(timeout_s)
    if not proc.is_alive():
        return q.get() if not q.empty() else {"plain_up_s": None, "plain_note": f"exit code {proc.exitcode}"}
    bridges = set(_sh("ovs-vsctl --timeout=60 list-br", check=False).split())
    names = [sw.name for sw in plan.switches]
    made = sum(n in bridges for n in names)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.join(10)
    gone = [n for n in names if n in bridges]
    for i in range(0, len(gone), 200):
        _sh("ovs-vsctl --timeout=300 " + " ".join(f"-- --if-exists del-br {n}" for n in gone[i:i + 200]), check=False)
    for line in _sh("ip -o link show", check=False).splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if dev.split("-eth")[0] in set(names) | {h.name for h in plan.hosts}:
            _sh(f"ip link del {dev}", check=False)
    return {"plain_up_s": None, "plain_note": f"stopped after {time.monotonic() - t0:.0f} s with {made} of "
                                              f"{len(names)} bridges made"}


def _run_figures(run_dir: Path) -> dict:
    """The checks of one emulated run, from its files: bring-up, RTT self-check errors, events
    read back (events.csv ``ok``), success."""
    import csv

    s = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    rj = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    rtt = list(csv.DictReader(open(run_dir / "rtt_check.csv"))) if (run_dir / "rtt_check.csv").exists() else []
    last = {}
    for r in rtt:  # a path's last attempt counts
        last[(r["source"], r["cluster"])] = r
    errs = sorted(abs(float(r["error_ms"])) for r in last.values())
    ev = list(csv.DictReader(open(run_dir / "events.csv"))) if (run_dir / "events.csv").exists() else []
    ev = [r for r in ev if r.get("phase", "measured") == "measured"]
    t = s.get("timings_s") or {}
    return {"message": rj.get("message"),
            "network_up_s": t.get("network_s"), "bringup_s": t.get("bringup_s"), "total_s": t.get("total_s"),
            "rtt_paths_ok": f"{sum(r['ok'] == '1' for r in last.values())}/{len(last)}",
            "rtt_error_median_ms": round(statistics.median(errs), 2) if errs else None,
            "rtt_error_max_ms": round(errs[-1], 2) if errs else None,
            "events": [{"kind": r["kind"], "asked": r.get("value_asked"), "measured": r.get("value_measured"),
                        "unit": r.get("unit"), "tolerance": r.get("tolerance"), "ok": r.get("ok")} for r in ev],
            "success_ratio": s.get("success_ratio"), "queries": s.get("queries")}


def _experiment_for(source: str) -> str:
    """An experiment file for a topohub topology: ``testbed new-experiment`` (4 clusters, 4 sources,
    40 s), with the events of the shipped big experiments: a link's delay at 10 s, a cluster down
    from 15 to 25 s, a link down from 20 to 30 s (a link of a source's path to its nearest cluster,
    the failed one not a bridge, so that a route around it exists); links named by node id."""
    import networkx as nx
    import yaml

    from testbed.cli.main import main as testbed
    from testbed.plan.build import plan_experiment

    out = Path(tempfile.mkdtemp(prefix="big-exp-")) / f"{source.split(':')[1].replace('/', '-')}.yaml"
    if testbed(["new-experiment", "--topology", source, "--clusters", "auto:4", "--sources", "auto:4",
                "--duration", "40s", "--out", str(out)]) != 0:
        raise SystemExit(f"new-experiment failed on {source}")
    plan = plan_experiment(out)
    node = {sw.name: sw.node_id for sw in plan.switches}
    g = nx.Graph((lk.a, lk.b) for lk in plan.links)
    bridges = {frozenset(e) for e in nx.bridges(g)}
    nearest = [min((p for p in plan.paths if p.source == s.name), key=lambda p: p.rtt_ms) for s in plan.sources]
    on_paths = [(a, b) for p in nearest for a, b in zip(p.switches, p.switches[1:], strict=False)]
    spare = [e for e in on_paths if frozenset(e) not in bridges] or \
        [(lk.a, lk.b) for lk in plan.links if frozenset((lk.a, lk.b)) not in bridges]
    delay = (on_paths or spare)[0]
    cluster = plan.clusters[0].name
    d = yaml.safe_load(out.read_text())
    d["events"] = [{"at": "10s", "kind": "link_delay", "link": [node[delay[0]], node[delay[1]]], "delay": "10ms"},
                   {"at": "15s", "kind": "cluster_down", "cluster": cluster},
                   {"at": "25s", "kind": "cluster_up", "cluster": cluster},
                   {"at": "20s", "kind": "link_down", "link": [node[spare[0][0]], node[spare[0][1]]]},
                   {"at": "30s", "kind": "link_up", "link": [node[spare[0][0]], node[spare[0][1]]]}]
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(out)


def cmd_big(args) -> dict:
    """One whole emulation per experiment (module doc, ``big``)."""
    from rich.console import Console

    from testbed.emu.capacity import check_capacity
    from testbed.emu.mininet_network import _import_mininet
    from testbed.plan.build import plan_experiment
    from testbed.plan.dilation import with_time_dilation
    from testbed.results.runs import run_emulation, run_simulation

    _import_mininet()
    rows = []
    for path in args.experiments:
        source, path = path, _experiment_for(path) if path.startswith("topohub:") else path
        plan = plan_experiment(path)
        cap = check_capacity(plan)
        k = "auto" if args.k == "auto" else float(args.k) if args.k is not None else (cap.k or 1.0)
        row = {"experiment": path, "source": source, "switches": len(plan.switches), "links": len(plan.links), "k": k,
               "estimate_mib": round(cap.needs.memory_mib), "estimate": cap.needs.line(), "fits": cap.fits}
        print(json.dumps(row), flush=True)
        with emulation_lock(args.shared_lock):
            row["load_before"] = round(os.getloadavg()[0], 2)
            if args.plain_timeout_s > 0:
                row.update(_plain_capped(plan, args.plain_timeout_s))
                print(json.dumps({k_: row[k_] for k_ in row if k_.startswith("plain")}), flush=True)
            runs = Path(tempfile.mkdtemp(prefix="big-"))
            mem = _MemSampler("*")
            mem.start()
            t0 = time.monotonic()
            code = run_emulation(with_time_dilation(plan, k), console=Console(stderr=True), runs_dir=runs,
                                 duration_s=args.seconds)
            wall = time.monotonic() - t0
            mem.stop.set()
            row["load_after"] = round(os.getloadavg()[0], 2)
        run_dir = max((d for d in runs.iterdir() if (d / "run.json").exists()), key=lambda d: d.name, default=None)
        if run_dir is None:
            row.update(exit_code=code, wall_s=round(wall, 1), peak_mib=round(mem.peak_mib),
                       taken_mib=round(mem.taken_mib), events=[],
                       message=f"no run directory (exit code {code}): refused before the bring-up, or auto "
                               f"dilation's warm-ups failed (see {runs})")
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.result:
                _write_scale(rows, args)
            continue
        row.update(exit_code=code, wall_s=round(wall, 1), peak_mib=round(mem.peak_mib), taken_mib=round(mem.taken_mib),
                   run_dir=str(run_dir),
                   **_run_figures(run_dir))
        if k == "auto":
            rj = json.loads((run_dir / "run.json").read_text())
            row["k"] = rj.get("time_dilation")
            row["k_auto_verified"] = (rj.get("time_dilation_auto") or {}).get("verified")
        _, sim = run_simulation(plan, runs_dir=runs, duration_s=args.seconds, quiet=True)
        row["sim_success_ratio"] = sim.get("success_ratio")
        if row.get("success_ratio") is not None and row["sim_success_ratio"] is not None:
            row["success_gap_points"] = round(100 * (row["success_ratio"] - row["sim_success_ratio"]), 1)
        if row.get("plain_up_s") and row.get("network_up_s"):
            row["ratio"] = round(row["network_up_s"] / row["plain_up_s"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.result:  # after each network: a stopped invocation keeps the networks it measured
            _write_scale(rows, args)
    print("\n| experiment | switches / links | plain Mininet up | testbed network up | bring-up (servers, warm) | "
          "peak MiB: RSS / taken (estimate) | k | wall s | RTT error median / max ms | self-check | events ok | "
          "success emu / sim |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        plain = f"{r['plain_up_s']} s" if r.get("plain_up_s") else r.get("plain_note", "-")
        ev_ok = f"{sum(e['ok'] == '1' for e in r['events'])}/{len(r['events'])}"
        print(f"| {r['experiment']} | {r['switches']} / {r['links']} | {plain} | {r.get('network_up_s')} s | "
              f"{r.get('bringup_s')} s | {r['peak_mib']} / {r.get('taken_mib')} ({r['estimate_mib']}) | {r['k']} | "
              f"{r['wall_s']} | "
              f"{r.get('rtt_error_median_ms')} / {r.get('rtt_error_max_ms')} | {r.get('rtt_paths_ok')} | {ev_ok} | "
              f"{r.get('success_ratio')} / {r.get('sim_success_ratio')} |")
    return {"big": rows}


#: Success of the emulation within this many points of the simulator's on the same seed (issue 39).
SUCCESS_GAP_POINTS = 3.0


def _event_cell(events: list[dict], kinds: tuple[str, ...]) -> tuple[str, bool | None]:
    """The first read-back event of ``kinds`` that was judged (its ``ok`` set; else the first of
    them): a table cell (asked, measured, tolerance, ok) and its ok (None: the run has no such
    event)."""
    of_kinds = [x for x in events if x["kind"] in kinds]
    e = next((x for x in of_kinds if x.get("ok") not in (None, "")), of_kinds[0] if of_kinds else None)
    if e is None:
        return "not read back", None
    ok = e.get("ok") == "1"
    got = f"{e['kind']}: asked {e.get('asked') or '-'}, measured {e.get('measured') or '-'} {e.get('unit') or ''}"
    tol = f" (tolerance {e['tolerance']})" if e.get("tolerance") else ""
    return f"{got.strip()}{tol}: {'ok' if ok else 'FAILED'}", ok


def _checks(r: dict) -> list[str]:
    """What a row missed (empty: every check passed)."""
    missed = []
    if r.get("exit_code") != 0:
        missed.append(f"exit code {r.get('exit_code')} ({r.get('message')})")
    ok, n = (r.get("rtt_paths_ok") or "0/0").split("/")
    if n == "0" or ok != n:
        missed.append(f"RTT self-check {r.get('rtt_paths_ok') or 'not run'}")
    for name, kinds in (("link event", ("link_delay",)), ("cluster event", ("cluster_down", "cluster_up")),
                        ("reroute", ("link_down",))):
        _, good = _event_cell(r.get("events") or [], kinds)
        if not good:
            missed.append(f"{name} {'not read back' if good is None else 'out of tolerance'}")
    gap = r.get("success_gap_points")
    if gap is None or abs(gap) > SUCCESS_GAP_POINTS:
        missed.append(f"success {r.get('success_ratio')} against the simulator's {r.get('sim_success_ratio')}"
                      + (f" ({gap:+.1f} points)" if gap is not None else ""))
    return missed


PEAK = "peak MiB: RSS summed / MemAvailable taken (estimate)"
#: The scale table's columns; a row is one network (``experiment``) at one time dilation (``k``).
SCALE_COLUMNS = ["experiment", "switches / links", "plain Mininet net.start()", "testbed network up s",
                 "bring-up s (servers ready)", PEAK, "k", "wall s",
                 "RTT error median / max ms (paths ok)", "link event", "cluster event", "reroute around a failed link",
                 "success emu / sim (points)", "load before / after", "missed"]
SCALE_KEY = ("experiment", "k")
PLAIN = "plain Mininet net.start()"
NOT_MEASURED = "not measured"
SCALE_NOTES = [
    "Plain Mininet: the same switches, links and hosts, userspace datapath, no delays, no controller, in a child "
    "process stopped after --plain-timeout-s (then: the bridges it had made); a row measured without it shows the "
    "network's earlier figure, with its date.",
    "Peak MiB, every 0.5 s: the RSS of the run's processes summed (each process's shared pages counted again); the "
    "largest drop of the machine's MemAvailable below its value at the start (what the pre-flight judges against; "
    "it also counts the kernel's memory for the network, and other jobs'; 'not measured' in rows before it was); "
    "estimate: the pre-flight's (testbed.emu.capacity).",
    "Events: events.csv's measured rows (link_delay: the new delay carried by probes; cluster_down: the server "
    "stopped answering; link_down: every affected source -> cluster path answering again over another route).",
    f"Success: the emulation's against `testbed simulate` on the same plan and seed; target within "
    f"{SUCCESS_GAP_POINTS:g} points.",
    "Load: the machine's 1-minute load average before and after each network's run (other jobs share this 2-core "
    "machine).",
    "Rows: one per network and time dilation k; a run of the same network at the same k replaces its row, the "
    "others stay (benchmarks/resultfile.py, merge_rows).",
]


def _scale_row(r: dict) -> list:
    """One network's row of the scale table (:data:`SCALE_COLUMNS`) from ``cmd_big``'s figures."""
    plain = f"{r['plain_up_s']} s" if r.get("plain_up_s") else r.get("plain_note", NOT_MEASURED)
    ev = r.get("events") or []
    gap = r.get("success_gap_points")
    return [r.get("source", r["experiment"]), f"{r['switches']} / {r['links']}", plain, r.get("network_up_s"),
            r.get("bringup_s"), f"{r.get('peak_mib')} / {r.get('taken_mib', NOT_MEASURED)} ({r.get('estimate_mib')})",
            r.get("k"), r.get("wall_s"),
            f"{r.get('rtt_error_median_ms')} / {r.get('rtt_error_max_ms')} ({r.get('rtt_paths_ok')})",
            _event_cell(ev, ("link_delay",))[0], _event_cell(ev, ("cluster_down", "cluster_up"))[0],
            _event_cell(ev, ("link_down",))[0],
            f"{r.get('success_ratio')} / {r.get('sim_success_ratio')}" + (f" ({gap:+.1f})" if gap is not None else ""),
            f"{r.get('load_before')} / {r.get('load_after')}", "; ".join(_checks(r)) or "none"]


def _keep_plain_baseline(table: dict, old: dict | None) -> None:
    """A new row whose network's plain Mininet was not measured (``--plain-timeout-s 0``) takes the
    figure of that network's row in ``old`` (the merged table so far; the same k first), with the
    date it was measured: the baseline is the network's, whatever k."""
    if not old:
        return
    cols, ocols = table["columns"], old["columns"]
    if PLAIN not in ocols:
        return
    ex, pl, k = cols.index("experiment"), cols.index(PLAIN), cols.index("k")
    for row in table["rows"]:
        if row[pl] != NOT_MEASURED:
            continue
        earlier = [(o[ocols.index("k")] != row[k], o[ocols.index(PLAIN)], m) for o, m in
                   zip(old["rows"], old.get("row_measured") or [{}] * len(old["rows"]), strict=True)
                   if o[ocols.index("experiment")] == row[ex] and o[ocols.index(PLAIN)] not in (None, NOT_MEASURED)]
        if earlier:
            _, cell, measured = min(earlier, key=lambda x: x[0])
            when = measured.get("measured_at")
            row[pl] = cell if "(measured " in str(cell) or not when else f"{cell} (measured {when})"


def _row_label(row: list, cols: list[str]) -> str:
    """A scale row's key as text: 'experiments/isp-att.yaml at k = 6.5'."""
    k = row[cols.index("k")]
    return f"{row[cols.index('experiment')]} at k = {k:g}" if isinstance(k, float | int) else \
        f"{row[cols.index('experiment')]} at k = {k}"


def _scale_summary(table: dict, pending: list[str]) -> str:
    """One sentence over every row of the merged table: where every check passed, where one missed."""
    cols = table["columns"]
    missed = cols.index("missed")
    label = [_row_label(r, cols) for r in table["rows"]]
    passed = [x for x, r in zip(label, table["rows"], strict=True) if r[missed] == "none"]
    failed = [x for x, r in zip(label, table["rows"], strict=True) if r[missed] != "none"]
    parts = ([f"Every check passed on {', '.join(passed)}"] if passed else []) + \
            ([f"MISSED on {', '.join(failed)} (column 'missed')"] if failed else []) + \
            ([f"not measured (the invocation stopped first): {', '.join(pending)}"] if pending else [])
    return "; ".join(parts) + "."


def _scale_notes(table: dict) -> list[str]:
    """:data:`SCALE_NOTES`, then the command, commit and machine of each row (its date is a column)."""
    cols = table["columns"]
    per_row = [f"{_row_label(r, cols)}: measured {m.get('measured_at', 'at a time not recorded')} on commit "
               f"{m.get('commit', 'not recorded')} ({m.get('machine', 'machine not recorded')}) by "
               f"`{m.get('command', 'a command not recorded')}`."
               for r, m in zip(table["rows"], table["row_measured"], strict=True)]
    return SCALE_NOTES + per_row


def _write_scale(rows: list[dict], args, out_dir: Path | None = None) -> Path:
    """Merge this invocation's networks into ``benchmarks/results/scale.json`` (``out_dir``: another
    folder): each replaces the row of the same network at the same k, the other rows stay
    (:func:`benchmarks.resultfile.merge_rows`), and every row says when, on which commit and by which
    command it was measured. Returns the file's path.

    Raises:
        ValueError: the existing file is not a result file, or not the scale table.
    """
    import shlex

    from benchmarks.resultfile import RESULTS_DIR, merge_rows, previous_table, provenance, write_result

    out_dir = out_dir or RESULTS_DIR
    command = "sudo .venv/bin/python benchmarks/scale_bench.py " + shlex.join(sys.argv[1:])
    old = previous_table("scale", SCALE_KEY, out_dir)
    table = {"caption": "one emulation per network and time dilation, every check on; plain Mininet's build() + "
                        "start() on the same graph measured in the same invocation, before the run",
             "columns": SCALE_COLUMNS, "rows": [_scale_row(r) for r in rows],
             "row_measured": [provenance(command) for _ in rows]}
    _keep_plain_baseline(table, old)
    merged = merge_rows(old, table, SCALE_KEY)
    done = {r.get("source", r["experiment"]) for r in rows}
    pending = [e for e in args.experiments if e not in done]
    return write_result("scale", "The largest networks on one machine", command, [merged],
                        summary=_scale_summary(merged, pending), notes=_scale_notes(merged), out_dir=out_dir)


# ------------------------------------------------------------------------------------- costs

def _role_cpu_s(run_id: str) -> dict[str, float]:
    """CPU seconds so far per role of the run's processes (testbed.emu.capacity.role_of)."""
    import psutil

    from testbed.emu.capacity import role_of
    from testbed.emu.cleanup import RUN_ENV

    out: dict[str, float] = {}
    for p in psutil.process_iter(["cmdline", "cpu_times"]):
        try:
            if p.environ().get(RUN_ENV) == run_id:
                role = role_of(" ".join(p.info["cmdline"] or []))
                out[role] = out.get(role, 0.0) + p.info["cpu_times"].user + p.info["cpu_times"].system
        except (psutil.Error, OSError):
            continue
    return out


def _usage_row(usage: dict) -> dict:
    return {role: {"processes": u.processes, "threads": u.threads, "pss_mib": round(u.pss_mib, 1), "fds": u.fds,
                   "max_fds": u.max_fds} for role, u in sorted(usage.items())}


def cmd_costs(args) -> dict:
    """What a run's parts cost (testbed.emu.capacity.COSTS): per topology, the testbed's network
    brought up and left idle, then per role of its processes their count, threads, memory (PSS)
    and descriptors, the kernel's own memory grown (Slab, stacks, page tables), and the CPU the
    idle network takes over ``--idle-s``; with ``--run``, a short run of that experiment
    (servers and sources), sampled every second, the largest of each role kept."""
    from testbed.emu.bringup import emulated_network, new_run_dir
    from testbed.emu.capacity import count_items, kernel_mib, usage_by_role

    rows = []
    for source in args.topologies:
        plan = scale_experiment(source)
        with emulation_lock():
            kern0 = kernel_mib()
            run_id, run_dir = new_run_dir(plan, Path(tempfile.mkdtemp(prefix="costs-")))
            with emulated_network(plan, run_id, run_dir) as live:
                time.sleep(2)
                cpu0, t0 = _role_cpu_s(run_id), time.monotonic()
                time.sleep(args.idle_s)
                cpu1, dt = _role_cpu_s(run_id), time.monotonic() - t0
                usage = usage_by_role(run_id)
                kern1 = kernel_mib()
                items = count_items(plan, live.link_emulator, live.datapath)
        row = {"topology": source, "items": items, "kernel_mib": round(kern1 - kern0, 1),
               "idle_cores": {r: round((cpu1.get(r, 0) - cpu0.get(r, 0)) / dt, 4) for r in cpu1},
               "roles": _usage_row(usage)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"bringup": rows}
    if args.run and not args.topologies:
        rows.clear()
    if args.run:
        out["run"] = _costs_of_a_run(Path(args.run), args.seconds)
        print(json.dumps(out["run"]), flush=True)
    return out


def _costs_of_a_run(path: Path, seconds: float) -> dict:
    """The largest usage per role over a short run of ``path`` (every second)."""
    from rich.console import Console

    from testbed.emu.capacity import usage_by_role
    from testbed.emu.cleanup import RUN_ENV
    from testbed.plan.build import plan_experiment
    from testbed.results.runs import run_emulation

    plan = plan_experiment(path)  # without its RTT self-check: memory does not depend on it, a busy machine fails it
    exp = plan.experiment
    plan = plan.model_copy(update={"experiment": exp.model_copy(update={"emulation": exp.emulation.model_copy(
        update={"rtt_check": False})})})
    peak: dict[str, dict] = {}
    stop = threading.Event()

    def sample() -> None:
        import psutil

        while not stop.wait(1.0):
            ids = set()
            for p in psutil.process_iter():
                try:
                    ids.add(p.environ().get(RUN_ENV))
                except (psutil.Error, OSError):
                    continue
            for run_id in ids - {None}:
                for role, u in _usage_row(usage_by_role(run_id)).items():
                    if u["pss_mib"] > peak.get(role, {}).get("pss_mib", -1):
                        peak[role] = u

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    with emulation_lock():
        code = run_emulation(plan, console=Console(quiet=True), runs_dir=Path(tempfile.mkdtemp(prefix="costs-run-")),
                             duration_s=seconds)
    stop.set()
    th.join()
    return {"experiment": str(path), "exit_code": code, "items": {"clusters": len(plan.clusters),
            "sources": len(plan.sources)}, "roles": peak}


# ------------------------------------------------------------------------------------- load

def cmd_load(args) -> dict:
    """Runs at increasing total rates (module doc)."""
    from rich.console import Console

    from testbed.plan.build import build_plan
    from testbed.results.runs import run_emulation
    from testbed.spec.experiment import load_experiment

    path = Path(args.experiment)
    exp = load_experiment(path)
    rows = []
    for rate in args.rates:
        per = rate / (len(exp.sources) * len(exp.workload))
        wl = [w.model_copy(update={"rate_qps": per}) for w in exp.workload]
        clusters = exp.clusters if args.runtime is None else [  # every model on that runtime
            c.model_copy(update={"server": c.server.model_copy(update={"runtime": args.runtime, "model_runtimes": {}})})
            for c in exp.clusters]
        topo = exp.topology if args.mtu is None else \
            type(exp.topology).model_validate(exp.topology.model_dump() | {"mtu": args.mtu})  # checked
        update = {"events": [], "workload": wl, "clusters": clusters, "topology": topo}
        if args.policy is not None:  # every source's: a source's own policy would win over the experiment's
            update["policy"] = args.policy
            update["sources"] = [s.model_copy(update={"policy": None}) for s in exp.sources]
        plan = build_plan(exp.model_copy(update=update), base_dir=path.parent)
        runs = Path(tempfile.mkdtemp(prefix="load-"))
        with emulation_lock():
            load = os.getloadavg()[0]
            code = run_emulation(plan, console=Console(quiet=True), runs_dir=runs, duration_s=args.seconds)
        run_dir = next(runs.iterdir())
        s = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        import pandas as pd

        rec = run_dir / "records.csv"
        try:
            df = pd.read_csv(rec) if rec.exists() else pd.DataFrame()
        except pd.errors.EmptyDataError:  # a run that failed before its load: an empty records.csv
            df = pd.DataFrame()
        ok = df[df.get("network_ms").notna()] if len(df) else df
        excess = (ok["network_ms"] - ok["expected_rtt_ms"]) if len(ok) else None
        row = {"rate_qps": rate, "mtu": plan.experiment.topology.mtu, "exit_code": code,
               "load_before": round(load, 2),
               "answered_qps": s.get("answered_qps") or (round(len(ok) / args.seconds, 1) if len(ok) else 0),
               "success_ratio": s.get("success_ratio"),
               "network_excess_p50_ms": round(float(excess.median()), 2) if excess is not None else None,
               "network_excess_p95_ms": round(float(excess.quantile(0.95)), 2) if excess is not None else None}
        m = s.get("machine_cpu") or {}  # the CPU per role over the load (testbed.emu.machine)
        if m:
            row.update(cpu_cores_by_role=m["by_role"], cpu_busy_cores=m["busy_cores"])
        if code != 0:  # e.g. the RTT self-check failed: say why (run.json), the rate measured nothing
            rj = run_dir / "run.json"
            row["message"] = json.loads(rj.read_text()).get("message") if rj.exists() else None
        # None: the run failed or answered nothing, so it measured no ceiling (see "message")
        measured = code == 0 and row["network_excess_p50_ms"] is not None
        row["network_bottleneck"] = row["network_excess_p50_ms"] > args.margin_ms if measured else None
        row["bottleneck"] = bool(row["network_bottleneck"] or (row["success_ratio"] or 0) < 0.9) if measured else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"load": rows, "margin_ms": args.margin_ms}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("profile")
    a.add_argument("sizes", nargs="+", help="NxK: N bridges over K ovs-vswitchd")
    b = sub.add_parser("bringup")
    b.add_argument("topologies", nargs="+")
    b.add_argument("--runs", type=int, default=1)
    e = sub.add_parser("big")
    e.add_argument("experiments", nargs="+", help="experiment files (e.g. experiments/isp-att.yaml)")
    e.add_argument("--k", default=None, help="time dilation: a number, or auto (measured warm-ups: "
                   "testbed.emu.autodilate); default: the pre-flight's k")
    e.add_argument("--shared-lock", default=None,
                   help="also hold this lock file per network (e.g. /tmp/emu.lock on shared build machines), "
                        "released between networks")
    e.add_argument("--result", action="store_true",
                   help="merge the networks measured into benchmarks/results/scale.json (docs/results.md's "
                        "section): each replaces its network's row at the same k, the other rows stay")
    e.add_argument("--seconds", type=float, default=None, help="load duration (default: the experiment's)")
    e.add_argument("--plain-timeout-s", type=float, default=1800.0,
                   help="stop plain Mininet's bring-up after this long (0: skip it)")
    d = sub.add_parser("costs")
    d.add_argument("topologies", nargs="*")
    d.add_argument("--idle-s", type=float, default=10.0)
    d.add_argument("--run", default=None, help="also a short run of this experiment (servers and sources)")
    d.add_argument("--seconds", type=float, default=15.0)
    c = sub.add_parser("load")
    c.add_argument("--experiment", default=str(REPO / "experiments" / "scenario-failure.yaml"))
    c.add_argument("--rates", nargs="+", type=float, default=[100, 200, 500])
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--margin-ms", type=float, default=20.0)
    c.add_argument("--mtu", type=int, default=None,
                   help="the emulated network's MTU, bytes (topology.mtu; default: the experiment's)")
    c.add_argument("--runtime", choices=("tensorflow", "litert"), default=None,
                   help="serve every model with this runtime (default: the experiment's)")
    from testbed.model.policies import CATALOGUE

    c.add_argument("--policy", default=None, choices=CATALOGUE,
                   help="every source's policy (default: the experiment's); e.g. round_robin spreads the load "
                        "over every cluster, so that the clusters' quotas do not saturate before the testbed")
    return run_benchmark(p, {"profile": cmd_profile, "bringup": cmd_bringup, "big": cmd_big, "costs": cmd_costs,
                                        "load": cmd_load}, argv)


def run_benchmark(parser: argparse.ArgumentParser, commands: dict, argv: list[str] | None) -> int:
    """Parse ``argv`` (every subcommand gets ``--json FILE``), check root, run the subcommand and
    write its result as JSON when asked. Shared by the emulation benchmarks."""
    for sub in parser._subparsers._group_actions[0].choices.values():  # noqa: SLF001 - argparse has no API
        sub.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (namespaces, Mininet, Open vSwitch)", file=sys.stderr)
        return 2
    out = commands[args.cmd](args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
