"""README's first command on a fresh clone, timed: what a newcomer waits for before the first result.

    sudo .venv/bin/python benchmarks/newcomer.py [--keep] [--work /tmp]

Clones this checkout's HEAD into a new folder (``git clone``: committed files only, no venv, no zoo),
then runs README's first command there, as README gives it, in its two steps: ``./install.sh``
(the Debian packages already present are skipped; the venv, from requirements.lock with no pip
cache, and the model zoo are built) and ``.venv/bin/testbed run experiments/default.yaml``. Writes
``benchmarks/results/newcomer.json`` (:mod:`benchmarks.resultfile`): the install's and the run's
wall time, their exit codes, the run's queries and success ratio. The clone is removed unless
``--keep``. Needs root (the run emulates) and Open vSwitch running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.resultfile import REPO, write_result  # noqa: E402

#: README's first command, in its two steps (README.md: `sudo ./install.sh && sudo .venv/bin/testbed run ...`).
STEPS = (("install", ["./install.sh"]), ("run", [".venv/bin/testbed", "run", "experiments/default.yaml"]))


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    """Run ``cmd`` in ``cwd`` with its output to ``log``; (exit code, wall seconds)."""
    t = time.monotonic()
    with log.open("w") as f:
        code = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    return code, time.monotonic() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()), help="where the clone goes")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its logs are in it)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="newcomer.", dir=args.work))
    clone = work / "aset-testbed"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    rows, ok = [], True
    try:
        for name, cmd in STEPS:
            code, wall = timed(cmd, clone, work / f"{name}.log")
            rows.append([name, " ".join(cmd), code, round(wall, 1)])
            print(f"{name}: exit {code} in {wall:.1f} s (log {work / f'{name}.log'})", flush=True)
            if code != 0:
                ok = False
                break
        summary = {}
        runs = sorted((clone / "runs").glob("*default*/summary.json"))
        if runs:
            s = json.loads(runs[-1].read_text())
            summary = {"queries": s.get("queries"), "success_ratio": s.get("success_ratio")}
        total = sum(r[3] for r in rows)
        write_result(
            "newcomer", "README's first command on a fresh clone",
            "sudo .venv/bin/python benchmarks/newcomer.py",
            [{"caption": "wall time per step (s)", "columns": ["step", "command", "exit", "wall s"], "rows": rows}],
            summary=(f"{'Done' if ok else 'FAILED'} in {total:.0f} s ({total / 60:.1f} min; target <= 5 min): "
                     f"{summary.get('queries', '-')} queries, success {summary.get('success_ratio', '-')}."),
            notes=["The clone has no venv and no zoo; Debian packages already installed are not counted."])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
