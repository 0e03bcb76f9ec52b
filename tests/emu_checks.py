"""Shared checks of the emulation tests (imported by them; pytest puts ``tests/`` on ``sys.path``).

A run's wall-clock figures on a machine other jobs keep saturated measure the machine:
:func:`assert_unless_saturated` skips a failed check then, with the figures.

An emulation refuses to measure (exit 3, :data:`testbed.core.errors.EXIT_BRINGUP`) when its RTT
self-check finds a path outside its tolerance (``rtt_check.csv`` keeps every path's figures), or when
its speed calibration finds the host's model calls too slow for a cluster's threads at the run's
dilation: that is the testbed behaving as designed. On a machine other jobs keep busy the paths
measure *slower* than planned and the calls run slower (a busy host only adds time), so a test whose
subject is neither check skips with those figures; a path measured faster than planned, or any other
exit, fails it.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from testbed.core.errors import EXIT_BRINGUP


def _newest_run(runs_dir: Path) -> Path | None:
    runs = sorted((p for p in runs_dir.glob("*/run.json")), key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else None


#: What the speed calibration's refusal says when the host's bare model calls are slower than their
#: profiles by more than a cluster's threads can make up at the run's dilation
#: (:func:`testbed.plan.speeds.check_fits`).
SLOW_MODELS = "slower than their profiles"


def host_too_slow(run_dir: Path) -> str:
    """Why ``run_dir``'s run was refused because the host was too busy, or "" when it was not:
    its RTT self-check with every failing path measured slower than planned (ms, from
    ``rtt_check.csv``), or its speed calibration with the models' bare calls too slow for the
    cluster's threads at the run's dilation (another refusal, a path faster than planned, no
    failing path: "")."""
    rec = json.loads((run_dir / "run.json").read_text())
    check = run_dir / "rtt_check.csv"
    message = str(rec.get("message", ""))
    if rec.get("exit_code") == EXIT_BRINGUP and SLOW_MODELS in message and "more than its threads can use" in message:
        return f"the run's speed calibration refused it: the host's bare model calls were too slow ({message})"
    if rec.get("exit_code") != EXIT_BRINGUP or not message.startswith("RTT self-check failed") or not check.exists():
        return ""
    with open(check, newline="") as f:
        bad = [r for r in csv.DictReader(f) if r["ok"] != "1"]
    if not bad or any(not float(r["median_rtt_ms"]) > float(r["expected_rtt_ms"]) for r in bad):
        return ""  # a path faster than planned, or one that answered nothing (nan), is no busy host
    worst = max(bad, key=lambda r: float(r["median_rtt_ms"]) / max(float(r["expected_rtt_ms"]), 1e-9))
    return (f"the run's RTT self-check refused it: {len(bad)} path(s) measured slower than planned, e.g. "
            f"{worst['source']} -> {worst['cluster']} {float(worst['median_rtt_ms']):.2f} ms vs "
            f"{float(worst['expected_rtt_ms']):.2f} ms expected (tolerance {float(worst['tolerance_ms']):.2f} ms): "
            f"the host was too busy to emulate the delays ({run_dir / 'rtt_check.csv'})")


def expect_run_ok(code: int, runs_dir: Path | None = None, run_dir: Path | None = None) -> None:
    """Assert an emulation exited 0; skip when its RTT self-check refused it because the host was
    too busy (:func:`host_too_slow`). ``run_dir``, or the newest run under ``runs_dir``."""
    if code == 0:
        return
    where = run_dir if run_dir is not None else (_newest_run(runs_dir) if runs_dir is not None else None)
    why = host_too_slow(where) if where is not None and (where / "run.json").exists() else ""
    if why:
        pytest.skip(why)
    raise AssertionError(f"the emulation exited {code} (run: {where})")


def assert_unless_saturated(run_dir: Path, checks: dict[str, bool], figures: str) -> None:
    """The checks of an emulation that hold only with CPU to spare (a packet train, or a call's wall
    time, read back on a saturated machine measures the machine): a failed one skips with the
    run's ``figures`` when the run's own CPU sampler (``summary.json`` ``machine_cpu``) saw the
    CPUs at least 90 % busy for over 1 s of the load, and fails otherwise."""
    failed = [name for name, ok in checks.items() if not ok]
    if not failed:
        return
    cpu = json.loads((run_dir / "summary.json").read_text()).get("machine_cpu") or {}
    if cpu.get("saturated_s", 0.0) > 1.0:
        pytest.skip(f"not met: {'; '.join(failed)} ({figures}), while the CPUs were at least 90 % busy for "
                    f"{cpu['saturated_s']:g} s of the {cpu.get('window_s', 0):g} s load (the run's machine_cpu)")
    raise AssertionError(f"not met: {'; '.join(failed)} ({figures})")


def run_triangle(tmp_path: Path, **top) -> tuple[int, Path]:
    """experiments/triangle.yaml with the top-level keys of ``top`` (:func:`triangle_inputs.triangle_data`)
    emulated for real into ``tmp_path/runs``: the exit code and the run folder."""
    from triangle_inputs import triangle_data, write_data

    from testbed.plan.build import plan_experiment
    from testbed.results.runs import run_emulation

    plan = plan_experiment(write_data(tmp_path, "triangle.yaml", triangle_data(**top)))
    runs = tmp_path / "runs"
    code = run_emulation(plan, runs_dir=runs)
    return code, next(runs.iterdir())


def cgroups_usable() -> bool:
    """True as root on a machine with a cgroup cpu controller (a CFS quota can be set)."""
    from testbed.core import cgroups

    try:
        cgroups.cgroup_version()
    except cgroups.CgroupError:
        return False
    return os.geteuid() == 0
