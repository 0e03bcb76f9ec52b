"""Emulation vs simulation agreement: the same experiment under each policy, emulated (real Mininet,
OVS, TensorFlow servers) and simulated (same seed, same arrivals), side by side.

Run (root, one emulation at a time): ``.venv/bin/python benchmarks/agreement.py
[experiments/default.yaml] [--duration 20s] [--policies closest,min_latency] [--out DIR]
[--overhead 3.5ms --per-hop 3ms] [--reuse]``. ``--overhead``/``--per-hop`` add a calibrated
simulation (``simulation.overhead_ms``/``per_hop_ms``) next to the plain one; ``--reuse`` takes the
emulated runs already in DIR instead of running them again.
Writes ``agreement.csv`` and ``agreement.md`` (success ratio, e2e p50/p95, breakdown per mode and
policy, and the differences). Emulated figures depend on this machine's load (2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from testbed.emu.cleanup import RunLockedError
from testbed.model.policies import CATALOGUE
from testbed.plan.build import build_plan
from testbed.spec.units import parse_delay_ms, parse_duration_s

REPO = Path(__file__).resolve().parent.parent


def _row(mode: str, policy: str, run_dir: Path, s: dict) -> dict:
    e, b = s.get("e2e_ms") or {}, s.get("breakdown_ms") or {}
    return {"mode": mode, "policy": policy, "queries": s.get("queries"), "success_ratio": s.get("success_ratio"),
            "e2e_p50_ms": e.get("p50"), "e2e_p95_ms": e.get("p95"), "network_ms": b.get("network"),
            "queueing_ms": b.get("queueing"), "inference_ms": b.get("inference"),
            "failures": json.dumps(s.get("failures") or {}), "run_dir": str(run_dir)}


def main() -> int:
    from rich.console import Console

    from testbed.results.runs import run_emulation, run_simulation
    from testbed.spec.experiment import load_experiment

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="?", default=str(REPO / "experiments/default.yaml"))
    ap.add_argument("--duration", default="20s")
    ap.add_argument("--policies", default=",".join(CATALOGUE))
    ap.add_argument("--out", default=str(REPO / "runs/agreement"))
    ap.add_argument("--overhead", default="0ms", help="calibrated simulation: simulation.overhead")
    ap.add_argument("--per-hop", default="0ms", help="calibrated simulation: simulation.per_hop")
    ap.add_argument("--reuse", action="store_true", help="reuse the emulated runs in --out")
    ap.add_argument("--no-rtt-check", action="store_true",
                    help="skip the emulation's RTT self-check (it fails when the machine is overloaded)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    duration = parse_duration_s(a.duration, item="--duration")
    base = load_experiment(a.experiment)
    console = Console()
    rows = []
    for pol in a.policies.split(","):
        exp = base.model_copy(update={"policy": pol})
        if a.no_rtt_check:
            exp = exp.model_copy(update={"emulation": exp.emulation.model_copy(update={"rtt_check": False})})
        plan = build_plan(exp, base_dir=Path(a.experiment).parent)
        sim_dir, s = run_simulation(plan, duration_s=duration, run_dir=out / f"sim-{pol}", quiet=True)
        rows.append(_row("simulation", pol, sim_dir, s))
        oh, ph = parse_delay_ms(a.overhead, item="--overhead"), parse_delay_ms(a.per_hop, item="--per-hop")
        if oh or ph:
            cal = exp.model_copy(update={"simulation": exp.simulation.model_copy(
                update={"overhead_ms": oh, "per_hop_ms": ph})})
            cdir, cs = run_simulation(build_plan(cal, base_dir=Path(a.experiment).parent), duration_s=duration,
                                           run_dir=out / f"simcal-{pol}", quiet=True)
            rows.append(_row("simulation-calibrated", pol, cdir, cs))
        emu_runs = out / f"emu-{pol}"
        done = [d for d in sorted(emu_runs.glob("*")) if (d / "summary.json").exists()] if a.reuse else []
        for _attempt in range(0 if done else 10):
            try:
                code = run_emulation(plan, console=console, runs_dir=emu_runs, duration_s=duration)
            except RunLockedError:
                code = 75
            run_dirs = sorted(emu_runs.glob("*")) if emu_runs.exists() else []
            if code == 0 or (run_dirs and (run_dirs[-1] / "summary.json").exists()):
                break
            console.print("another run is active (or failed to start); retrying in 30 s")
            time.sleep(30)
        rd = done[-1] if done else sorted(emu_runs.glob("*"))[-1]
        rows.append(_row("emulation", pol, rd, json.loads((rd / "summary.json").read_text())))
        pd.DataFrame(rows).to_csv(out / "agreement.csv", index=False)
    df = pd.DataFrame(rows)
    lines = ["| policy | sim mode | success sim | success emu | diff | p50 sim | p50 emu | p95 sim | p95 emu | "
             "net sim/emu | queue sim/emu | infer sim/emu |", "|" + "---|" * 12]
    for pol, g in df.groupby("policy", sort=False):
        e = g[g["mode"] == "emulation"].iloc[0]
        for _, s in g[g["mode"] != "emulation"].iterrows():
            lines.append(f"| {pol} | {s['mode']} | {s.success_ratio} | {e.success_ratio} | "
                         f"{(e.success_ratio or 0) - (s.success_ratio or 0):+.3f} | {s.e2e_p50_ms} | "
                         f"{e.e2e_p50_ms} | {s.e2e_p95_ms} | {e.e2e_p95_ms} | {s.network_ms}/{e.network_ms} | "
                         f"{s.queueing_ms}/{e.queueing_ms} | {s.inference_ms}/{e.inference_ms} |")
    (out / "agreement.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
