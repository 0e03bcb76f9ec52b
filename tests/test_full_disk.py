"""``testbed simulate`` and ``testbed sweep`` on a full or unwritable disk: a clear message and exit
code 3 (as ``testbed run``), no traceback, and nothing half-written that looks like a finished run.

Real tmpfs mounts (root; skipped otherwise): a 4 MiB tmpfs filled up with one file (once
``OSError: [Errno 28]`` in ``write_run`` and in pyarrow, exit 1, a partial run directory left
behind), and a read-only one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")


@contextlib.contextmanager
def _tmpfs(path: Path, size: str, options: str = "", fill: bool = False):
    """A tmpfs of ``size`` at ``path``; ``fill``: a file takes every free byte."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(path)], check=True)
    try:
        if fill:
            subprocess.run(["dd", "if=/dev/zero", f"of={path / 'filler'}", "bs=64k"], capture_output=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _testbed(*args: str) -> tuple[int, str]:
    res = subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, cwd=REPO)
    return res.returncode, " ".join((res.stdout + res.stderr).split())  # the console wraps long lines


def test_simulate_on_a_full_disk_exits_3_and_leaves_no_run_directory(tmp_path):
    with _tmpfs(tmp_path / "full", "4m", fill=True) as full:
        code, out = _testbed("simulate", "experiments/triangle.yaml", "--runs-dir", str(full))
        assert code == 3, out
        assert "Traceback" not in out and "cannot write the simulated run" in out
        assert "No space left on device; nothing was left there" in out
        assert sorted(p.name for p in full.iterdir()) == ["filler"]  # no run directory, no partial copy


def test_simulate_into_a_read_only_runs_dir_exits_3(tmp_path):
    with _tmpfs(tmp_path / "ro", "1m", ",ro") as ro:
        code, out = _testbed("simulate", "experiments/triangle.yaml", "--runs-dir", str(ro / "runs"))
        assert code == 3 and "Traceback" not in out and "Read-only file system" in out, out


def test_sweep_on_a_full_disk_exits_3_with_no_results_that_look_complete(tmp_path):
    with _tmpfs(tmp_path / "full", "4m", fill=True) as full:
        code, out = _testbed("sweep", "experiments/triangle.yaml", "--policies", "closest", "--seeds", "1",
                             "--duration", "3s", "--out", str(full / "sweep"))
        assert code == 3, out
        assert "Traceback" not in out and "cannot write the sweep's results in" in out
        assert "No space left on device" in out
        left = sorted(p.name for p in (full / "sweep").rglob("*") if p.is_file())
        assert left == []  # no cell, no runs.csv or table.md, no temporary file


def test_a_kept_sweep_run_on_a_full_disk_is_not_left_half_written(tmp_path):
    """--keep-runs: the cell's run directory is the simulator's; it is written whole or not at all."""
    with _tmpfs(tmp_path / "full", "4m", fill=True) as full:
        code, out = _testbed("sweep", "experiments/triangle.yaml", "--policies", "closest", "--seeds", "1",
                             "--duration", "3s", "--keep-runs", "--out", str(full / "sweep"))
        assert code == 3 and "Traceback" not in out and "No space left on device" in out, out
        assert not list((full / "sweep").rglob("run.json")) and not list((full / "sweep").rglob("*.records.csv"))


def test_sweep_into_a_read_only_folder_exits_3_before_any_cell(tmp_path):
    with _tmpfs(tmp_path / "ro", "1m", ",ro") as ro:
        code, out = _testbed("sweep", "experiments/triangle.yaml", "--policies", "closest", "--seeds", "1",
                             "--duration", "3s", "--out", str(ro / "sweep"))
        assert code == 3 and "Traceback" not in out, out
        assert f"--out {ro / 'sweep'}: cannot create {ro / 'sweep'}: Read-only file system; nothing was run" in out
