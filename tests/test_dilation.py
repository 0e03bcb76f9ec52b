"""Time dilation (testbed.plan.dilation): every time constant of a dilated plan and of the boundary
files the emulation's processes get is scaled exactly once; arrivals and records go back to
emulated time; the CLI and the plan refuse what cannot be applied. No root needed."""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from fakes import SpinModel

from testbed.core.clock import EmulatedClock
from testbed.emu.event_runner import EventRunner
from testbed.emu.selfcheck import check_rtts
from testbed.model.arrivals import make_process
from testbed.model.timeline import Change, kind_of
from testbed.plan.boundaries import ControllerConfig, ServerConfig, SourceConfig
from testbed.plan.build import build_plan
from testbed.plan.dilation import (
    Stretched,
    dilate,
    nested_cpu,
    rto_min_ms,
    with_time_dilation,
)
from testbed.plan.resolved import PlanError
from testbed.serve.scheduler import Job, Scheduler
from testbed.spec.experiment import ConfigError, Experiment, WorkloadSpec, load_experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
K = 3.0

# Every leaf of the plan and of the boundary files is one of these (regex on its dotted path).
#: x k: times of the emulated system.
TIME = [r"experiment\.duration_s", r"experiment\.report_interval_s", r"experiment\.applications\.\d+\.deadline_ms",
        r"experiment\.emulation\.stats_interval_s",
        r"experiment\.clusters\.\d+\.server\.max_queue_delay_ms", r"links\.\d+\.delay_ms", r"paths\.\d+\.one_way_ms",
        r"paths\.\d+\.rtt_ms", r"services\.\w+\.\w+\.(samples_ms\.\d+|batch_mean_ms\.\d+|wall_mean_ms|wall_p95_ms|"
        r"expected_ms|busy_mean_ms|handling_ms|answer_ms)", r"changes\.\d+\.t_s",
        # boundary files
        r"duration_s", r"report_interval_s", r"grace_ms", r"applications\.\d+\.deadline_ms",
        r"options\.\d+\.option\.(rtt_ms|service_ms|mean_service_ms)", r"mean_service_ms\.\w+", r"max_queue_delay_ms",
        r"stats_interval_s", r"links\.\d+\.delay_ms", r"hosts\.\d+\.delay_ms",
        r"rtt_steps\.\w+\.\d+\.[01]"]  # the RTT timeline's instants (s) and RTTs (ms)
#: / k: rates.
RATE = [r"links\.\d+\.bandwidth_mbps", r"hosts\.\d+\.bandwidth_mbps"]
#: = k (1 against 3): the dilation itself.
K_ITSELF = [r"experiment\.emulation\.time_dilation", r"time_dilation"]
#: The events' values: by their kind's unit (checked below).
CHANGE_VALUE = r"changes\.(\d+)\.value"
#: Not scaled, on purpose (testbed.plan.dilation's module docstring says why for each).
EXEMPT = [r"experiment\.workload\..*", r"streams\..*",  # drawn in emulated time, stretched by the source
          r"(experiment\.)?aset\.window_s",  # checked against the checkpoint's; the source waits k x it
          r"experiment\.emulation\.rtt_tolerance_(ms|pct|per_switch_ms)",  # the self-check judges emulated values
          r"experiment\.simulation\..*",  # the simulator's, unused by the emulation
          r"experiment\.events\..*",  # the emulation runs plan.changes, dilated
          r"experiment\.(topology|cloud)\..*",  # planning inputs: the emulation runs plan.links and plan.hosts
          r"selector_context\..*",  # what the selector observes, in emulated time (the features' own clock)
          r"start_ns",  # an instant: the load's start, where the two clocks meet
          r"go_timeout_s",  # the run's own wall-clock wait, set from k by testbed.emu.load
          r"clock"]
#: A leaf whose name says it is a time or a rate must be classified above.
UNIT_NAME = re.compile(r"(_ms|_s|_mbps|_qps|_hz|_ns)$|^(samples_ms|batch_mean_ms|mean_service_ms)$")


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, obj


def _match(path: str, patterns: list[str]) -> bool:
    return any(re.fullmatch(p, path) for p in patterns)


def _named_as_unit(path: str) -> bool:
    return any(UNIT_NAME.search(part) for part in path.split(".") if not part.isdigit())


def _compare(one: dict, three: dict, changes=None) -> set[str]:
    """Assert the rules leaf by leaf (k = 1 against k = 3); returns the paths that scaled."""
    a, b = dict(_leaves(one)), dict(_leaves(three))
    assert a.keys() == b.keys()
    scaled = set()
    for path, x in a.items():
        y = b[path]
        m = re.fullmatch(CHANGE_VALUE, path)
        if path == "cpu_pad":  # k - 1 for a cluster below one core (testbed.plan.dilation.nested_cpu)
            assert (x, y) == (0.0, K - 1.0), (x, y)
            scaled.add(path)
            continue
        if m and x is not None:
            factor = {"time": K, "rate": 1 / K, "none": 1.0}[
                {"ms": "time", "s": "time", "Mbit/s": "rate", "%": "none"}[kind_of(changes[int(m[1])]["kind"]).unit]]
        elif _match(path, TIME) or _match(path, K_ITSELF):
            factor = K
        elif _match(path, RATE):
            factor = 1 / K
        elif _match(path, EXEMPT):
            continue
        else:
            assert not (_named_as_unit(path) and isinstance(x, (int, float)) and not isinstance(x, bool) and x != 0), \
                f"{path} looks like a time or a rate but no rule says how it dilates"
            assert x == y, f"{path} changed with k ({x!r} -> {y!r}) but is not a time constant"
            continue
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            assert y == pytest.approx(x * factor, rel=1e-9, abs=1e-9), f"{path}: {x} -> {y}, expected x {factor:g}"
            if x != 0 and factor != 1.0:
                scaled.add(path)
        else:
            assert x == y, path
    return scaled


def _experiment() -> Experiment:
    """The triangle with a batching server, an ASET window (no ASET source) and events of every
    kind with a value (a step, a ramp) and a cluster outage."""
    data = yaml.safe_load(TRIANGLE.read_text())
    data["clusters"][1]["server"] = {"max_batch": 4, "max_queue_delay": "5ms"}
    data["aset"] = {"window": "1s"}
    data["events"] = [
        {"at": "2s", "kind": "link_delay", "link": ["A", "B"], "delay": "7ms"},
        {"at": "3s", "kind": "link_bandwidth", "link": ["B", "C"], "ramp": {"to": 20, "over": "2s",
                                                                           "every": "1s"}},
        {"at": "4s", "kind": "link_loss", "link": ["A", "C"], "loss_pct": 1},
        {"at": "4.5s", "kind": "link_congestion", "link": ["A", "B"], "background": "10Mbit/s"},
        {"at": "5s", "kind": "cluster_down", "cluster": "edgeb"},
        {"at": "6s", "kind": "cluster_up", "cluster": "edgeb"}]
    return Experiment.model_validate(data)


@pytest.fixture(scope="module")
def plans():
    plan = build_plan(_experiment(), base_dir=TRIANGLE.parent)
    return {1.0: dilate(with_time_dilation(plan, 1.0)), K: dilate(with_time_dilation(plan, K))}


def test_every_time_constant_of_the_plan_is_scaled_once(plans):
    one, three = plans[1.0].to_dict(), plans[K].to_dict()
    scaled = _compare(one, three, one["changes"])
    # not vacuous: each kind of constant was there and scaled
    for must in (r"experiment\.duration_s", r"links\.0\.delay_ms", r"links\.0\.bandwidth_mbps",
                 r"hosts\.0\.bandwidth_mbps", r"paths\.0\.one_way_ms", r"changes\.0\.t_s", r"changes\.0\.value",
                 r"services\.edgeb\.digits_small\.busy_mean_ms",
                 r"experiment\.clusters\.1\.server\.max_queue_delay_ms", r"experiment\.applications\.0\.deadline_ms"):
        assert any(re.fullmatch(must, p) for p in scaled), must
    # the wall plan's RTT is k x the emulated one, and the emulated plan stays as it was
    assert plans[K].rtt_ms("srca", "edgec") == pytest.approx(K * plans[K].emulated.rtt_ms("srca", "edgec"))
    assert plans[K].emulated.clock == "emulated" and plans[K].clock == "wall"


def test_every_time_constant_of_the_boundary_files_is_scaled_once(plans, tmp_path):
    def files(p):
        src = SourceConfig.from_plan(p, "srca", 123, p.experiment.duration_s, tmp_path)
        srv = ServerConfig.from_plan(p, "edgec", 8501, tmp_path)
        ctl = ControllerConfig.from_plan(p, {h.name: i for i, h in enumerate(p.hosts, start=1)})
        return {"source": src.model_dump(mode="json"), "server": srv.model_dump(mode="json"),
                "controller": ctl.model_dump(mode="json")}

    one, three = files(plans[1.0]), files(plans[K])
    scaled = set()
    for name in one:
        scaled |= {f"{name}:{p}" for p in _compare(one[name], three[name])}
    for must in ("source:grace_ms", "source:report_interval_s", "source:duration_s",
                 "source:applications.0.deadline_ms", "source:options.0.option.rtt_ms",
                 "source:options.0.option.mean_service_ms", "server:max_queue_delay_ms",
                 "server:stats_interval_s", "server:mean_service_ms.digits_small", "controller:links.0.delay_ms",
                 "controller:links.0.bandwidth_mbps", "controller:hosts.0.bandwidth_mbps"):
        assert must in scaled, must
    assert "server:cpu_pad" in scaled  # edgec has 0.5 cores: padded, not nested
    assert three["source"]["time_dilation"] == K and one["source"]["time_dilation"] == 1.0
    assert three["source"]["streams"] == one["source"]["streams"]  # emulated; the source stretches them
    assert three["source"]["aset"]["window_s"] == one["source"]["aset"]["window_s"] == 1.0  # the same


def test_a_plan_is_dilated_once_and_processes_get_only_a_wall_plan(plans, tmp_path):
    with pytest.raises(PlanError, match="already dilated"):
        dilate(plans[K])
    emulated = plans[K].emulated
    with pytest.raises(PlanError, match="emulated time"):
        SourceConfig.from_plan(emulated, "srca", 0, 1.0, tmp_path)
    with pytest.raises(PlanError, match="emulated time"):
        ServerConfig.from_plan(emulated, "edgec", 8501, tmp_path)
    with pytest.raises(PlanError, match="outside 1 .. 100"):
        with_time_dilation(emulated, 0.5)
    assert rto_min_ms(EmulatedClock(K)) == 600.0


@pytest.mark.parametrize("value", [0.5, 101, "fast"])
def test_the_spec_refuses_a_dilation_outside_its_bounds(value, tmp_path):
    data = yaml.safe_load(TRIANGLE.read_text())
    data["emulation"]["time_dilation"] = value
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="emulation.time_dilation"):
        load_experiment(path)


SPECS = [{"application": "a", "rate_qps": 40},
         {"application": "a", "process": "mmpp", "rates_qps": [5, 60], "dwell_s": [0.7, 0.3]},
         {"application": "a", "process": "diurnal", "rate_qps": 30, "amplitude": 0.8, "period_s": 3},
         {"application": "a", "process": "step", "steps": [{"at": "0s", "rate_qps": 5}, {"at": "2s", "rate_qps": 50}]}]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.get("process", "poisson"))
def test_stretched_arrivals_are_the_undilated_ones_k_times_later(spec):
    w = WorkloadSpec.model_validate(spec)
    plain = make_process(w, np.random.default_rng(5))
    stretched = Stretched(make_process(w, np.random.default_rng(5)), EmulatedClock(K))
    want, got = [], []
    for i in range(20):  # the source's windows: report intervals, on the wall clock
        want.append(plain.times(i * 0.25, (i + 1) * 0.25))
        got.append(stretched.times(i * 0.25 * K, (i + 1) * 0.25 * K))
    want, got = np.concatenate(want), np.concatenate(got)
    assert len(want) > 10 and np.allclose(got, want * K, rtol=0, atol=1e-9)
    assert stretched.mean_rate_qps == pytest.approx(plain.mean_rate_qps / K)


def test_measured_instants_go_back_to_emulated_time():
    start = 1_700_000_000_000_000_000
    wall = {"t1_ns": start + 3_000_000, "t4_ns": start + 9_000_001, "t2_ns": None}
    got = EmulatedClock(K, start).instants(wall)
    assert got == {"t1_ns": start + 1_000_000, "t4_ns": start + 3_000_000, "t2_ns": None}
    assert EmulatedClock(1.0, start).instants(wall) == wall
    assert EmulatedClock(K, start).wall_ns(got["t1_ns"]) == wall["t1_ns"]
    assert math.isclose((got["t4_ns"] - got["t1_ns"]) * K, wall["t4_ns"] - wall["t1_ns"], abs_tol=K)


def test_a_cluster_below_one_core_is_padded_and_must_serve_litert():
    plan = build_plan(_experiment(), base_dir=TRIANGLE.parent)
    assert not nested_cpu(0.5) and nested_cpu(1.0)
    exp = plan.experiment
    assert exp.clusters[0].server.runtime_of("digits_small") == "tensorflow" and exp.clusters[0].workers == 1
    dilate(with_time_dilation(plan, 2.0))  # one worker: the process's CPU clock is the call's
    tf = exp.model_copy(update={"clusters": [exp.clusters[0].model_copy(update={"workers": 2}), exp.clusters[1]]})
    tf_plan = plan.model_copy(update={"experiment": tf})
    host = tf.model_copy(update={"emulation": tf.emulation.model_copy(update={"speed": "host"})})
    dilate(with_time_dilation(plan.model_copy(update={"experiment": host}), 1.0))  # at the host's speed: no pad
    with pytest.raises(PlanError, match="clusters.edgeb: emulation.speed: profile .*runtime litert, use workers: 1"):
        dilate(with_time_dilation(tf_plan, 1.0))  # at the profile's speed the calls are padded undilated too
    with pytest.raises(PlanError, match="clusters.edgeb: .*runtime litert, use workers: 1"):
        dilate(with_time_dilation(tf_plan, 2.0))


def test_a_padded_call_takes_at_least_k_times_its_cpu_time():
    done = threading.Event()
    sched = Scheduler({"m": SpinModel(20.0)}, cpu_pad=K - 1)
    sched.start()
    try:
        job = Job(model="m", x=np.zeros((1, 2), dtype=np.float32), done=lambda j: done.set())
        assert sched.submit(job) is None
        assert done.wait(30)
    finally:
        sched.stop()
    assert job.error is None
    # the call burnt >= 20 ms of CPU, then slept (k - 1) x that: t3 - t2 >= k x 20 ms
    assert (job.t3 - job.t2) / 1e6 >= K * 20.0


def test_the_self_check_judges_emulated_rtts_with_the_experiments_tolerance():
    ping = "".join(f"64 bytes from 10.0.0.2: icmp_seq={i} ttl=64 time={t} ms\n"
                   for i, t in enumerate((31.2, 30.6, 33.0), 1))  # wall clock, k = 3: 10.4 / 10.2 / 11.0 ms
    proc = SimpleNamespace(wait=lambda: 0, communicate=lambda: (ping, None))
    plan = SimpleNamespace(sources=[SimpleNamespace(name="s", mac="m1", ip="10.0.0.1")],
                           clusters=[SimpleNamespace(name="c", mac="m2", ip="10.0.0.2")])
    emu = SimpleNamespace(node=lambda name: SimpleNamespace(popen=lambda *a, **k: proc))
    # the controller holds the dilated path: 15 ms one way on the wall clock, 5 ms emulated
    [r] = check_rtts(emu, plan, lambda a, b: ([1, 2], 15.0), count=3, tol_ms=1.0, tol_pct=0.0, per_switch_ms=0.0,
                     clock=EmulatedClock(K))
    assert r.expected_ms == pytest.approx(10.0) and r.samples == pytest.approx([10.4, 10.2, 11.0])
    assert r.tolerance_ms == 1.0 and r.ok  # 0.4 ms off in emulated time, within the experiment's 1 ms


def test_events_csv_rows_are_in_emulated_time_and_units():
    runner = EventRunner.__new__(EventRunner)  # only its row builder: no network
    runner.clock, runner.t0_s = EmulatedClock(K), 1000.0
    delay = Change(t_s=6.0, kind="link_delay", event=0, link=("s1", "s2"), value=21.0)  # the dilated timeline
    row = runner._row(delay, 1000.0 + 6.3, 30.0, 21.6, "ms", 3.0, True, "")
    assert (row["planned_s"], row["applied_s"], row["lag_ms"]) == (2.0, 2.1, pytest.approx(100.0))
    got = [float(row[c]) for c in ("value_asked", "value_measured", "tolerance", "effect_ms")]
    assert got == pytest.approx([7.0, 7.2, 1.0, 10.0])
    assert row["applied_unix_s"] == "1006.300000"  # the wall-clock instant stays
    bw = Change(t_s=3.0, kind="link_bandwidth", event=1, link=("s1", "s2"), value=10.0)
    row = runner._row(bw, 1003.0, None, 9.8, "Mbit/s", None, None, "")
    assert [float(row["value_asked"]), float(row["value_measured"])] == pytest.approx([30.0, 29.4])


def test_aset_under_dilation_is_checked_on_the_sources_plan_and_simulated_in_emulated_time():
    """policy aset at k = 2: testbed run's pre-check builds each source's config from the
    wall-clock plan, as the sources get it (it used to refuse the emulated one: "the plan has time
    dilation 2 but is in emulated time"), and testbed simulate drives the checkpoint on the
    emulated clock."""
    from testbed.agent.live import check_agents
    from testbed.sim.run import simulate

    repo = Path(__file__).resolve().parent.parent
    path = repo / "experiments" / "generated" / "held-out" / "gen-heldout-6.yaml"
    data = yaml.safe_load(path.read_text())
    data["policy"] = "aset"
    data.setdefault("emulation", {})["time_dilation"] = 2
    plan = build_plan(Experiment.model_validate(data), base_dir=path.parent)
    assert plan.time_dilation == 2.0 and plan.clock == "emulated"
    assert check_agents(plan)["kind"] == "gated"  # the wall-clock plan's source configs fit the checkpoint
    out = simulate(plan, duration_s=2.0)
    assert out.selector["kind"] == "gated"
    assert all(sum(c.values()) == 4 for c in out.selector["choices"].values())  # 2 s of 500 ms windows


def test_the_general_agent_sees_a_dilated_source_in_emulated_time(tmp_path):
    """Under time dilation a source's config is on the wall clock (RTTs, service times and
    deadlines x k); the general agent's features divide them by k, so a dilated source scores its
    policies on the same figures as the undilated plan (and as the simulator)."""
    from testbed.agent.live import source_setup
    from testbed.plan.dilation import dilate, with_time_dilation

    plan = with_time_dilation(build_plan(load_experiment(TRIANGLE), base_dir=TRIANGLE.parent), 4.0)
    for s in ("srca", "srcc"):
        wall = source_setup(SourceConfig.from_plan(dilate(plan), s, 0, 10.0, tmp_path))
        emulated = source_setup(SourceConfig.from_plan(with_time_dilation(plan, 1.0), s, 0, 10.0, tmp_path))
        assert [(o.cluster, o.model) for o in wall.options] == [(o.cluster, o.model) for o in emulated.options]
        for w, e in zip(wall.options, emulated.options, strict=True):
            assert w.rtt_ms == pytest.approx(e.rtt_ms) and w.service_ms == pytest.approx(e.service_ms)
        deadlines = [a.deadline_ms for a in emulated.applications]
        assert [a.deadline_ms for a in wall.applications] == pytest.approx(deadlines)
        assert any(o.rtt_ms > 0 for o in wall.options)  # the comparison compares something
