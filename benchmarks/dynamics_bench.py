"""Benchmarks of network dynamics (issue 11): events in the emulation against the simulator, and the
link model against the link emulator.

``events`` (root; emulations queue on ``/tmp/testbed-emulation.lock``): for each scenario and seed,
``testbed run`` and ``testbed simulate`` on the same plan and seed; prints per run the success
ratio and e2e p50/p95 of both engines and their gap, and per event (emulation) the lag, the time
from the event to its effect, the value asked and the value measured::

    sudo .venv/bin/python benchmarks/dynamics_bench.py events --scenarios degradation failure \\
        --seeds 1 2 3 [--json out.json]

``kinds`` (root): every registered kind of link event (:data:`testbed.model.timeline.LINK_KINDS`:
the values of its ``examples``, then back), ``--repeat`` times each, fired on the triangle
(``experiments/triangle.yaml``, no servers, no load); per kind the lag, the time from the event to
its effect, value asked vs measured, the share within tolerance, and for ``link_down`` the time
until the rerouted paths answer again (the reroute time)::

    sudo .venv/bin/python benchmarks/dynamics_bench.py kinds --repeat 5

``fifo`` (root): a burst of 6 full frames (an 8.5 kB request) through one link emulator's 20 Mbit/s
FIFO shaper with Poisson UDP background at several loads, measured against the model
(:mod:`testbed.model.network`)::

    sudo .venv/bin/python benchmarks/dynamics_bench.py fifo

Both take ``/tmp/testbed-emulation.lock`` themselves, per emulated run (do not wrap them in
``flock``: that would deadlock), so other engineers' emulations can interleave. Each run records
the load average before it (the machine is shared; figures taken under load say so).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.scale_bench import emulation_lock, run_benchmark  # noqa: E402 - after the path
from testbed.model.timeline import LINK_KINDS, kind_of  # noqa: E402 - after the path

# ------------------------------------------------------------------------------------- events

def _summary_row(s: dict) -> dict:
    e = s.get("e2e_ms") or {}
    return {"success_ratio": s.get("success_ratio"), "p50": e.get("p50"), "p95": e.get("p95"),
            "queries": s.get("queries")}


def _emulate(plan, runs: Path) -> tuple[dict, list[dict]]:
    """One emulated run under the emulation lock; (summary row, events.csv rows)."""
    import csv

    from rich.console import Console

    from testbed.results.runs import run_emulation

    with emulation_lock():
        code = run_emulation(plan, console=Console(quiet=True), runs_dir=runs)
    run_dir = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    s = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    ev = list(csv.DictReader(open(run_dir / "events.csv"))) if (run_dir / "events.csv").exists() else []
    return {**_summary_row(s), "exit_code": code, "run_dir": str(run_dir)}, ev


def cmd_events(args) -> dict:
    from rich.console import Console
    from rich.table import Table

    from testbed.plan.build import build_plan
    from testbed.results.runs import run_simulation
    from testbed.spec.experiment import load_experiment

    out = {"runs": [], "events": []}
    tmp = Path(tempfile.mkdtemp(prefix="dynbench-"))
    for name in args.scenarios:
        path = REPO / "experiments" / f"scenario-{name}.yaml"
        exp = load_experiment(path)
        for seed in args.seeds:
            plan = build_plan(exp.model_copy(update={"seed": seed}), base_dir=path.parent)
            load = os.getloadavg()[0]
            emu, events = _emulate(plan, tmp / f"{name}-{seed}-emu")
            _, sim = run_simulation(plan, tmp / f"{name}-{seed}-sim", seed=seed, quiet=True)
            out["runs"].append({"scenario": name, "seed": seed, "load_before": round(load, 2), "emulation": emu,
                                "simulation": _summary_row(sim)})
            out["events"] += [{"scenario": name, "seed": seed, **{k: e[k] for k in
                               ("kind", "target", "planned_s", "lag_ms", "effect_ms", "value_asked",
                                "value_measured", "unit", "ok")}} for e in events]
    c = Console()
    t = Table(title="Simulation vs emulation (same plan and seed)")
    for col in ("scenario", "seed", "load", "SR emu", "SR sim", "gap", "p50 emu", "p50 sim", "p95 emu", "p95 sim"):
        t.add_column(col)
    for r in out["runs"]:
        e, s = r["emulation"], r["simulation"]
        both = e["success_ratio"] is not None and s["success_ratio"] is not None
        gap = e["success_ratio"] - s["success_ratio"] if both else None
        t.add_row(r["scenario"], str(r["seed"]), f"{r['load_before']:.1f}", str(e["success_ratio"]),
                  str(s["success_ratio"]), "-" if gap is None else f"{gap:+.3f}", str(e["p50"]), str(s["p50"]),
                  str(e["p95"]), str(s["p95"]))
    c.print(t)
    t = Table(title="Events in the emulation")
    for col in ("scenario", "seed", "kind", "target", "planned s", "lag ms", "effect ms", "asked", "measured",
                "unit", "ok"):
        t.add_column(col)
    for e in out["events"]:
        t.add_row(e["scenario"], str(e["seed"]), e["kind"], e["target"], e["planned_s"], e["lag_ms"], e["effect_ms"],
                  e["value_asked"] or "-", e["value_measured"] or "-", e["unit"], str(e["ok"]))
    c.print(t)
    return out


# ------------------------------------------------------------------------------------- kinds

#: Seconds between two changes beyond the change's measurement window (its kind's ``window_s``).
GAP_BEYOND_WINDOW_S = 0.4


def _kind_steps(plan, repeat: int) -> list[tuple[str, tuple[str, str], float | None]]:
    """Every registered link kind in turn on the triangle's links, s1-s2 (A-B, 2 ms) and s2-s3 (B-C,
    3 ms): a kind with a value fires its ``examples`` on A-B, then the link's planned value (the way
    back); the kinds that take a link down or up (in registration order: down, then up) go on B-C."""
    ab, bc = ("s1", "s2"), ("s2", "s3")
    lk = next(x for x in plan.links if {x.a, x.b} == set(ab))
    planned = {"delay_ms": lk.delay_ms, "bandwidth_mbps": lk.bandwidth_mbps, "loss_pct": lk.loss_pct,
               "background_mbps": 0.0}
    kinds = [kind_of(k) for k in LINK_KINDS]
    one = [(k.name, ab, v) for k in kinds if k.value_field for v in (*k.examples, planned[k.value_field])]
    one += [(k.name, bc, None) for k in kinds if k.value_field is None and k.sets_up is not None]
    return one * repeat


def cmd_kinds(args) -> dict:

    import yaml

    from testbed.emu.bringup import emulated_network, new_run_dir
    from testbed.emu.event_runner import EventRunner
    from testbed.model.timeline import Change
    from testbed.plan.build import build_plan
    from testbed.spec.experiment import Experiment

    tri = REPO / "experiments" / "triangle.yaml"
    data = yaml.safe_load(tri.read_text())
    data["events"] = [{"at": "1s", "kind": "link_delay", "link": ["A", "B"], "delay": "2ms"},
                      {"at": "2s", "kind": "link_down", "link": ["B", "C"]}, {"at": "3s", "kind": "link_up",
                                                                           "link": ["B", "C"]}]
    plan = build_plan(Experiment.model_validate(data), base_dir=tri.parent)
    changes, t = [], 0.0
    for i, (kind, link, value) in enumerate(_kind_steps(plan, args.repeat)):
        changes.append(Change(t_s=t, kind=kind, event=i, link=link, value=value))
        t += changes[-1].entry.window_s + GAP_BEYOND_WINDOW_S
    with emulation_lock():
        load = os.getloadavg()[0]
        run_id, run_dir = new_run_dir(plan, Path(tempfile.mkdtemp(prefix="kinds-")))
        with emulated_network(plan, run_id, run_dir) as live:
            runner = EventRunner(live, None, changes, time.time() + 0.5)
            runner.start()
            runner.join(timeout=t + 30)
            if runner.error:
                raise runner.error
            rows = runner.rows
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["kind"], []).append(r)

    def stat(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} / {max(xs):.2f}" if xs else "-"

    out = []
    print(f"triangle, {args.repeat} x each change, load average {load:.1f} before; median / max")
    print(f"{'kind':16} {'n':>3} {'lag ms':>13} {'effect ms':>15} {'|measured - asked|':>20} {'measured':>17} "
          f"{'ok':>5}")
    for kind, rs in by.items():
        lag = [float(r["lag_ms"]) for r in rs]
        eff = [float(r["effect_ms"]) for r in rs if r["effect_ms"] != ""]
        err = [abs(float(r["value_measured"]) - float(r["value_asked"])) for r in rs
               if r["value_measured"] != "" and r["value_asked"] != ""]
        meas = [float(r["value_measured"]) for r in rs if r["value_measured"] != ""]
        ok = sum(1 for r in rs if r["ok"] == 1)
        out.append({"kind": kind, "n": len(rs), "lag_ms": lag, "effect_ms": eff, "abs_error": err, "measured": meas,
                    "ok": ok, "unit": rs[0]["unit"]})
        print(f"{kind:16} {len(rs):3d} {stat(lag):>13} {stat(eff):>15} {stat(err):>20} {stat(meas):>17} "
              f"{ok:>2}/{len(rs):<2} ({rs[0]['unit']})")
    return {"load_before": load, "kinds": out, "rows": rows}


# ------------------------------------------------------------------------------------- fifo

_RX = r'''
import json, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, 35, 1)
s.bind(("0.0.0.0", 47100)); s.settimeout(float(sys.argv[1])); out = {}
try:
    while True:
        d, anc, _, _ = s.recvmsg(2048, 64)
        sec, ns = struct.unpack("@ll", anc[0][2]); t = sec * 10**9 + ns
        b, i, t0 = struct.unpack("!IIq", d[:16]); r = out.setdefault(b, [t0, 0, 0]); r[1] = max(r[1], t); r[2] += 1
except socket.timeout:
    pass
print(json.dumps(out))
'''
_TX = ("import random, socket, struct, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
       "for b in range({n}):\n t0 = time.time_ns()\n for i in range(6): "
       "s.sendto(struct.pack('!IIq', b, i, t0).ljust(1458, b'\\0'), ('10.95.0.2', 47100))\n"
       " time.sleep(0.05 + random.random() * 0.02)\n")


def _sh(cmd: str, check: bool = True) -> str:
    res = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and res.returncode:
        raise RuntimeError(f"{cmd}: {res.stderr}")
    return res.stdout


def cmd_fifo(args) -> dict:

    from testbed.emu.linkemu import disable_offloads
    from testbed.emu.probe import wait_ready
    from testbed.model.network import LinkState

    ns = ("tbfifo-a", "tbfifo-l", "tbfifo-b")
    tmp = Path(tempfile.mkdtemp(prefix="fifo-"))
    procs: list[subprocess.Popen] = []
    rows = []
    stack = contextlib.ExitStack()
    stack.enter_context(emulation_lock())
    try:
        for n in ns:
            _sh(f"ip netns del {n}", check=False)
            _sh(f"ip netns add {n} && ip netns exec {n} sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
        _sh(f"ip link add a0 netns {ns[0]} type veth peer name l0 netns {ns[1]}")
        _sh(f"ip link add l1 netns {ns[1]} type veth peer name b0 netns {ns[2]}")
        for n, d in ((ns[0], "a0"), (ns[1], "l0"), (ns[1], "l1"), (ns[2], "b0")):
            disable_offloads(d, n)
            _sh(f"ip -n {n} link set {d} up")
        _sh(f"ip -n {ns[0]} addr add 10.95.0.1/24 dev a0 && ip -n {ns[2]} addr add 10.95.0.2/24 dev b0")
        emu = subprocess.Popen(["ip", "netns", "exec", ns[1], sys.executable, "-m", "testbed.emu.linkemu",
                                "--if-a", "l0", "--if-b", "l1", "--delay-ms", "0", "--rate-mbps", str(args.rate),
                                "--control", str(tmp / "emu.sock")], cwd=REPO, stdout=subprocess.PIPE, text=True)
        procs.append(emu)
        emu.stdout.readline()
        for side, n in (("a", ns[0]), ("b", ns[2])):
            procs.append(subprocess.Popen(["ip", "netns", "exec", n, sys.executable, "-m", "testbed.emu.probe",
                                           "--control", str(tmp / f"{side}.sock")], cwd=REPO,
                                          stdout=subprocess.DEVNULL))
        a = wait_ready(tmp / "a.sock", proc=procs[1])
        wait_ready(tmp / "b.sock", proc=procs[2])
        _sh(f"ip netns exec {ns[0]} ping -c 2 -i 0.1 10.95.0.2")
        for rho in args.rho:
            r = rho * args.rate
            load = os.getloadavg()[0]
            a.request("blast", ip="10.95.0.2", rate_mbps=r, proto="udp")
            time.sleep(1.0)
            rx = subprocess.Popen(["ip", "netns", "exec", ns[2], sys.executable, "-c", _RX, "1.5"],
                                  stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)
            _sh(f"ip netns exec {ns[0]} {sys.executable} -c \"{_TX.format(n=args.bursts)}\"")
            got = json.loads(rx.communicate(timeout=60)[0])
            done = [(v[1] - v[0]) / 1e6 for v in got.values() if v[2] == 6]
            lk = LinkState("a", "b", 0.0, args.rate)
            lk.bg_ab = r
            ps = 6 * 1514 * 8 / (max(args.rate - r, 0.01 * args.rate) * 1e3) + (
                rho / (2 * (1 - rho)) * 1514 * 8 / (args.rate * 1e3) if rho < 1 else 0.0)
            rows.append({"rho": rho, "background_mbps": r, "bursts": len(done), "load": round(load, 2),
                         "measured_median_ms": round(statistics.median(done), 3),
                         "measured_mean_ms": round(statistics.mean(done), 3),
                         "model_ms": round(lk.one_way_ms(6 * 1448, True), 3), "processor_sharing_ms": round(ps, 3)})
        a.request("blast", ip="10.95.0.2", rate_mbps=0, proto="udp")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        for n in ns:
            _sh(f"ip netns del {n}", check=False)
        stack.close()
    print(f"6-frame burst (8.5 kB request) through a {args.rate:g} Mbit/s FIFO with Poisson UDP background")
    print(f"{'rho':>5} {'bg Mbit/s':>9} {'median ms':>9} {'mean ms':>8} {'model ms':>8} {'PS ms':>7} {'load':>5}")
    for r in rows:
        print(f"{r['rho']:5.2f} {r['background_mbps']:9.1f} {r['measured_median_ms']:9.2f} "
              f"{r['measured_mean_ms']:8.2f} {r['model_ms']:8.2f} {r['processor_sharing_ms']:7.2f} {r['load']:5.1f}")
    return {"fifo": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("events", help="scenarios: emulation vs simulation, events measured")
    e.add_argument("--scenarios", nargs="+", default=["degradation", "failure"])
    e.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    k = sub.add_parser("kinds", help="every kind of link event on the triangle: effect, asked vs measured")
    k.add_argument("--repeat", type=int, default=5)
    f = sub.add_parser("fifo", help="the link model's FIFO against the link emulator")
    f.add_argument("--rate", type=float, default=20.0, help="link rate, Mbit/s")
    f.add_argument("--rho", nargs="+", type=float, default=[0.0, 0.5, 0.8, 0.9])
    f.add_argument("--bursts", type=int, default=60)
    return run_benchmark(p, {"events": cmd_events, "kinds": cmd_kinds, "fifo": cmd_fifo}, argv)


if __name__ == "__main__":
    sys.exit(main())
