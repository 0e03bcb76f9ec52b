"""Clusters at their profile's speed (testbed.plan.speeds): the rule that scales a cluster's quota
and its calls' speed from the host's bare calls, the figures a run keeps, and the simulator taking
them. Pure logic, a fake model for the server's timer, and (root, cgroup v1) the kernel taking the
scaled quota and caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import SpinModel

from testbed.core import cgroups
from testbed.core.errors import InputError, RunFailure
from testbed.plan.boundaries import ServerConfig
from testbed.plan.build import build_plan, plan_experiment
from testbed.plan.dilation import dilate, with_time_dilation
from testbed.plan.resolved import PlanError
from testbed.plan.speeds import (
    TOLERANCE,
    ClusterSpeed,
    Speeds,
    SpeedTarget,
    apply_speeds,
    check_fits,
    cluster_speed,
    expected_weights,
    needed_dilation,
    read_speeds,
    speed_target,
)
from testbed.serve import speed as server_speed
from testbed.serve.scheduler import Job
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _target(profile_ms: dict[str, float], weights: dict[str, float] | None = None, k: float = 1.0,
            nested: bool = False, mode: str = "profile", workers: int = 1, threads: int = 1) -> SpeedTarget:
    weights = weights if weights is not None else dict.fromkeys(profile_ms, 1.0)
    return SpeedTarget(mode=mode, time_dilation=k, nested=nested, workers=workers, threads=threads,
                       profile_ms=profile_ms, weights=weights)


# ----------------------------------------------------------------------------- the rule

def test_a_faster_host_gets_less_quota_and_its_calls_padded_to_the_profile():
    cs = cluster_speed(_target({"m": 2.0}), 0.5, {"m": 1.6})  # the host runs m at 0.8x its profile
    assert cs.factor == pytest.approx(0.8) and cs.scale == cs.call_scale == pytest.approx(0.8)
    assert cs.quota_cores == pytest.approx(0.4)  # 0.5 core x 0.8: the same calls per second as profiled
    assert cs.models["m"].residual == pytest.approx(1.0)
    # below one core: each call's CPU time (0.8 x the profile's) padded to k / s = 1.25 x it, the profile's
    assert cs.applied_by == "pad" and cs.cpu_pad == pytest.approx(0.25)
    assert 1.6 * (1 + cs.cpu_pad) == pytest.approx(2.0)


def test_a_slower_host_gets_more_quota_and_dilation_holds_its_calls_to_the_profile():
    cs = cluster_speed(_target({"m": 2.0}, k=2.0), 0.5, {"m": 2.6})  # 1.3x slower, k = 2
    assert cs.scale == cs.call_scale == pytest.approx(1.3) and cs.quota_cores == pytest.approx(0.65)
    assert cs.slowdown == pytest.approx(2.0 / 1.3) and cs.cpu_pad == pytest.approx(2.0 / 1.3 - 1)
    assert cs.fits(2) and not cs.calls_slow and cs.models["m"].residual == pytest.approx(1.0)
    check_fits("c", cs, 2)  # no error


def test_a_host_too_slow_for_the_dilation_gets_the_quota_and_says_its_calls_are_slow():
    cs = cluster_speed(_target({"m": 2.0}), 0.5, {"m": 2.6})  # 1.3x slower at k = 1
    # the quota keeps the profile's throughput; a call cannot run faster than one core: host speed
    assert cs.scale == pytest.approx(1.3) and cs.quota_cores == pytest.approx(0.65) and cs.call_scale == 1.0
    assert cs.applied_by == "none" and cs.cpu_pad == 0.0 and cs.fits(2) and cs.calls_slow
    assert cs.residual == pytest.approx(1.3) and cs.models["m"].residual == pytest.approx(1.3)
    check_fits("c", cs, 2)  # 0.65 cores: its thread can use them
    (w,) = Speeds(mode="profile", time_dilation=1.0, clusters={"c": cs}).warnings()
    assert "cluster c's calls ran 1.30x slower" in w and "--time-dilation 1.3 or more" in w
    assert needed_dilation(1.3) == pytest.approx(1.3) and needed_dilation(1.31) == pytest.approx(1.4)
    # within the tolerance: not called slow
    near = cluster_speed(_target({"m": 2.0}), 0.5, {"m": 2.0 * (1 + TOLERANCE / 2)})
    assert not near.calls_slow and near.models["m"].residual == pytest.approx(1 + TOLERANCE / 2)


def test_a_quota_the_clusters_threads_cannot_use_stops_the_run_naming_the_k_that_fits():
    # one core, one worker, one thread: 1.3 cores of quota, of which its thread can use 1
    cs = cluster_speed(_target({"m": 2.0}, nested=True), 1.0, {"m": 2.6})
    assert not cs.fits(2)
    with pytest.raises(RunFailure, match=r"cluster c: .*1\.30x slower.*--time-dilation 1\.3 .*speed: host") as exc:
        check_fits("c", cs, 2)
    assert exc.value.exit_code == 3
    # two workers can use it; at k = 2 one thread can too; at most the machine's CPUs
    assert cluster_speed(_target({"m": 2.0}, nested=True, workers=2), 1.0, {"m": 2.6}).fits(2)
    assert cluster_speed(_target({"m": 2.0}, k=2.0, nested=True), 1.0, {"m": 2.6}).fits(2)
    assert not cluster_speed(_target({"m": 2.0}, nested=True, workers=2), 1.0, {"m": 2.6}).fits(1)
    # speed: host asks nothing
    assert cluster_speed(_target({"m": 2.0}, nested=True, mode="host"), 1.0, {"m": 2.6}).fits(1)


def test_several_models_share_one_scale_weighted_by_their_expected_cpu():
    # a: 0.7x, b: 0.9x; b takes 3x the CPU a takes: s = (1 x 0.7 + 3 x 0.9) / 4 = 0.85
    cs = cluster_speed(_target({"a": 1.0, "b": 4.0}, weights={"a": 1.0, "b": 3.0}), 2.0, {"a": 0.7, "b": 3.6})
    assert cs.scale == pytest.approx(0.85) and cs.quota_cores == pytest.approx(1.7)
    assert cs.models["a"].residual == pytest.approx(0.7 / 0.85) and cs.models["b"].residual == pytest.approx(0.9 / 0.85)
    assert cs.models["a"].scale == cs.models["b"].scale == cs.scale
    # no expected load on any: equal weights
    eq = cluster_speed(_target({"a": 1.0, "b": 4.0}, weights={"a": 0.0, "b": 0.0}), 2.0, {"a": 0.7, "b": 3.6})
    assert eq.scale == pytest.approx(0.8)


def test_dilations_nested_caps_are_scaled_by_the_host_speed():
    # a cluster of 2 cores at k = 4 on a host 0.8x its profile: quota 1.6 cores per 400 ms, each
    # thread capped at 0.8 / 4 = 0.2 core (1 ms per 5 ms)
    cs = cluster_speed(_target({"m": 2.0}, k=4.0, nested=True), 2.0, {"m": 1.6})
    assert cs.applied_by == "caps" and cs.cpu_pad == 0.0
    assert cs.slowdown == pytest.approx(5.0) and cs.quota_cores == pytest.approx(1.6)
    # undilated, a faster host's threads are capped too (a burst within the quota must not run fast)
    cs1 = cluster_speed(_target({"m": 2.0}, nested=True), 1.0, {"m": 1.6})
    assert cs1.applied_by == "caps" and cs1.slowdown == pytest.approx(1.25)
    # at the profile's speed undilated: nothing to slow
    assert cluster_speed(_target({"m": 2.0}, nested=True), 1.0, {"m": 2.0}).applied_by == "none"


def test_speed_host_scales_nothing_and_keeps_the_factors_as_residuals():
    cs = cluster_speed(_target({"a": 1.0, "b": 2.0}, k=3.0, mode="host"), 0.5, {"a": 0.8, "b": 2.6})
    assert cs.scale == 1.0 and cs.quota_cores == 0.5 and cs.fits(1) and not cs.calls_slow
    assert cs.cpu_pad == pytest.approx(2.0)  # the dilation's own k - 1
    assert cs.models["a"].residual == pytest.approx(0.8) and cs.models["b"].residual == pytest.approx(1.3)


def test_the_rule_refuses_a_model_without_a_measurement():
    with pytest.raises(ValueError, match="no bare-call measurement of b"):
        cluster_speed(_target({"a": 1.0, "b": 2.0}), 1.0, {"a": 1.0})
    with pytest.raises(ValueError, match="finite and > 0"):
        cluster_speed(_target({"a": 1.0}), 1.0, {"a": 0.0})


# ----------------------------------------------------------------------------- from the plan

def test_the_triangles_weights_split_the_applications_rate_over_its_options():
    plan = plan_experiment(TRIANGLE)
    w = expected_weights(plan)
    # one application (digits, 4 q/s at each of 2 sources), three (cluster, model) options of its family
    for c, m in (("edgeb", "digits_small"), ("edgec", "digits_small"), ("edgec", "digits_large")):
        assert w[c][m] == pytest.approx(8.0 / 3 * plan.services[c][m].wall_mean_ms)
    t = speed_target(dilate(with_time_dilation(plan, 2.0)), "edgec")  # the same from the wall-clock plan
    assert t.mode == "profile" and t.time_dilation == 2.0 and not t.nested and t.threads == 1
    assert set(t.profile_ms) == {"digits_small", "digits_large"} and t.weights == w["edgec"]
    cfg = ServerConfig.from_plan(dilate(plan), "edgec", 0, None, t)
    assert ServerConfig.model_validate_json(cfg.model_dump_json()).speed == t
    # a paced call draws its target from the simulator's samples (emulated ms, the in-server factor
    # applied), over the profile's median: from the wall-clock plan too
    for m in t.profile_ms:
        assert t.draws[m] == pytest.approx([x / t.profile_ms[m] for x in plan.services["edgec"][m].samples_ms])
        # and the handling the model charges, in profile ms (not x k: the quota's CPU is not dilated)
        assert t.handling_ms[m] == plan.services["edgec"][m].handling_ms > 0
        assert t.answer_ms[m] == plan.services["edgec"][m].answer_ms


def test_a_padded_tensorflow_cluster_with_workers_is_refused_at_the_profiles_speed_undilated():
    exp = yaml.safe_load(TRIANGLE.read_text())
    exp["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    exp["clusters"][0]["workers"] = 2
    plan = build_plan(Experiment.model_validate(exp), base_dir=REPO / "experiments")
    with pytest.raises(PlanError, match=r"clusters\.edgeb: emulation\.speed: profile .*or set emulation\.speed: host"):
        dilate(plan)
    host = exp | {"emulation": {**exp["emulation"], "speed": "host"}}
    dilate(build_plan(Experiment.model_validate(host), base_dir=REPO / "experiments"))  # no pad: accepted


# ----------------------------------------------------------------------------- the run's figures

def _speeds(mode: str = "profile") -> Speeds:
    plan = plan_experiment(TRIANGLE)
    w = expected_weights(plan)
    clusters = {}
    for c, bare in (("edgeb", {"digits_small": 0.25}), ("edgec", {"digits_small": 0.25, "digits_large": 2.2})):
        t = speed_target(plan, c, weights=w).model_copy(update={"mode": mode})
        clusters[c] = cluster_speed(t, 0.5, bare)
    return Speeds(mode=mode, time_dilation=1.0, clusters=clusters)


def test_read_speeds_reads_run_json_and_says_when_there_are_none(tmp_path):
    assert read_speeds(tmp_path) is None
    (tmp_path / "run.json").write_text(json.dumps({"mode": "simulation"}))
    assert read_speeds(tmp_path) is None
    sp = _speeds()
    (tmp_path / "run.json").write_text(json.dumps({"mode": "emulation", "speeds": sp.model_dump(mode="json")}))
    assert read_speeds(tmp_path) == sp
    (tmp_path / "run.json").write_text(json.dumps({"speeds": {"mode": "fast"}}))
    with pytest.raises(ValueError, match=r"run\.json: 'speeds' is malformed"):
        read_speeds(tmp_path)
    line = sp.line()
    assert "edgec quota x" in line and "digits_large" in line and "residual" in line


@pytest.mark.parametrize("mode", ["profile", "host"])
def test_apply_speeds_scales_what_the_simulator_draws_by_the_residuals(mode):
    plan = plan_experiment(TRIANGLE)
    sp = _speeds(mode)
    out = apply_speeds(plan, sp)
    for c, by in plan.services.items():
        for m, f in by.items():
            r = sp.clusters[c].models[m].residual
            g = out.services[c][m]
            assert g.samples_ms == pytest.approx([x * r for x in f.samples_ms])
            assert g.batch_mean_ms[1] == pytest.approx(f.batch_mean_ms[1] * r)
            assert g.handling_ms == pytest.approx(f.handling_ms * sp.clusters[c].residual)
            # the estimates the run's sources and servers took from the plan stay the plan's
            assert (g.expected_ms, g.busy_mean_ms) == (f.expected_ms, f.busy_mean_ms)
    if mode == "host":  # the measured factors themselves
        large = sp.clusters["edgec"].models["digits_large"]
        assert large.residual == pytest.approx(2.2 / large.profile_ms) and large.scale == 1.0
    assert "residual speed factor" in out.notes[-1]


def test_the_handling_check_probes_the_cheapest_query_at_the_hosts_speed_once_per_cluster():
    t = _target({"big": 20.0, "small": 0.5}, mode="host").model_copy(
        update={"handling_ms": {"big": 0.3, "small": 1.2}})
    assert t.handling_probe() == "small"  # 1.7 ms a query against 20.3
    assert t.model_copy(update={"mode": "profile"}).handling_probe() is None  # the quota follows the handling
    assert t.model_copy(update={"measured_handling_factor": 2.0}).handling_probe() is None  # a later life
    assert t.model_copy(update={"handling_ms": {}}).handling_probe() is None  # no handling profile
    from testbed.serve.server import HANDLING_LEAST_QUERIES, handling_queries
    assert handling_queries(0.5, 0.1) == 500  # 0.25 s of handling
    assert handling_queries(1.5, 95.0) == HANDLING_LEAST_QUERIES  # 1 s of calls allows 10: the least


@pytest.mark.parametrize("mode", ["profile", "host"])
def test_the_twin_scales_the_handling_by_its_measured_factor(mode):
    plan = plan_experiment(TRIANGLE)
    sp = _speeds(mode)
    sp = sp.model_copy(update={"clusters": {**sp.clusters, "edgec": sp.clusters["edgec"].model_copy(
        update={"handling_factor": 8.0})}})
    assert Speeds.model_validate_json(sp.model_dump_json()) == sp
    out = apply_speeds(plan, sp)
    f, g = plan.services["edgec"]["digits_large"], out.services["edgec"]["digits_large"]
    # the handling's own factor, not the calls' (which still scale the calls)
    assert g.handling_ms == pytest.approx(f.handling_ms * 8.0)
    assert g.samples_ms == pytest.approx([x * sp.clusters["edgec"].models["digits_large"].residual
                                          for x in f.samples_ms])
    b = plan.services["edgeb"]["digits_small"]  # not measured: the cluster's residual
    assert out.services["edgeb"]["digits_small"].handling_ms == pytest.approx(b.handling_ms
                                                                               * sp.clusters["edgeb"].residual)
    assert "edgec quota" in sp.line() and "request handling 8.00x" in sp.line()
    assert "handling 8.000" in out.notes[-1]


def test_speeds_beyond_the_largest_factor_are_refused_by_the_check_and_in_run_json(tmp_path):
    with pytest.raises(ValueError, match=r"beyond the largest speed factor 1000"):
        cluster_speed(_target({"m": 0.001}), 0.5, {"m": 5.0})  # 5,000x
    sp = _speeds("host")
    doc = sp.model_dump(mode="json")
    doc["clusters"]["edgeb"]["handling_factor"] = 1e300  # a hand-edited run.json
    (tmp_path / "run.json").write_text(json.dumps({"mode": "emulation", "speeds": doc}))
    with pytest.raises(InputError, match=r"run\.json: 'speeds' is malformed: .*handling_factor"):
        read_speeds(tmp_path)


def test_apply_speeds_refuses_the_speeds_of_servers_with_another_runtime():
    plan = plan_experiment(TRIANGLE)
    sp = _speeds()
    edgec = sp.clusters["edgec"]
    other = edgec.models["digits_large"].model_copy(update={"profile_ms": edgec.models["digits_large"].profile_ms / 3})
    sp = sp.model_copy(update={"clusters": {**sp.clusters, "edgec": edgec.model_copy(
        update={"models": {**edgec.models, "digits_large": other}})}})
    with pytest.raises(PlanError, match=r"cluster 'edgec' hold 'digits_large' against a profiled call of .*\(another "
                                        r"runtime"):
        apply_speeds(plan, sp)


def test_apply_speeds_refuses_speeds_of_another_experiment():
    plan = plan_experiment(TRIANGLE)
    sp = _speeds()
    other = sp.model_copy(update={"clusters": {"edgeb": sp.clusters["edgeb"]}})
    with pytest.raises(PlanError, match="no cluster 'edgec'"):
        apply_speeds(plan, other)
    with pytest.raises(PlanError, match="emulated plan"):
        apply_speeds(dilate(with_time_dilation(plan, 2.0)), sp)


def test_simulate_takes_a_runs_speeds(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"mode": "emulation", "speeds": _speeds("host").model_dump(mode="json")}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "testbed.cli.main", "simulate", str(TRIANGLE), "--duration", "2s", "--runs-dir",
           str(tmp_path / "sims")]
    got = subprocess.run([*cmd, "--speeds", str(run)], capture_output=True, text=True, env=env, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    plan = json.loads(next((tmp_path / "sims").glob("*/plan.json")).read_text())
    r = _speeds("host").clusters["edgec"].models["digits_large"].residual
    assert f"x speed {r:.3f}" in plan["services"]["edgec"]["digits_large"]["source"]
    # said on the console, with the handling the run did not measure named as the calls' factor
    assert f"speeds of {run}: service samples x" in got.stdout and "(not measured: the calls' factor)" in got.stdout
    bad = subprocess.run([*cmd, "--speeds", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "no run.json there" in bad.stdout + bad.stderr
    file = subprocess.run([*cmd, "--speeds", str(run / "run.json")], capture_output=True, text=True, env=env,
                          timeout=300)  # the run's file names its folder
    assert file.returncode == 0 and f"speeds of {run / 'run.json'}: service samples x" in file.stdout, file.stderr
    empty = subprocess.run([*cmd, "--speeds", ""], capture_output=True, text=True, env=env, timeout=300)
    assert empty.returncode == 2 and "--speeds '': no run.json there" in empty.stdout + empty.stderr


# ----------------------------------------------------------------------------- the server's check

def test_the_servers_check_times_the_bare_call_in_cpu_time(monkeypatch):
    monkeypatch.setattr(server_speed.zoo, "load_manifest", lambda _z: {"variants": {"m": {"family": "f"}}})
    monkeypatch.setattr(server_speed.zoo, "load_payloads", lambda _z, _f: (np.zeros((4, 1)),))
    cs = server_speed.measure(_target({"m": 4.0}), 0.5, "zoo", {"m": SpinModel(2.0)})
    assert cs.models["m"].factor == pytest.approx(0.5, rel=0.1) and cs.models["m"].calls >= server_speed.LEAST_CALLS
    # a restarted server takes its first life's figures and times nothing
    again = server_speed.measure(_target({"m": 4.0}).model_copy(update={"measured_ms": {"m": 3.0}}), 0.5, "zoo", {})
    assert again.models["m"].factor == pytest.approx(0.75) and again.models["m"].calls == 0


# ----------------------------------------------------------------------------- the kernel takes it

@pytest.mark.skipif(os.geteuid() != 0 or not (cgroups.ROOT / "cpu" / "cpu.cfs_quota_us").exists(),
                    reason="needs root and cgroup v1's cpu controller")
def test_the_kernel_takes_the_scaled_quota_and_the_threads_caps():
    # one core at k = 1 on a host 0.84x its profile: quota 0.84 core, each thread capped at 0.84 core
    cs = cluster_speed(_target({"m": 1.0}, nested=True), 1.0, {"m": 0.84})
    dirs = cgroups.create_limited_group(f"testbed-speedtest-{os.getpid()}", 1.0, 256)
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    try:
        cgroups.add_process(dirs, p.pid)
        assert cgroups.set_cpu_quota(dirs, None) == -1  # no limit while the server times its calls
        assert (dirs[0] / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert cgroups.set_cpu_quota(dirs, cs.quota_cores) == 84_000
        cpu = dirs[0]
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "84000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert cgroups.cap_threads(dirs, p.pid, cs.slowdown) == 1
        child = cgroups.thread_groups(dirs)[0]
        quota, period = (int((child / f).read_text()) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        assert (quota, period) == (1000, 1191)  # rounded up: never above 0.84 core, nor the group's share
        assert quota / period <= cs.scale
    finally:
        p.communicate(b"\n", timeout=10)
        cgroups.remove_thread_groups(dirs)
        for d in dirs:
            d.rmdir()


def test_cluster_speed_json_round_trip():
    cs = cluster_speed(_target({"m": 2.0}, k=2.0), 0.5, {"m": 1.6}, {"m": 30})
    assert ClusterSpeed.model_validate_json(cs.model_dump_json()) == cs


def test_the_pad_is_added_to_the_work_and_a_wait_beyond_the_tolerance_is_late():
    """A padded piece of work sleeps pad x its CPU time after it, whatever it waited (a throttled
    quota's wait is the emulated system's own time); work that waited for the CPU beyond
    LATE_TOLERANCE of its target ((1 + pad) x its CPU time) is counted late."""
    from testbed.serve.scheduler import LATE_TOLERANCE, pad_counters, pad_work

    slept: list[float] = []
    on_time = pad_work(0.5, cpu_s=0.002, elapsed_s=0.002 + 0.5 * LATE_TOLERANCE * 0.003, sleep=slept.append)
    late = pad_work(0.5, cpu_s=0.002, elapsed_s=0.0049, sleep=slept.append)  # waited 2.9 ms for the CPU
    assert slept == [pytest.approx(0.001), pytest.approx(0.001)] and not on_time.late and late.late
    counters = pad_counters()
    for o in (on_time, late):
        o.count(counters)
    assert counters == {"timed": 2, "late": 1, "stalled": 0, "stall_s": 0.0, "cpu_s": pytest.approx(0.004),
                        "unpadded_s": pytest.approx(on_time.unpadded_s + 0.0049), "paced_cpu_s": 0.0,
                        "expected_cpu_s": 0.0}  # neither was paced


def test_a_paced_call_is_padded_until_it_takes_its_target():
    """A padded call of one input sleeps until its wall time reaches its target (2.4 ms), whatever
    CPU it took (2.0 ms against a 1.2 ms bare call: pad 1.0 x its CPU would give 4.0 ms) or waited
    within it: the host's extra CPU and wall time are not scaled by k / s. A call beyond its target
    gets no pad and, beyond LATE_TOLERANCE, is late; an unpadded cluster's call (pad 0) sleeps
    nothing and is judged all the same."""
    from testbed.serve.scheduler import pad_work

    slept: list[float] = []
    heavy = pad_work(1.0, cpu_s=0.0020, elapsed_s=0.0020, sleep=slept.append, target_s=0.0024)
    cheap = pad_work(1.0, cpu_s=0.0010, elapsed_s=0.0012, sleep=slept.append, target_s=0.0024)
    waited = pad_work(1.0, cpu_s=0.0020, elapsed_s=0.0030, sleep=slept.append, target_s=0.0024)
    beyond = pad_work(1.0, cpu_s=0.0030, elapsed_s=0.0030, sleep=slept.append, target_s=0.0024)
    unpadded = pad_work(0.0, cpu_s=0.0030, elapsed_s=0.0030, sleep=slept.append, target_s=0.0024)
    assert slept == [pytest.approx(0.0004), pytest.approx(0.0012)]
    assert not heavy.late and not cheap.late and waited.late and beyond.late and unpadded.late


def test_a_call_the_quota_stalled_is_charged_the_models_stall_and_never_less_than_its_target():
    """A paced call's CPU stalled by the cluster's quota ends as the model's expected stall says
    (pad_work's docstring). The quota ran out while it ran (the periods' counter moved): past a
    stall as long as its target (0.030 s of wall time against 0.024) it sleeps half the target, a
    shorter stall (0.010 s) lengthens it by half the stall, a call that waited nothing still ends
    at its target. It began in a stall (only the wait's counter moved): it sleeps its whole
    target. Unstalled (no counter moved, or none read): to its target, as before."""
    from testbed.serve.scheduler import pad_work

    slept: list[float] = []
    ran, began, calm = ((3, 100), (4, 100)), ((3, 100), (3, 900)), ((3, 100), (3, 100))
    outs = [pad_work(1.0, cpu_s=0.0012, elapsed_s=e, sleep=slept.append, target_s=0.024, throttles=t)
            for e, t in ((0.030, ran), (0.010, ran), (0.0012, ran), (0.030, began), (0.010, calm), (0.010, None))]
    assert slept == pytest.approx([0.012, 0.019, 0.0234, 0.024, 0.014, 0.014])
    assert [o.stalled for o in outs] == [True] * 4 + [False] * 2
    # a piece of work without a target (the handling) keeps its waits and its pad x its CPU
    slept.clear()
    pad_work(1.0, cpu_s=0.001, elapsed_s=0.005, sleep=slept.append, throttles=ran)
    assert slept == [pytest.approx(0.001)]


def test_a_stall_of_the_quota_during_a_pad_lengthens_it_by_the_lateness_it_caused():
    """The pad is slept in steps of a tenth of the target; a step that wakes 30 ms late while the
    throttle counters moved (the thread woke into a stall of the quota) lengthens the pad by those
    30 ms; a step late by as much without a move (the host's own latency) does not, and the pad
    then still ends at its deadline."""
    from testbed.serve.scheduler import pad_work

    def run(moves_at: int | None):
        now, steps, reads = [0.0], [], [0]

        def sleep(dt):
            steps.append(dt)
            now[0] += dt + (0.030 if len(steps) == 3 else 0.0)

        def state():
            reads[0] += 1
            return (5, 0) if moves_at is not None and reads[0] >= moves_at else (4, 0)

        out = pad_work(1.0, cpu_s=0.01, elapsed_s=0.01, sleep=sleep, target_s=0.110,
                       throttles=((4, 0), (4, 0)), state=state, clock=lambda: now[0])
        return out, now[0], steps

    stalled, end, steps = run(moves_at=3)
    assert stalled.stall_s == pytest.approx(0.030) and stalled.stalled and stalled.late
    assert end == pytest.approx(0.100 + 0.030) and steps[0] == pytest.approx(0.011)
    calm, end, _ = run(moves_at=None)
    assert calm.stall_s == 0.0 and not calm.stalled and end == pytest.approx(0.100)


def test_a_scheduler_reads_the_quotas_throttle_counters_around_each_paced_call(monkeypatch):
    """The worker reads the cluster's throttle counters before and after each paced call's CPU
    and hands them, and the reader, to pad_work; an unpaced call (no target) reads none."""
    from testbed.serve import scheduler as sch

    seen: list[tuple] = []
    original = sch.pad_work

    def recorded(*args, throttles=None, state=None, **kw):
        seen.append(throttles)
        return original(*args, sleep=lambda _: None, throttles=throttles, **kw)

    monkeypatch.setattr(sch, "pad_work", recorded)

    class Model:
        def predict(self, x):
            return x

    def serve(counts, paced=True):
        it = iter(counts)
        s = sch.Scheduler({"m": Model()}, cpu_pad=1.0,
                          paces={"m": sch.CallPace(target_ms=40.0, cold_target_ms=40.0)} if paced else {},
                          throttles=lambda: next(it))
        s.run_batch([sch.Job("m", np.zeros((1, 2), np.float32))])
        return list(it)

    assert serve([(3, 0), (4, 7), "unread"]) == ["unread"]
    assert serve([(3, 0), (4, 7)], paced=False) == [(3, 0), (4, 7)]  # never read
    assert seen == [((3, 0), (4, 7)), None]


def test_work_beyond_its_target_is_late_without_a_wait_and_the_summary_warns():
    """A call of one input whose padded time exceeds its target (the profile's call at the run's
    speed) by more than LATE_TOLERANCE ran slower than the run asked, with no wait at all (a busy
    host runs the same call slower); within it, it is on time. The summary counts the late calls
    per cluster and warns when most of a model's calls were."""
    from testbed.results.render import _late_warnings, _server_table
    from testbed.serve.scheduler import LATE_TOLERANCE, pad_work

    slow = pad_work(0.2, cpu_s=0.0027, elapsed_s=0.0027, sleep=lambda _: None, target_s=0.0024)
    fine = pad_work(0.2, cpu_s=0.002, elapsed_s=0.002, sleep=lambda _: None,
                    target_s=0.0024 / (1 + LATE_TOLERANCE / 2))
    assert slow.late and not fine.late
    calls = {"a": {"timed": 24, "late": 13}, "b": {"timed": 24, "late": 12}}
    s = {"per_cluster": {"edge": {"server": {"lives": 1, "lives_not_ready": 0, "served": 48, "dropped_queue_full": 0,
                                             "dropped_admission": 0, "errors": 0, "utilization": 0.1,
                                             "calls": calls}}}}
    warnings = _late_warnings(s)
    assert len(warnings) == 1 and "edge's calls of a" in warnings[0] and "13 of 24" in warnings[0]
    assert _server_table(s)[0][2][0][-1] == "25/48"
    # a cluster out of its quota in most periods: its calls waited for the emulated system's own quota
    s["per_cluster"]["edge"]["cpu"] = {"throttled_periods": 203, "periods": 213}
    assert _late_warnings(s) == []
    s["per_cluster"]["edge"]["cpu"] = {"throttled_periods": 3, "periods": 213}
    assert len(_late_warnings(s)) == 1 and "not at its profile's speed" in _late_warnings(s)[0]
    s["speeds"] = {"mode": "host"}  # nothing held it to the profile: slower than the speeds it recorded
    assert "slower than the speeds the run recorded" in _late_warnings(s)[0]
    assert "profile's speed" not in _late_warnings(s)[0]


def test_a_cold_call_is_paced_to_the_profiles_cold_call_and_the_hosts_ratio_is_reported():
    """The host's cold call costs it 1.4x its warm one, the profile's 1.1x: a cold call's target is
    the profile's cold call x k / s (the bare call x k / s x the profile's cold factor), whatever
    the host's ratio, which the Speeds line reports beside the profile's."""
    from types import SimpleNamespace

    from testbed.serve.server import _paces

    t = _target({"m": 2.0}, k=2.0, threads=1).model_copy(update={"cold_factor": {"m": 1.1}})
    cs = cluster_speed(t, 0.5, {"m": 1.6}, {"m": 30}, {"m": 1.6 * 1.4})  # s = 0.8: k / s = 2.5
    ms = cs.models["m"]
    assert ms.host_cold_ratio == pytest.approx(1.4) and ms.cold_factor == 1.1 and cs.applied_by == "pad"
    pace = _paces(SimpleNamespace(speed=t), cs)["m"]
    assert pace.target_s(False) == pytest.approx(1.6 * 2.5 / 1e3) == pytest.approx(2.0 * 2.0 / 1e3)
    assert pace.target_s(True) == pytest.approx(2.0 * 1.1 * 2.0 / 1e3)  # the profile's cold call x k
    assert "cold 1.40x warm (profile 1.10x)" in Speeds(mode="profile", time_dilation=2.0, clusters={"c": cs}).line()


def test_only_calls_of_a_millisecond_or_more_are_paced():
    """A call the profile times below LEAST_PACED_MS is mostly per-call overhead: the server paces
    (and judges) only the longer ones, and only on one thread per call."""
    from types import SimpleNamespace

    from testbed.plan.speeds import LEAST_PACED_MS
    from testbed.serve.server import _paces

    profile = {"big": 2.0, "tiny": LEAST_PACED_MS / 4}
    cs = cluster_speed(_target(profile), 0.5, {"big": 1.6, "tiny": 0.2}, None, {"big": 2.0, "tiny": 3.0})
    assert set(_paces(SimpleNamespace(speed=_target(profile, threads=1)), cs)) == {"big"}
    assert _paces(SimpleNamespace(speed=_target(profile, threads=2)), cs) == {}


def test_the_server_takes_the_cold_target_after_idleness_only(monkeypatch):
    """The scheduler asks the model's cold rule (testbed.model.cpu.call_is_cold) of its own calls:
    its first call and one after idleness are paced to the cold target, one right after another
    call to the warm one; a batch of several inputs by the pad x its CPU, with no target."""
    import math
    import threading

    from testbed.serve import scheduler as sch

    seen: list[tuple[float, float | None]] = []
    real = sch.pad_work
    monkeypatch.setattr(sch, "pad_work", lambda pad, cpu, el, target_s=None, throttles=None, state=None: (
        seen.append((pad, target_s)), real(pad, cpu, el, target_s=target_s))[1])
    sched = sch.Scheduler({"m": SpinModel(1.0)}, cpu_pad=1.0, max_batch=1,
                          paces={"m": sch.CallPace(target_ms=4.0, cold_target_ms=8.0)})
    sched.start()
    try:
        for last_end, rows in ((None, 1), (math.inf, 1), (-math.inf, 1), (math.inf, 2)):
            if last_end is not None:
                sched._last_call_end = last_end  # inf: a call just ended (warm); -inf: long idle (cold)
            done = threading.Event()
            job = Job(model="m", x=np.zeros((rows, 2), dtype=np.float32), done=lambda j, d=done: d.set())
            assert sched.submit(job) is None and done.wait(30)
    finally:
        sched.stop()
    assert seen == [(1.0, 0.008), (1.0, 0.004), (1.0, 0.008), (1.0, None)]


def test_a_paced_calls_target_is_drawn_as_the_simulator_draws_its_call(monkeypatch):
    """Each paced call's target is its warm or cold target x one of the pace's draws, at random
    (seeded): over many calls every draw comes up, and the quota's expected CPU takes the same draw."""
    import threading

    from testbed.serve import scheduler as sch

    seen: list[float] = []
    real = sch.pad_work
    monkeypatch.setattr(sch, "pad_work", lambda pad, cpu, el, target_s=None, throttles=None, state=None: (
        seen.append(target_s), real(pad, cpu, el, target_s=target_s))[1])
    pace = sch.CallPace(target_ms=1.0, cold_target_ms=1.0, slowdown=2.0, draws=(0.5, 2.0))
    assert pace.expected_cpu_s(False, 2.0) == pytest.approx(0.001)
    sched = sch.Scheduler({"m": SpinModel(0.05)}, cpu_pad=1.0, max_batch=1, paces={"m": pace}, seed=7)
    sched.start()
    try:
        for _ in range(40):
            done = threading.Event()
            assert sched.submit(Job(model="m", x=np.zeros((1, 2), dtype=np.float32),
                                    done=lambda j, d=done: d.set())) is None and done.wait(30)
    finally:
        sched.stop()
    assert sorted({round(t, 9) for t in seen}) == [0.0005, 0.002]
    assert 10 <= sum(t == pytest.approx(0.002) for t in seen) <= 30  # seeded: 40 fair draws
    pm = sched.counters.per_model["m"]
    assert pm["expected_cpu_s"] == pytest.approx(sum(seen) / 2.0)


def test_a_padded_servers_stats_count_its_calls_cpu_and_the_late_ones():
    import threading

    from testbed.serve.scheduler import Scheduler

    sched = Scheduler({"m": SpinModel(5.0)}, cpu_pad=1.0)
    sched.start()
    try:
        for _ in range(3):
            done = threading.Event()
            job = Job(model="m", x=np.zeros((1, 2), dtype=np.float32), done=lambda j, d=done: d.set())
            assert sched.submit(job) is None and done.wait(30)
            assert (job.t3 - job.t2) / 1e6 >= 2 * 5.0  # at least (1 + pad) x its CPU time
    finally:
        sched.stop()
    pm = sched.snapshot()["per_model"]["m"]
    assert pm["served"] == 3 and pm["timed"] == 3 and 0 <= pm["late"] <= 3
    assert pm["cpu_s"] >= 3 * 0.005 and pm["unpadded_s"] >= pm["cpu_s"] * 0.99


def test_unpadded_work_is_timed_and_late_only_beyond_the_tolerance():
    from testbed.serve.scheduler import LATE_TOLERANCE, pad_work

    slept: list[float] = []
    assert not pad_work(0.0, 0.002, 0.002 * (1 + LATE_TOLERANCE / 2), sleep=slept.append).late
    assert pad_work(0.0, 0.002, 0.002 * (1 + 2 * LATE_TOLERANCE), sleep=slept.append).late
    assert slept == []


def test_the_quota_follows_the_paced_calls_cpu_over_their_bare_calls():
    """The followed factor r is the paced calls' CPU time over what the quota expects of them (the
    bare call, x the profile's cold factor when cold), within FOLLOW_BOUNDS; too few calls keep the
    quota as it stands. A server counts both per model for its paced calls only."""
    from testbed.plan.speeds import FOLLOW_BOUNDS, FOLLOW_MIN_EXPECTED_S, followed_quota_factor
    from testbed.serve.scheduler import CallPace, pad_counters, pad_work

    assert followed_quota_factor(0.125, 0.1) == pytest.approx(1.25)
    assert followed_quota_factor(0.1, 0.1) == 1.0  # back-to-back warm calls: the bare calls' quota
    assert followed_quota_factor(1.0, FOLLOW_MIN_EXPECTED_S / 2) is None
    assert followed_quota_factor(10.0, 0.1) == FOLLOW_BOUNDS[1] and followed_quota_factor(0.0, 0.1) == FOLLOW_BOUNDS[0]
    pace = CallPace(target_ms=4.0, cold_target_ms=6.0, slowdown=2.0)
    assert pace.expected_cpu_s(False) == pytest.approx(0.002) and pace.expected_cpu_s(True) == pytest.approx(0.003)
    counters = pad_counters()
    pad_work(1.0, 0.0025, 0.0025, sleep=lambda _: None).count(counters)  # not paced: not in the ratio
    from dataclasses import replace
    replace(pad_work(1.0, 0.0036, 0.0036, sleep=lambda _: None, target_s=0.006),
            expected_cpu_s=pace.expected_cpu_s(True)).count(counters)
    assert counters["paced_cpu_s"] == pytest.approx(0.0036) and counters["expected_cpu_s"] == pytest.approx(0.003)
    assert counters["cpu_s"] == pytest.approx(0.0061) and counters["timed"] == 2


def test_the_followed_quota_charges_the_handling_as_the_model_does():
    """The work the quota is charged for: the paced calls' expected CPU, the unpaced calls' own CPU
    and s x the profile's handling per query; the taken side is the whole process's CPU. A
    saturated cluster whose process spends on each query its call's expected CPU plus the
    profile's handling at this host's speed gets r = 1 (the simulator's throughput), where a rule
    that left the handling out gave it a quota that paid for the handling on top."""
    from testbed.plan.speeds import followed_quota_factor, work_totals

    stats = {"process_cpu_s": 2.0, "expected_handling_s": 0.1, "time_ns": 5_000_000_000,
             "per_model": {"a": {"cpu_s": 1.2, "paced_cpu_s": 1.0, "expected_cpu_s": 0.9},
                           "b": {"cpu_s": 0.0, "paced_cpu_s": 0.0, "expected_cpu_s": 0.0}}}
    at, taken, expected = work_totals(stats)
    assert at == 5.0 and taken == 2.0 and expected == pytest.approx(0.9 + 0.2 + 0.1)
    assert work_totals({**stats, "per_model": {"a": {"cpu_s": 1.0, "expected_cpu_s": 0.0}}}) is None  # none paced
    assert work_totals({"per_model": stats["per_model"]}) is None  # a server without the process's clock
    assert work_totals({**stats, "process_cpu_s": "x"}) is None
    # 100 queries at 0.25 core, s = 0.5: calls of 8 ms of profile CPU (4 ms here) and 1.2 ms of handling
    calls, handling = 100 * 0.004, 100 * 0.5 * 0.0012
    assert followed_quota_factor(calls + handling, calls + handling) == 1.0
    assert followed_quota_factor(calls + 0.1 * handling, calls + handling) < 1.0  # a cheaper loop: less quota


def test_the_followed_quota_takes_off_what_the_group_ran_past_its_quota():
    """u = the CPU rate taken over the quota applied (wall clock: / k), at least 1: a group that
    ran 25 % past its quota gets its quota / 1.25; one that took less (not saturated) is not
    raised for it; too little work keeps the quota."""
    from testbed.plan.speeds import FOLLOW_MIN_EXPECTED_S, OVERRUN_BOUND, followed_quota

    # 0.25-core cluster, s = 0.5, k = 2.5: applied 0.125 x 1.2 per 250 ms = 0.06 wall cores
    r, u, cores = followed_quota(0.125, 2.5, taken_cpu_s=0.375, expected_cpu_s=0.3125, span_s=5.0, applied_cores=0.15)
    assert r == pytest.approx(1.2) and u == pytest.approx(1.25) and cores == pytest.approx(0.125 * 1.2 / 1.25)
    r, u, cores = followed_quota(0.125, 2.5, taken_cpu_s=0.15, expected_cpu_s=0.125, span_s=5.0, applied_cores=0.15)
    assert u == 1.0 and cores == pytest.approx(0.125 * r)  # half the quota taken: no overrun
    assert followed_quota(0.125, 1.0, 3.0, 1.0, 1.0, 0.1)[1] == OVERRUN_BOUND
    assert followed_quota(0.125, 2.5, 1.0, FOLLOW_MIN_EXPECTED_S / 2, 5.0, 0.15) is None
    assert followed_quota(0.125, 2.5, 0.375, 0.3125, 0.0, 0.15)[1] == 1.0  # no span: nothing to read u from


def test_a_server_counts_the_handling_the_model_charges():
    """s x the profile's reading (handling - answer) and writing (answer) per query, per model."""
    from types import SimpleNamespace

    from testbed.serve.server import _handling_expected

    cfg = SimpleNamespace(speed=SimpleNamespace(handling_ms={"m": 1.3, "n": 0.5}, answer_ms={"m": 0.1, "n": 0.9}))
    got = _handling_expected(cfg, SimpleNamespace(scale=0.5))
    assert got["m"] == (pytest.approx(0.0006), pytest.approx(0.00005))
    assert got["n"] == (0.0, pytest.approx(0.00025))  # an answer figure above the whole is capped at it
    assert _handling_expected(cfg, None) == {}


def test_the_summary_names_the_followed_quotas():
    from testbed.results.render import _followed_quotas

    s = {"per_cluster": {"a": {"cpu": {"quota_factor": {"mean": 1.21, "min": 1.05, "max": 1.3}}}, "b": {"cpu": {}}}}
    line = _followed_quotas(s)
    assert "a x1.21 mean (x1.05-1.30)" in line and " b " not in line
    assert _followed_quotas({"per_cluster": {"b": {"cpu": {"periods": 3}}}}) == ""
    s["per_cluster"]["a"]["cpu"]["quota_overrun"] = {"mean": 1.2, "max": 1.3}
    assert "a x1.21 mean (x1.05-1.30), overrun /1.20" in _followed_quotas(s)
