#!/usr/bin/env python3
"""ASET against the best static policy on real packets, next to the simulator on the same arrivals.

    sudo nice -n 0 .venv/bin/python benchmarks/aset_emulation.py \\
        --scenarios experiments/scenario-hotspot.yaml,experiments/scenario-failure.yaml \\
        --seeds 1,2,3 --static min_latency --checkpoint models/aset/aset

For every scenario, seed and policy (``aset`` with the checkpoint, and the static one), the
scenario file is copied with ``seed`` and ``policy`` set and emulated with ``testbed run`` under
``flock /tmp/testbed-emulation.lock`` (runs queue behind other engineers' emulations); its
``summary.json`` gives the emulated success ratio. The simulator runs the same plan and seed
(same arrival streams, :mod:`testbed.model.arrivals`) through :class:`testbed.aset.episode.Episode`
(static) or :func:`testbed.aset.jobs.agent_job` (ASET, the loop of testbed simulate). Prints one
Markdown row per (scenario, policy): emulated mean and 95 % CI over the seeds, simulated, the gap, the paired
difference ASET - static in each, and how busy (or stolen) the machine's CPUs were during the emulated loads
(range over the seeds; ``machine_cpu`` of the summary, :mod:`testbed.emu.machine`).
Writes ``runs/aset-emulation/results.md``. Root needed.

Where the gap comes from: every static run is also simulated with records
(:func:`testbed.results.runs.run_simulation`, into ``<runs-dir>/sim/``), and a second table gives,
per scenario and application, the medians over the answered queries (new connections included), emulated
against simulated: network time minus the planned RTT, queueing, inference, end to end, and the
success ratio. A third table sets the simulator's ``simulation.overhead_ms`` (a calibration knob,
not the model) to the measured excess of network time and says how much of the gap is left.
``--load-scale F`` runs every scenario with its arrival rates x F in both engines
(is the gap the 2-core host's load?). ``--tables-only`` rebuilds both tables from an earlier ``results.json`` (no
emulation; no root).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from testbed.core.util import ci95, markdown_table  # noqa: E402
from testbed.results.summary import answered  # noqa: E402

LOCK = "/tmp/testbed-emulation.lock"


def scaled_copy(scenario: Path, factor: float) -> Path:
    """The scenario with every arrival rate x ``factor`` (:func:`testbed.aset.scenarios.scale_rates`),
    as ``.bench-<stem>-x<factor>.yaml`` beside it (its relative paths keep working; git ignores
    it), named ``<name>-x<factor>`` inside, for both the emulation and the simulator; ``scenario`` itself at 1."""
    from testbed.aset.scenarios import scale_rates

    if factor == 1.0:
        return scenario
    data = yaml.safe_load(scenario.read_text())
    data["workload"] = scale_rates(data["workload"], factor)
    data["aset"] = {**(data.get("aset") or {}), "plan": data["name"]}  # a checkpoint's plan: the scenario's
    data["name"] = f"{data['name']}-x{factor:g}"
    path = scenario.parent / f".bench-{scenario.stem}-x{factor:g}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _general(checkpoint: str) -> bool:
    """Whether the checkpoint observes no plan (``general``, ``gated``): its features have no plans."""
    from testbed.agent.checkpoint import read_checkpoint

    return (read_checkpoint(REPO / checkpoint).features.get("observation") or {}).get("plans") is None


def _aset_section(data: dict, checkpoint: str) -> dict:
    """``aset:`` of a copy driven by ``checkpoint``: the general agent needs no plan; a plan-based
    one keeps the scenario's (its name is changed by the copy)."""
    if _general(checkpoint):
        return {"checkpoint": checkpoint, "window": "500ms"}
    return {"checkpoint": checkpoint, "window": "500ms", "plan": (data.get("aset") or {}).get("plan") or data["name"]}


def duration_copy(scenario: Path, duration: str) -> Path:
    """The scenario with its load lasting ``duration`` (e.g. ``15s``) in both engines, beside it."""
    data = yaml.safe_load(scenario.read_text())
    data.pop("duration_s", None)
    data["duration"] = duration
    path = scenario.parent / f".bench-{scenario.stem}-d{duration}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def emulate(scenario: Path, seed: int, policy: str, checkpoint: str, runs_dir: Path,
            run_args: tuple[str, ...] = ()) -> dict:
    """One emulated run (``run_args``: more options of ``testbed run``, e.g. ``--time-dilation 2``);
    returns its summary (success ratio, queries) and run directory."""
    data = yaml.safe_load(scenario.read_text())
    aset = _aset_section(data, checkpoint)  # before the rename below
    data.update(seed=seed, policy=policy, name=f"{data['name']}-{policy.replace('_', '')}-s{seed}")
    if policy == "aset":
        data["aset"] = aset
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=scenario.parent, delete=False) as f:
        yaml.safe_dump(data, f, sort_keys=False)
        tmp = Path(f.name)
    try:
        before = set(runs_dir.glob("*")) if runs_dir.is_dir() else set()
        subprocess.run(["flock", LOCK, str(REPO / ".venv/bin/testbed"), "run", str(tmp), "--runs-dir", str(runs_dir),
                        *run_args], check=False)
        new = sorted(set(runs_dir.glob("*")) - before)
    finally:
        tmp.unlink(missing_ok=True)
    if not new or not (new[-1] / "summary.json").is_file():  # refused or failed: its run.json says why
        return {"success_ratio": None, "run": str(new[-1]) if new else None}
    summ = json.loads((new[-1] / "summary.json").read_text())
    m = summ.get("machine_cpu") or {}  # testbed.emu.machine: the CPUs over the load
    return {"success_ratio": summ.get("success_ratio"), "queries": summ.get("queries"), "run": str(new[-1]),
            "machine_busy": round(min(1.0, (m["busy_cores"] + m["steal_cores"]) / m["cpus"]), 3) if m else None,
            "testbed_cores": m.get("testbed_cores")}


def simulate(scenario: Path, seed: int, policy: str, checkpoint: str) -> float:
    from testbed.aset.jobs import agent_job, static_job
    from testbed.spec.experiment import AsetSpec

    if policy == "aset":  # the one loop of testbed simulate and testbed evaluate (the emulation's selector)
        aset = AsetSpec.model_validate(_aset_section(yaml.safe_load(scenario.read_text()), checkpoint))
        r = agent_job(str(scenario), seed, aset.model_dump_json(), None)
        return r["ok"] / r["n"]
    ok, n = static_job(str(scenario), seed, [policy], None)[policy]
    return ok / n


def simulate_records(scenario: Path, seed: int, policy: str, out: Path) -> Path:
    """The static run simulated with records, in the emulation's layout; returns its directory.

    An earlier run's directory is reused only if the same inputs made it: its name ends with the
    key of ``testbed evaluate``'s cache (:func:`testbed.aset.jobs.task_key`: the scenario
    file's content, its profiles, zoo manifest and topology, the package's code, seed and
    policy), so records of another scenario, configuration or code are never reused (simulated
    again, into their own directory), and only once complete (``summary.json``, written last)."""
    from testbed.aset.jobs import task_key
    from testbed.plan.build import plan_experiment
    from testbed.results.runs import run_simulation

    key = task_key(simulate_records, (str(scenario.resolve()), seed, policy))[:12]
    run_dir = out / f"{scenario.stem}-{policy.replace('_', '')}-s{seed}-sim-{key}"
    if not (run_dir / "summary.json").is_file():
        run_simulation(plan_experiment(scenario), seed=seed, policy=policy, run_dir=run_dir, quiet=True)
    return run_dir


#: The breakdown's columns: (label, records column or derived name), medians in ms.
_PARTS = (("network - plan RTT", "net_excess_ms"), ("queueing", "queueing_ms"), ("inference", "inference_ms"),
          ("e2e", "e2e_ms"))


def _records(run_dir: Path):
    import pandas as pd

    r = pd.read_parquet(run_dir / "records.parquet")
    ok = r["outcome"] == "success"
    return r.assign(success=ok.astype(float), net_excess_ms=r["network_ms"] - r["expected_rtt_ms"])


def breakdown_rows(frames: dict[str, tuple]) -> list[dict]:
    """Per (scenario, application): median ms of each part of :data:`_PARTS` over the answered
    queries of all the scenario's static runs, emulated / simulated, and the success
    ratio over every query. ``frames``: scenario -> (emulated records, simulated records)."""
    rows = []
    for sc, (ea, sa) in frames.items():
        for app in sorted(ea["application"].unique()):
            ee, ss = ea[ea["application"] == app], sa[sa["application"] == app]
            ew, sw = answered(ee), answered(ss)  # the rows of the summary's latency figures
            row = {"scenario": sc, "application": app, "queries emu / sim": f"{len(ee)} / {len(ss)}"}
            for label, col in _PARTS:
                row[f"{label} ms"] = f"{ew[col].median():.1f} / {sw[col].median():.1f}"
            row["success %"] = f"{100 * ee['success'].mean():.1f} / {100 * ss['success'].mean():.1f}"
            rows.append(row)
    return rows


def measured_overhead_ms(emu, sim) -> float:
    """Median network time minus planned RTT over the answered queries of the emulated
    records, minus the same over the simulated ones (all applications pooled): the per-query cost
    outside the simulator's network model (the endpoints' software, the user-space datapath under
    load), ms."""
    return float(answered(emu)["net_excess_ms"].median() - answered(sim)["net_excess_ms"].median())


def simulate_with_overhead(scenario: Path, seeds: list[int], policy: str, overhead_ms: float) -> list[float]:
    """Success ratios of the static policy in the simulator with ``simulation.overhead_ms`` set
    (:class:`testbed.spec.experiment.SimulationSpec`, a calibration knob outside the system model)."""
    from testbed.aset.episode import run_static
    from testbed.plan.build import build_plan
    from testbed.spec.experiment import load_experiment

    exp = load_experiment(scenario)
    data = exp.model_dump()
    data["simulation"]["overhead_ms"] = max(0.0, overhead_ms)
    plan = build_plan(type(exp).model_validate(data), base_dir=scenario.parent)
    srcs = len(plan.sources)
    return [run_static(plan, k, [policy] * srcs, None, None).success_ratio for k in seeds]


def calibration_rows(frames: dict[str, tuple], raw: list[dict], static: str) -> list[dict]:
    """Per scenario: the measured overhead, and the static policy emulated, simulated, and
    simulated with that overhead (how much of the gap it explains)."""
    rows = []
    for sc, (e, s) in frames.items():
        runs = [r for r in raw if r["scenario"] == sc and r["policy"] == static and _complete(r)]
        path = Path(runs[0].get("path") or REPO / "experiments" / f"{sc}.yaml")
        ov = measured_overhead_ms(e, s)
        cal = ci95(simulate_with_overhead(path, [r["seed"] for r in runs], static, ov))
        emu, sim = ci95([r["success_ratio"] for r in runs]), ci95([r["simulated"] for r in runs])
        rows.append({"scenario": sc, "policy": static, "overhead ms": f"{ov:.1f}",
                     "emulated %": f"{100 * emu[0]:.2f} ± {100 * emu[1]:.2f}",
                     "simulated %": f"{100 * sim[0]:.2f} ± {100 * sim[1]:.2f}",
                     "simulated + overhead %": f"{100 * cal[0]:.2f} ± {100 * cal[1]:.2f}",
                     "gap left (pts)": f"{100 * (emu[0] - cal[0]):+.2f}"})
    return rows


def _complete(r: dict) -> bool:
    """The raw row has both figures: the emulated run gave a success ratio (it may have failed
    or measured nothing) and the simulator one."""
    return r.get("success_ratio") is not None and r.get("simulated") is not None


def _seeds_cell(kept: list[int], left_out: list[int]) -> str:
    """The seeds a row is over, and those left out (a figure missing in one engine)."""
    text = ", ".join(map(str, kept)) or "none"
    if left_out:
        text += f" (left out, a figure missing: {', '.join(map(str, left_out))})"
    return text


def tables(raw: list[dict], static: str, runs_dir: Path) -> str:
    """Both Markdown tables (success per policy; the static runs' breakdown) from the raw rows.
    Every row compares the engines over the same seeds: those with a figure in both (and, for
    the paired difference, of both policies); the ``seeds`` column says which were left out."""
    rows, pairs = [], []
    for sc in dict.fromkeys(r["scenario"] for r in raw):
        mine = [r for r in raw if r["scenario"] == sc]
        res: dict[str, dict[int, tuple]] = {}
        for r in mine:
            res.setdefault(r["policy"], {})[r["seed"]] = (r["success_ratio"], r["simulated"])
            if r["policy"] == static and r.get("run") and _complete(r):
                path = Path(r.get("path") or REPO / "experiments" / f"{sc}.yaml")
                pairs.append((sc, Path(r["run"]), simulate_records(path, r["seed"], static, runs_dir / "sim")))
        done = {p: sorted(k for k, v in by.items() if v[0] is not None and v[1] is not None) for p, by in res.items()}
        for policy, by in res.items():
            kept = done[policy]
            me, he = ci95([by[k][0] for k in kept])
            ms, hs = ci95([by[k][1] for k in kept])
            busy = [r["machine_busy"] for r in mine if r["policy"] == policy and r.get("machine_busy") is not None]
            rows.append({"scenario": sc, "policy": policy, "seeds": _seeds_cell(kept, sorted(set(by) - set(kept))),
                         "emulated %": f"{100 * me:.2f} ± {100 * he:.2f}",
                         "simulated %": f"{100 * ms:.2f} ± {100 * hs:.2f}", "gap (pts)": f"{100 * (me - ms):+.2f}",
                         "CPUs busy % (emulation)": f"{100 * min(busy):.0f}-{100 * max(busy):.0f}" if busy else "-"})
        if "aset" in res and static in res:
            a, b = res["aset"], res[static]
            kept = sorted(set(done["aset"]) & set(done[static]))
            d_emu = ci95([a[k][0] - b[k][0] for k in kept])
            d_sim = ci95([a[k][1] - b[k][1] for k in kept])
            rows.append({"scenario": sc, "policy": f"aset - {static}",
                         "seeds": _seeds_cell(kept, sorted((set(a) | set(b)) - set(kept))),
                         "emulated %": f"{100 * d_emu[0]:+.2f} ± {100 * d_emu[1]:.2f}",
                         "simulated %": f"{100 * d_sim[0]:+.2f} ± {100 * d_sim[1]:.2f}", "gap (pts)": "",
                         "CPUs busy % (emulation)": ""})
    text = markdown_table(rows)
    if pairs:
        import pandas as pd

        frames = {sc: tuple(pd.concat([_records(p[i]) for p in pairs if p[0] == sc]) for i in (1, 2))
                  for sc in dict.fromkeys(p[0] for p in pairs)}  # every records file read once
        text += (f"\n\nWhere the gap comes from ({static} runs, every seed with both figures; median ms over "
                 f"the answered queries, emulated / simulated):\n\n"
                 + markdown_table(breakdown_rows(frames)))
        text += ("\n\nHow much of the gap the per-query overhead explains (overhead = the emulated median of "
                 "network time - planned RTT minus the simulated one, every application; the simulator rerun "
                 "with simulation.overhead_ms set to it):\n\n" + markdown_table(calibration_rows(frames, raw, static)))
    return text


def run_all(args: argparse.Namespace) -> list[dict]:
    """Every (scenario, policy, seed): emulated, then simulated; one raw row each."""
    raw = []
    for sc in args.scenarios.split(","):
        path = scaled_copy((REPO / sc).resolve(), args.load_scale)
        if args.duration:
            path = duration_copy(path, args.duration)
        run_args = ("--time-dilation", args.time_dilation) if args.time_dilation else ()
        for policy in ("aset", args.static):
            for k in [int(s) for s in args.seeds.split(",")]:
                ckpt = args.checkpoint.replace("{stem}", Path(sc).stem)  # a checkpoint per scenario
                emu = emulate(path, k, policy, ckpt, args.runs_dir, run_args)
                sim = simulate(path, k, policy, ckpt)
                raw.append({"scenario": (REPO / sc).stem, "load_scale": args.load_scale, "path": str(path),
                            "policy": policy, "seed": k, **emu, "simulated": sim})
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="experiments/scenario-hotspot.yaml,experiments/scenario-failure.yaml")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--static", default="min_latency", help="the best static policy of these scenarios")
    ap.add_argument("--checkpoint", default="models/aset/aset",
                    help="the agent's checkpoint; {stem} stands for each scenario's file stem (testbed specialize's)")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "aset-emulation")
    ap.add_argument("--load-scale", type=float, default=1.0,
                    help="every arrival rate x this, in the emulation and the simulator alike")
    ap.add_argument("--time-dilation", default=None, help="testbed run --time-dilation K|auto for every emulated run")
    ap.add_argument("--duration", default=None, help="the load's duration in both engines, e.g. 15s (default: "
                                                      "the scenario's)")
    ap.add_argument("--tables-only", action="store_true",
                    help="rebuild the tables from <runs-dir>/results.json (no emulation)")
    args = ap.parse_args(argv)
    from testbed.model.policies import CATALOGUE

    if args.static not in CATALOGUE:
        ap.error(f"--static {args.static!r}: not a policy (known: {', '.join(CATALOGUE)})")
    if args.tables_only:
        src = args.runs_dir / "results.json"
        try:
            raw = json.loads(src.read_text())
        except (OSError, ValueError) as exc:
            ap.error(f"--tables-only: cannot read {src}: {exc}")
        if not isinstance(raw, list) or not any(isinstance(r, dict) and r.get("policy") == args.static for r in raw):
            ap.error(f"--tables-only: {src} has no rows of --static {args.static!r}: nothing to tabulate")
    else:
        raw = run_all(args)
    text = tables(raw, args.static, args.runs_dir)
    print(text)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    (args.runs_dir / "results.md").write_text(text + "\n")
    (args.runs_dir / "results.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
