#!/usr/bin/env python3
"""ASET against the best static policy on real packets, next to the simulator on the same arrivals.

    sudo nice -n 0 .venv/bin/python benchmarks/aset_emulation.py \\
        --scenarios experiments/scenario-hotspot.yaml,experiments/scenario-failure.yaml \\
        --seeds 1,2,3 --static min_latency --checkpoint models/aset/aset

For every scenario, seed and policy (``aset`` with the checkpoint, and the static one), the
scenario file is copied with ``seed`` and ``policy`` set and emulated with ``testbed run`` under
``flock /tmp/testbed-emulation.lock`` (runs queue behind other engineers' emulations); its
``summary.json`` gives the emulated success ratio. The simulator runs the same plan and seed
(same arrival streams, :mod:`testbed.arrivals`) through :class:`testbed.aset.episode.Episode`
(static) or :func:`testbed.aset.evaluate.aset_job` (ASET). Prints one Markdown row per (scenario,
policy): emulated mean and 95 % CI over the seeds, simulated, the gap, and the paired
difference ASET - static in each. Writes ``runs/aset-emulation/results.md``. Root needed.
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
from testbed.util import ci95, markdown_table  # noqa: E402

LOCK = "/tmp/testbed-emulation.lock"


def emulate(scenario: Path, seed: int, policy: str, checkpoint: str, runs_dir: Path) -> dict:
    """One emulated run; returns its summary (success ratio, queries) and run directory."""
    data = yaml.safe_load(scenario.read_text())
    data.update(seed=seed, policy=policy, name=f"{data['name']}-{policy.replace('_', '')}-s{seed}")
    if policy == "aset":
        data["aset"] = {"checkpoint": checkpoint, "window": "500ms"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=scenario.parent, delete=False) as f:
        yaml.safe_dump(data, f, sort_keys=False)
        tmp = Path(f.name)
    try:
        before = set(runs_dir.glob("*")) if runs_dir.is_dir() else set()
        subprocess.run(["flock", LOCK, str(REPO / ".venv/bin/testbed"), "run", str(tmp), "--runs-dir", str(runs_dir)],
                       check=False)
        new = sorted(set(runs_dir.glob("*")) - before)
    finally:
        tmp.unlink(missing_ok=True)
    if not new:
        return {"success_ratio": None, "run": None}
    summ = json.loads((new[-1] / "summary.json").read_text())
    return {"success_ratio": summ.get("success_ratio"), "queries": summ.get("queries"), "run": str(new[-1])}


def simulate(scenario: Path, seed: int, policy: str, checkpoint: str) -> float:
    from testbed.aset.evaluate import aset_job, static_job

    if policy == "aset":
        r = aset_job(str(scenario), seed, checkpoint, None)
        return r["ok"] / r["n"]
    ok, n = static_job(str(scenario), seed, [policy], None)[policy]
    return ok / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="experiments/scenario-hotspot.yaml,experiments/scenario-failure.yaml")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--static", default="min_latency", help="the best static policy of these scenarios")
    ap.add_argument("--checkpoint", default="models/aset/aset")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "aset-emulation")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, raw = [], []
    for sc in args.scenarios.split(","):
        path = (REPO / sc).resolve()
        res: dict[str, dict[int, tuple]] = {}
        for policy in ("aset", args.static):
            for k in seeds:
                emu = emulate(path, k, policy, args.checkpoint, args.runs_dir)
                sim = simulate(path, k, policy, args.checkpoint)
                res.setdefault(policy, {})[k] = (emu["success_ratio"], sim)
                raw.append({"scenario": path.stem, "policy": policy, "seed": k, **emu, "simulated": sim})
        for policy, by in res.items():
            e = [v[0] for v in by.values() if v[0] is not None]
            s = [v[1] for v in by.values()]
            me, he = ci95(e)
            ms, hs = ci95(s)
            rows.append({"scenario": path.stem, "policy": policy, "emulated %": f"{100 * me:.2f} ± {100 * he:.2f}",
                         "simulated %": f"{100 * ms:.2f} ± {100 * hs:.2f}", "gap (pts)": f"{100 * (me - ms):+.2f}"})
        d_emu = ci95([res["aset"][k][0] - res[args.static][k][0] for k in seeds
                      if res["aset"][k][0] is not None and res[args.static][k][0] is not None])
        d_sim = ci95([res["aset"][k][1] - res[args.static][k][1] for k in seeds])
        rows.append({"scenario": path.stem, "policy": f"aset - {args.static}",
                     "emulated %": f"{100 * d_emu[0]:+.2f} ± {100 * d_emu[1]:.2f}",
                     "simulated %": f"{100 * d_sim[0]:+.2f} ± {100 * d_sim[1]:.2f}", "gap (pts)": ""})
    text = markdown_table(rows)
    print(text)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    (args.runs_dir / "results.md").write_text(text)
    (args.runs_dir / "results.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
