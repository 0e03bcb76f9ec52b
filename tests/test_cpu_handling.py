"""Request handling in the CPU-share model (testbed/model/cpu.py): the server's
event loop spends CPU of the same quota on every request before it reaches the queue. Exact values."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.core.util import REPO_ROOT
from testbed.model.cpu import CfsQuota
from testbed.model.service import isolated_query_s, service_figures
from testbed.plan import handling_profiles as figures
from testbed.plan import zoo
from testbed.plan.build import build_plan
from testbed.plan.catalog import FixedCatalog
from testbed.sim import ServiceSampler, Simulator
from testbed.spec.experiment import Experiment


def test_handling_spends_the_quota_of_the_call_after_it():
    # 0.25 core = 25 ms of CPU per 100 ms period: 10 ms of handling leaves 15 ms for a 20 ms call,
    # which runs 15 ms, is throttled until the next period (t = 100 ms) and ends 5 ms later
    q = CfsQuota(0.25, handling=True)
    e = q.handle(0.0, 0.010)
    assert e == pytest.approx(0.010)
    assert q.run(e, 0.020) == pytest.approx(0.105)
    assert CfsQuota(0.25).run(0.010, 0.020) == pytest.approx(0.030)  # no handling: it fits


def test_handling_is_one_more_thread_for_the_unlimited_test():
    assert not CfsQuota(1.0, 1, 1, handling=True).unlimited  # worker + event loop can use 2 cores
    assert CfsQuota(2.0, 1, 1, handling=True).unlimited
    assert CfsQuota(1.0, 1, 1).unlimited


def test_handling_is_not_a_model_call_for_the_cold_rule():
    q = CfsQuota(2.0, cold_factor=1.5, handling=True)
    assert q.run(0.0, 0.010) == pytest.approx(0.015)  # cold
    e = q.handle(0.5, 0.004)  # handling after idleness ...
    assert q.run(e, 0.010) == pytest.approx(e + 0.015)  # ... does not warm the model call up


def test_service_figures_charge_handling_and_cold_calls():
    f = service_figures("m", "litert", 0.25, 1, 1, [8.0] * 20, {1: 8.0}, handling_ms=2.0, cold_factor=1.25)
    assert f.handling_ms == 2.0 and f.cold_factor == 1.25
    assert f.expected_ms == pytest.approx(2.0 + 8.0 * 1.25)  # fits in the 25 ms quota: no throttling
    assert f.busy_mean_ms == pytest.approx((8.0 + 2.0) / 0.25)  # the quota pays call + handling
    assert isolated_query_s(0.25, 1, 1, 0.020, 0.010, 1.0) == pytest.approx(0.105)
    for bad in (-1.0, float("inf"), float("nan")):  # an infinite handling used to hang CfsQuota
        with pytest.raises(ValueError, match="handling_ms"):
            service_figures("m", "litert", 0.25, 1, 1, [8.0], {1: 8.0}, handling_ms=bad)


def _plan(handling_ms: float, rate: float, cores: float = 1.0):
    exp = Experiment.model_validate({
        "name": "h", "duration": "20s", "policy": "closest",
        "topology": {"source": str(REPO_ROOT / "topologies/triangle.yaml")},
        "clusters": [{"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": cores, "workers": 1,
                      "queue_limit": 100000, "models": ["m"]}],
        "sources": [{"name": "src", "site": "A"}],
        "applications": [{"name": "app", "deadline": "100s", "min_accuracy": 0.5}],
        "workload": [{"application": "app", "rate_qps": rate}]})
    return build_plan(exp, catalog=FixedCatalog({"m": ("digits", 0.9, [10.0])}, handling_ms=handling_ms))


def _run(plan, seed=1):
    sim = Simulator(plan, seed=seed, record=True,
                    service=lambda cl, m: ServiceSampler.deterministic(10.0, np.random.default_rng(0)))
    sim.run_until(20.0)
    q = sim.q
    rows = [(t1, t2, t3) for t1, t2, t3 in zip(q.t1, q.t2, q.t3, strict=True) if t2 is not None]
    return np.asarray(rows)


def test_simulator_handles_each_request_before_it_queues():
    rows = _run(_plan(4.0, rate=2.0))  # sparse: the event loop and the worker are idle at each arrival
    assert len(rows) > 20
    waits = (rows[:, 1] - rows[:, 0]) * 1e3
    assert np.min(waits) == pytest.approx(4.0)  # t2 - t1: the handling, then the call starts
    assert np.median(waits) == pytest.approx(4.0)
    assert np.median((rows[:, 2] - rows[:, 1]) * 1e3) == pytest.approx(10.0)  # 1 core: 14 ms per 100 ms fit
    none = _run(_plan(0.0, rate=2.0))
    assert np.median((none[:, 1] - none[:, 0]) * 1e3) == pytest.approx(0.0)


def test_simulator_handling_throttles_a_small_share_under_load():
    # 0.25 core, 30 q/s of 10 ms calls: saturated. The event loop handles every arrival (4 ms of CPU
    # each, also for queries that then wait or are refused), the worker serves what it can, and the
    # two together spend the whole quota: 0.25 s of CPU per s. Without handling the worker alone
    # serves 0.25 / 0.010 = 25 queries/s.
    def run(handling_ms):
        sim = Simulator(_plan(handling_ms, rate=30.0, cores=0.25), seed=1, record=True,
                        service=lambda cl, m: ServiceSampler.deterministic(10.0, np.random.default_rng(0)))
        sim.run_until(20.0)
        served = sum(1 for t3 in sim.q.t3 if t3 is not None and t3 <= 20.0)
        handled = served + len(sim.clusters[0].queue)
        return served, handled

    served, handled = run(4.0)
    assert handled > served  # the event loop decodes ahead of the worker: the queue grows
    assert (served * 10.0 + handled * 4.0) / 20e3 == pytest.approx(0.25, rel=0.02)
    served0, _ = run(0.0)
    assert served0 / 20.0 == pytest.approx(25.0, rel=0.02)
    assert served < served0 * 0.75


def test_handling_figures_of_the_committed_zoo_are_read_and_checked(tmp_path):
    from testbed.serve import handling
    profiles = REPO_ROOT / "models" / "profiles"
    assert figures.handling_ms(profiles, "hand_full") > 0.5  # JPEG frames: at least half a ms per request
    server, cold = figures.call_factors(profiles, "hand_full")
    assert server >= 1.0 and cold >= 1.0
    assert figures.call_factors(profiles, "digits_small") == (1.0, 1.0)  # below the CPU clock's resolution
    with pytest.raises(zoo.ZooFileMissing, match="python -m testbed.serve.handling --variants nope"):
        figures.handling_ms(profiles, "nope")
    import json

    good = json.loads((profiles / "handling.json").read_text())["variants"]["hand_full"]
    f = tmp_path / "handling.json"
    for key, value, said in (("handling_ms", "x", "handling_ms = 'x'"), ("handling_ms", True, "handling_ms = True"),
                             ("handling_ms", float("inf"), "handling_ms = inf"), ("call_cpu_ms", 1e9, "call_cpu_ms"),
                             ("handling_ms", -1.0, "handling_ms = -1.0"), ("queries", 0, "queries = 0"),
                             ("queries", 2.7, "queries = 2.7"), ("runtime", "pytorch", "runtime = 'pytorch'")):
        f.write_text(json.dumps({"variants": {"m": dict(good, **{key: value})}}))
        with pytest.raises(zoo.ZooError, match=f"variant 'm': {said}"):
            figures.handling_ms(tmp_path, "m")
    f.write_text(json.dumps({"variants": {"m": {k: v for k, v in good.items() if k != "queries"}}}))
    with pytest.raises(zoo.ZooError, match="queries = None"):
        figures.handling_ms(tmp_path, "m")
    f.write_text("[1, 2]")
    with pytest.raises(zoo.ZooError, match="malformed"):
        figures.handling_ms(tmp_path, "m")
    with pytest.raises(ValueError, match="--variants: the list is empty"):
        handling.run(REPO_ROOT / "models" / "zoo", tmp_path, [], 200)
    with pytest.raises(ValueError, match="no 'variants' object"):  # refused before any server starts
        handling.run(REPO_ROOT / "models" / "zoo", tmp_path, ["hand_full"], 200)
    with pytest.raises(ValueError, match="is not a folder"):
        handling.run(REPO_ROOT / "models" / "zoo", tmp_path / "nope", ["hand_full"], 200)


def test_a_variant_has_a_row_per_runtime_and_the_plan_takes_its_runtimes(tmp_path):
    """Digits_small's LiteRT call is below the CPU clock's resolution; its TensorFlow call is not,
    and TensorFlow's cold call costs ~2x its warm one (models/profiles/handling.json): the
    triangle's plan (TensorFlow) carries that cold factor, not LiteRT's 1.0."""
    import json

    from testbed.plan.build import plan_experiment
    from testbed.serve import handling

    profiles = REPO_ROOT / "models" / "profiles"
    lite, tf = figures.measured_row(profiles, "digits_small"), figures.measured_row(profiles, "digits_small",
                                                                                     "tensorflow")
    assert lite["runtime"] == "litert" and tf["runtime"] == "tensorflow"
    assert figures.measured_row(profiles, "hand_full", "tensorflow")["runtime"] == "litert"  # none: the default's
    cold = figures.factors_of(tf)[1]
    assert cold > 1.5
    fig = plan_experiment(REPO_ROOT / "experiments" / "triangle.yaml").services["edgeb"]["digits_small"]
    assert fig.runtime == "tensorflow" and fig.cold_factor == pytest.approx(cold)
    assert "handling only" not in fig.source
    with pytest.raises(ValueError, match="have no tensorflow model"):  # refused before any server starts
        handling.run(REPO_ROOT / "models" / "zoo", profiles, ["hand_full"], 200, runtime="tensorflow")
    with pytest.raises(ValueError, match="not a runtime"):
        handling.run(REPO_ROOT / "models" / "zoo", profiles, ["hand_full"], 200, runtime="onnx")
    doc = json.loads((profiles / "handling.json").read_text())
    (tmp_path / "handling.json").write_text(json.dumps(dict(doc, other_runtimes=[1])))
    with pytest.raises(ValueError, match="'other_runtimes' is not an object of objects"):  # before measuring
        handling.run(REPO_ROOT / "models" / "zoo", tmp_path, ["digits_small"], 200, runtime="tensorflow")
    for others, said in (([1], "'other_runtimes' is not an object"),
                         ({"digits_small": {"tensorflow": dict(tf, runtime="litert")}},
                          "other_runtimes: the tensorflow row says runtime = 'litert'")):
        (tmp_path / "handling.json").write_text(json.dumps(dict(doc, other_runtimes=others)))
        with pytest.raises(zoo.ZooError, match=said + ".*--variants digits_small --runtime tensorflow"):
            figures.measured_row(tmp_path, "digits_small", "tensorflow")


def test_a_row_below_the_clocks_resolution_does_not_replace_one_above_it():
    """A breaker's review: -n 100 of TensorFlow's digits_small (0.8 ms x 100 = 0.08 s of CPU, under
    the 0.2 s the 10 ms ticks resolve) replaced the -n 1000 row, and its cold factor read 1.0."""
    from testbed.serve import handling
    manifest = zoo.load_manifest(REPO_ROOT / "models" / "zoo")
    good = figures.measured_row(REPO_ROOT / "models" / "profiles", "digits_small", "tensorflow")
    coarse = dict(good, queries=100, isolated_queries=30, call_cpu_ms=0.8, call_cpu_isolated_ms=1.0)
    assert figures.resolved(good) and not figures.resolved(coarse)
    # warm: 0.2 s / min(0.8, bare 0.55) ms = 362 queries; cold: n / 4 x 1.0 ms >= 0.2 s, n = 800
    assert figures.queries_to_resolve(coarse) == 800
    said: list[str] = []
    doc = {"variants": {}, "other_runtimes": {"digits_small": {"tensorflow": good}}}
    assert not handling._place_row(doc, manifest, "digits_small", coarse, said.append)
    assert doc["other_runtimes"]["digits_small"]["tensorflow"] is good and "NOT written" in said[0]
    doc = {"variants": {}}
    assert handling._place_row(doc, manifest, "digits_small", coarse, said.append)  # nothing better: kept, said
    assert doc["other_runtimes"]["digits_small"]["tensorflow"] is coarse and "WARNING" in said[1]


def test_a_runtime_without_its_own_row_is_a_note_of_the_plan(tmp_path):
    import json
    import shutil

    from testbed.plan.build import plan_experiment

    prof = tmp_path / "profiles"
    shutil.copytree(REPO_ROOT / "models" / "profiles", prof)
    doc = json.loads((prof / "handling.json").read_text())
    del doc["other_runtimes"]["digits_small"]
    (prof / "handling.json").write_text(json.dumps(doc))
    text = (REPO_ROOT / "experiments" / "triangle.yaml").read_text().replace(
        "../topologies/triangle.yaml", str(REPO_ROOT / "topologies" / "triangle.yaml"))
    exp = tmp_path / "e.yaml"
    exp.write_text(text + f"\nprofiles_dir: {prof}\n")
    notes = [n for n in plan_experiment(exp).notes if "has only litert's row" in n]
    assert len(notes) == 1 and "--runtime tensorflow --variants digits_small -n 1000" in notes[0]
    exp.write_text(text)
    assert not [n for n in plan_experiment(exp).notes if "has only" in n]


def test_plan_of_the_default_experiment_charges_handling():
    from testbed.plan.build import plan_experiment

    plan = plan_experiment(REPO_ROOT / "experiments" / "default.yaml")
    fig = plan.services["fesv"]["hand_full"]
    assert fig.handling_ms == figures.handling_ms(REPO_ROOT / "models" / "profiles", "hand_full")
    assert fig.busy_mean_ms == pytest.approx((fig.wall_mean_ms + fig.handling_ms) / 0.25)
    assert fig.expected_ms > fig.handling_ms + fig.wall_p95_ms * 0.9


def test_host_speed_times_the_cheapest_real_model_and_the_summary_warns():
    from testbed.results.summary import _headline
    from testbed.serve import handling

    got = handling.host_speed(REPO_ROOT / "models" / "zoo", REPO_ROOT / "models" / "profiles",
                              {"hand_lite": "litert", "resnet50": "litert", "digits_small": "litert"})
    assert got["model"] == "hand_lite" and got["calls"] >= 30  # the cheapest of >= 1 ms; digits is too short
    assert got["now_ms"] > 0.5 and got["ratio"] == pytest.approx(got["now_ms"] / got["profile_ms"], rel=0.01)
    assert handling.host_speed(REPO_ROOT / "models" / "zoo", REPO_ROOT / "models" / "profiles",
                               {"digits_small": "litert"}) == {}
    s = {"queries": 1, "duration_s": 1.0, "host_speed": dict(got, ratio=1.6, slow=True)}
    assert any(line.startswith("WARNING: this machine ran hand_lite's bare model call 1.6x slower")
               for line in _headline(s))
    s["host_speed"]["slow"] = False
    assert not any("bare model call" in line for line in _headline(s))


def test_host_speed_of_a_tensorflow_model_counts_its_pool_threads():
    """TensorFlow runs a graph's ops on its own pool threads: the calling thread's CPU alone read
    0.40 ms for digits_large against 2.59 ms profiled (0.15x). With the process's CPU the ratio is
    of the host's speed again, within what these shared VMs vary (0.48x to 1.87x seen): at least
    0.3x, twice the thread-only reading."""
    from testbed.serve import handling

    got = handling.host_speed(REPO_ROOT / "models" / "zoo", REPO_ROOT / "models" / "profiles",
                              {"digits_large": "tensorflow"})
    assert got["runtime"] == "tensorflow" and 0.3 <= got["ratio"] <= 3.0, got


def test_host_speeds_native_log_line_goes_to_the_log_not_the_console(tmp_path):
    """LiteRT's C++ logger writes "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." straight
    to fd 2; during the run's host-speed check it goes to logs/host_speed.log (it used to land in the
    middle of the run's console output)."""
    import subprocess
    import sys

    log = tmp_path / "logs" / "host_speed.log"
    code = ("import sys; from testbed.core.util import native_stderr_to; from testbed.serve import handling\n"
            f"with native_stderr_to({str(log)!r}):\n"
            f"    got = handling.host_speed({str(REPO_ROOT / 'models' / 'zoo')!r}, "
            f"{str(REPO_ROOT / 'models' / 'profiles')!r}, {{'hand_lite': 'litert'}})\n"
            "print('after', got['model'], file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "XNNPACK delegate" in log.read_text()
    assert "XNNPACK" not in res.stderr and res.stderr.strip() == "after hand_lite"  # fd 2 restored after the block


def test_every_shipped_row_has_its_answer_side_and_a_row_without_it_is_refused(tmp_path):
    """The answer's writing (t3 -> t3h) is part of the handling in both engines: the simulator
    charges ``answer_ms`` after the call. A row without it would leave the simulator's t3h at t3
    while the emulation's server takes its time to encode the answer."""
    import json

    profiles = REPO_ROOT / "models" / "profiles"
    doc = json.loads((profiles / "handling.json").read_text())
    rows = [(v, None, r) for v, r in doc["variants"].items()]
    rows += [(v, rt, r) for v, by in doc.get("other_runtimes", {}).items() for rt, r in by.items()]
    assert [f"{v}/{rt}" for v, rt, r in rows if "answer_ms" not in r] == []
    for v, rt, _r in rows:
        got = figures.measured_row(profiles, v, rt)
        assert 0.0 <= got["answer_ms"] <= got["handling_ms"]
    assert any(figures.measured_row(profiles, v, rt)["answer_ms"] > 0 for v, rt, _ in rows)
    old = dict(doc["variants"]["digits_small"])
    del old["answer_ms"]
    (tmp_path / "handling.json").write_text(json.dumps({"schema": 1, "variants": {"digits_small": old}}))
    with pytest.raises(zoo.ZooError, match=r"digits_small.*no answer_ms.*--variants digits_small"):
        figures.measured_row(tmp_path, "digits_small")
