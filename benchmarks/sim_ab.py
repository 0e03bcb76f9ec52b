"""The simulator before and after a change, measured in one run: ``benchmarks/sim_bench.py`` of a
baseline revision (checked out in a temporary git worktree) and of this tree, alternately.

Run: ``.venv/bin/python benchmarks/sim_ab.py [--baseline 286614e] [--rounds 5] [--sim-seconds 20]``.
Prints each round's simulated q/s of both and the best of each (the least disturbed run on a shared
machine); the ratio after / before is what to quote. ``--instructions`` also counts the CPU
instructions per simulated query with valgrind's callgrind (the difference of a 2 s and an 8 s
simulation, so start-up cancels out): a figure other jobs on the machine do not disturb. Both
sides run this venv's Python, the same
scenario (``sim_bench.bench_plan``: 100-node Gabriel graph, 20 sources, 11 clusters) and the same
seed; the baseline uses its own simulator, plan and profiles code. The worktree borrows this tree's
built model zoo (``models/zoo``, git-ignored) through a symlink.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QPS = re.compile(r"-> ([0-9,]+) q/s")


def _bench(tree: Path, sim_seconds: float) -> float:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "benchmarks/sim_bench.py", "--no-simpy", "--sim-seconds", str(sim_seconds)],
                         cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    m = QPS.search(out)
    if m is None:
        raise RuntimeError(f"no q/s figure in the output of {tree}/benchmarks/sim_bench.py:\n{out}")
    return float(m.group(1).replace(",", ""))


def _instructions(tree: Path, sim_seconds: float) -> tuple[int, int]:
    """(queries, instructions) of one simulation under callgrind."""
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          "benchmarks/sim_bench.py", "--no-simpy", "--sim-seconds", str(sim_seconds)],
                         cwd=tree, env=env, capture_output=True, text=True, check=True)
    q = re.search(r"ours : (\d+) queries", out.stdout)
    ins = re.search(r"Collected : (\d+)", out.stderr)
    if q is None or ins is None:
        raise RuntimeError(f"cannot read callgrind's output for {tree}:\n{out.stderr[-2000:]}")
    return int(q.group(1)), int(ins.group(1))


def instructions_per_query(tree: Path) -> float:
    """CPU instructions per simulated query (8 s minus 2 s of simulation)."""
    q2, i2 = _instructions(tree, 2.0)
    q8, i8 = _instructions(tree, 8.0)
    return (i8 - i2) / (q8 - q2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="286614e", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sim-seconds", type=float, default=20.0)
    ap.add_argument("--instructions", action="store_true", help="also count instructions per query (valgrind)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sim-ab-") as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), a.baseline], cwd=REPO, check=True)
        try:
            (base / "models" / "zoo").symlink_to(REPO / "models" / "zoo")
            before, after = [], []
            for k in range(a.rounds):
                before.append(_bench(base, a.sim_seconds))
                after.append(_bench(REPO, a.sim_seconds))
                print(f"round {k + 1}: before {before[-1]:,.0f} q/s, after {after[-1]:,.0f} q/s", flush=True)
            if a.instructions:
                ib, ia = instructions_per_query(base), instructions_per_query(REPO)
                print(f"instructions per simulated query: before {ib:,.0f}, after {ia:,.0f} (after / before "
                      f"{ia / ib:.3f})")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=False)
    print(f"best of {a.rounds}: before ({a.baseline}) {max(before):,.0f} q/s, after {max(after):,.0f} q/s, "
          f"after / before = {max(after) / max(before):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
