"""Clusters at their profile's speed in a real emulation (Mininet, OVS, ryu-manager, inference
servers): the triangle with ``emulation.speed: profile`` (the default), random dispatch and
digits_large served at both clusters, so that queries reach every (cluster, model). Each server
times its models' bare calls, the run scales each cluster's quota and pads its calls (0.5 cores:
below one core), and the calls then take what the profile says whatever the host's speed of the
day: the measured inference_ms median of each (cluster, model) whose profiled call takes at least
1 ms is within 10 % of the simulator's on the same plan and seed, run 20 x as long (the profile's samples, x each
model's residual factor: testbed.plan.speeds.apply_speeds). A shorter call (digits_small, 0.3 ms)
is mostly TensorFlow's per-call overhead, which the bare call's speed does not measure (the
host-speed check leaves such models out for the same reason): its figures are reported, not held
to the bound.

On a busy host a call waits for the CPU (other processes, or the hypervisor's steal time, which a
guest's CPU sampler does not see as busy), or takes more CPU than the server's speed check measured
at start-up from back-to-back calls (the busy machine shares its caches, memory bandwidth and
cores; a call after an idle gap can cost a host more than it cost the profile's), and the pad
(k / s - 1) x its CPU time (no further than its target) comes on top: the server counts a call beyond 10 % of its target
as late (testbed.serve.scheduler.pad_work). When most calls of a held (cluster, model) were late,
its median is beyond the bound before any pad and no pad can bring it back: the test skips and says
so, with the calls' CPU and wall time (more than a quarter late: LATE_SHARE). Root only, marked ``emulation``; run
under ``flock /tmp/emu.lock``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from emu_checks import assert_unless_saturated, expect_run_ok

from testbed.plan.build import build_plan
from testbed.plan.speeds import apply_speeds, read_speeds
from testbed.results.runs import run_emulation, run_simulation
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
#: Load (s): about 30 queries per (cluster, model) at the triangle's 8 q/s over four options.
DURATION_S = 15.0
#: The simulator's run (s) on the same plan: the median of its profile's draws over 30 calls is
#: within about 4 % of the model's (the profile's samples are skewed); over 20 x as many, the
#: emulated median is held to the model's, not to one seed's draws.
SIM_DURATION_S = 20 * DURATION_S
#: The bound on each (cluster, model)'s inference_ms median against the simulator's (relative).
BOUND = 0.10
#: Calls held to the bound: those the profile times at this many ms or more.
LEAST_CALL_MS = 1.0
#: Above this share of late calls (a call beyond 10 % of its target: testbed.serve.scheduler.pad_work,
#: LATE_TOLERANCE, the bound) the host could not reach the profile and the median says so. Not 0.5:
#: the calls that were not late but ran past their target (up to 10 % beyond it, unpadded) are the
#: same host's slowness, and with nearly half the calls late the median call is one of them, at the
#: bound's edge (11 of 24 late: +11.4 %). At a quarter late the median is the non-late calls' 67th
#: percentile, which a padded call holds at its target; a wrong scale or pad still fails the test.
LATE_SHARE = 0.25

pytestmark = [pytest.mark.emulation, pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")]


def _triangle_every_option():
    """The triangle with random dispatch and digits_large at both clusters: queries reach every
    (cluster, model)."""
    exp = yaml.safe_load(TRIANGLE.read_text())
    exp["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    exp["policy"] = "random"
    exp["clusters"][0]["models"] = ["digits_small", "digits_large"]
    return build_plan(Experiment.model_validate(exp), base_dir=TRIANGLE.parent)


def test_triangle_runs_at_its_profiles_speed(tmp_path):
    plan = _triangle_every_option()
    assert plan.experiment.emulation.speed == "profile"  # the default
    expect_run_ok(run_emulation(plan, runs_dir=tmp_path / "emu", duration_s=DURATION_S), tmp_path / "emu")
    run_dir = next((tmp_path / "emu").iterdir())
    speeds = read_speeds(run_dir)
    assert speeds is not None and speeds.mode == "profile" and set(speeds.clusters) == {"edgeb", "edgec"}
    slow = speeds.warnings()
    if slow:  # a thread cannot run faster than one core: undilated, the calls run at the host's speed
        pytest.skip(f"this host is slower than the profiles and k = 1 cannot make it up: {' '.join(slow)}")
    for c, cs in speeds.clusters.items():
        # the server's own figures, as the run applied them: quota 0.5 x s, its calls padded to k / s
        ready = json.loads((run_dir / "clusters" / f"{c}.ready.json").read_text())
        assert ready["speed"] == cs.model_dump(mode="json")
        assert cs.handling_factor is None  # at the profile's speed the quota follows the handling
        assert cs.applied_by in ("pad", "none") and cs.quota_cores == pytest.approx(0.5 * cs.scale)
        assert cs.scale == pytest.approx(cs.factor) and set(cs.models) == set(plan.services[c])
        for ms in cs.models.values():
            assert ms.calls >= 10 and ms.factor == pytest.approx(ms.bare_ms / ms.profile_ms)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["speeds"] == speeds.model_dump(mode="json")
    emu = pd.read_csv(run_dir / "records.csv")
    _, _ = run_simulation(apply_speeds(plan, speeds), runs_dir=tmp_path / "sim", duration_s=SIM_DURATION_S, quiet=True)
    sim = pd.read_csv(next((tmp_path / "sim").iterdir()) / "records.csv")
    med = {name: df[df["http_status"] == 200].groupby(["cluster", "model"])["inference_ms"].median()
           for name, df in (("emu", emu), ("sim", sim))}
    pairs = sorted(set(med["sim"].index))
    assert len(pairs) == 4, pairs  # random dispatch reaches every option
    held = [(c, m) for c, m in pairs if speeds.clusters[c].models[m].profile_ms >= LEAST_CALL_MS]
    assert {m for _, m in held} == {"digits_large"} and len(held) == 2
    pads = {c: json.loads((run_dir / "clusters" / f"{c}.stats.json").read_text())["per_model"] for c in speeds.clusters}
    figures = "; ".join(f"{c}/{m} emulated {med['emu'].get((c, m), float('nan')):.3f} ms against "
                        f"{med['sim'][(c, m)]:.3f} ms simulated (factor {speeds.clusters[c].models[m].factor:.2f}, "
                        f"{_pad_figures(pads[c][m])}{'' if (c, m) in held else ', not held to the bound'})"
                        for c, m in pairs)
    print(f"speed figures: {figures}")  # with -s: the figures of a run that passed too
    late = {(c, m): _late_share(pads[c][m]) for c, m in held}
    if any(v > LATE_SHARE for v in late.values()):  # the median call ran slower than the profile before any pad
        pytest.skip("the host could not run the calls at the profile's speed: "
                    + ", ".join(f"{c}/{m} {v:.0%} of its calls ran beyond 10 % of their target"
                                for (c, m), v in late.items() if v > LATE_SHARE)
                    + " (they waited for the CPU, or took more CPU than the server's speed check measured at "
                    + "start-up from back-to-back calls: a busy machine, or calls between idle gaps that cost this "
                    + f"host more than they cost the profile's; the run's summary warns of it; {figures})")
    assert_unless_saturated(run_dir, {
        f"{c}/{m}'s inference_ms median within {BOUND:.0%} of the profile's":
            abs(med["emu"].get((c, m), float("inf")) / med["sim"][(c, m)] - 1) <= BOUND for c, m in held}, figures)


def _late_share(pm: dict) -> float:
    """The share of a (cluster, model)'s calls that were late (the server's ``per_model`` counters,
    testbed.serve.scheduler.pad_work); 0 when none was timed."""
    return pm.get("late", 0) / pm["timed"] if pm.get("timed") else 0.0


def _pad_figures(pm: dict) -> str:
    n = pm.get("timed", 0)
    if not n:
        return "no call timed"
    return (f"{pm['late']}/{n} calls late, CPU {1e3 * pm['cpu_s'] / n:.3f} ms and wall before the pad "
            f"{1e3 * pm['unpadded_s'] / n:.3f} ms per call")
