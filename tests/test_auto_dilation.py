"""``time_dilation: auto`` (testbed.emu.autodilate): the decision rule on fakes of the measured
figures, niced jobs' CPU counted as available (a fake /proc), ``auto`` in the experiment file, k up
to 100. Pure logic: no root, no emulation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from testbed.core.errors import InputError
from testbed.emu import autodilate
from testbed.emu.autodilate import (
    Machine,
    Warmup,
    choose,
    decision,
    k_grid,
    keep_warmups,
    kept_warmups,
    needed_k,
    next_candidate,
)
from testbed.emu.machine import NICED_OTHER, competing_cores, cpu_by_process, role_of
from testbed.plan.build import build_plan, plan_experiment
from testbed.plan.dilation import check_dilation, dilate, with_time_dilation
from testbed.plan.resolved import PlanError
from testbed.serve.handling import CLK_TCK
from testbed.spec.experiment import MAX_TIME_DILATION, ConfigError, load_experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
QUIET = Machine(cpus=2, competing=0.0, niced=0.0)


def _warmup(k: float, host_ms: float | None = 0.5, ovs_ms: float = 2.0, testbed_ms: float = 4.0,
            server_ms: float = 5.0, planned_ms: float = 5.0, queries: int = 200, window_s: float = 10.0) -> Warmup:
    """A warm-up at k whose CPU per query is what is asked (ms): Open vSwitch, the rest of the
    testbed, the servers (cores = ms x queries / window / 1000)."""
    to_cores = queries / window_s / 1e3
    return Warmup(k=k, queries=queries, answered=queries, window_s=window_s,
                  role_cores={"ovs-vswitchd": ovs_ms * to_cores, "sources": testbed_ms * to_cores,
                              "inference servers": server_ms * to_cores, "other": 1.0},
                  host_ms=host_ms, planned_network_ms=planned_ms, hops=3.0, success=1.0)


# ----------------------------------------------------------------------------- the rule

def test_a_light_load_on_a_quiet_machine_needs_no_dilation():
    n = needed_k(_warmup(1.0, host_ms=0.4), rate_qps=20, cluster_cores=1.5, machine=QUIET)
    assert n.k == 1.0 and n.k_cpu < 1 and n.k_network == pytest.approx(0.4)
    assert next_candidate([(1.0, n.k)]) is None and decision([(1.0, n.k)]) == (1.0, True)


def test_the_network_share_scales_as_one_over_k_against_its_target():
    # 6 ms of host share at k = 2 against a 1 ms target (planned network 5 ms: 10 % is 0.5 ms): k = 12
    n = needed_k(_warmup(2.0, host_ms=6.0, planned_ms=5.0), rate_qps=20, cluster_cores=1.5, machine=QUIET)
    assert n.target_ms == 1.0 and n.k_network == pytest.approx(12.0) and n.binding() == "network"
    # a long planned network time widens the target: 10 % of 40 ms
    n = needed_k(_warmup(2.0, host_ms=6.0, planned_ms=40.0), rate_qps=20, cluster_cores=1.5, machine=QUIET)
    assert n.target_ms == pytest.approx(4.0) and n.k_network == pytest.approx(3.0)


def test_the_cpu_criterion_takes_the_plans_peak_rate_and_the_available_cores():
    # 600 q/s x (2 + 4) ms = 3.6 cores of the testbed, servers capped at their 1.5 cores: 5.1 at k = 1
    w = _warmup(10.0, host_ms=0.1)
    quiet = needed_k(w, rate_qps=600, cluster_cores=1.5, machine=QUIET)
    assert quiet.needed_cores == pytest.approx(5.1) and quiet.k_cpu == pytest.approx(5.1)
    assert quiet.k_ovs == pytest.approx(600 * 2.0 / 1e3 / 0.5)
    busy = needed_k(w, rate_qps=600, cluster_cores=1.5, machine=Machine(2, 1.0, 0.0))  # 1 core available
    assert busy.k_cpu == pytest.approx(10.2) and busy.k > 10.0
    hogs = Machine(2, 2.0, 0.0)  # two always-busy jobs: CFS still gives a waking process 2 / 3 of a core
    assert hogs.available == pytest.approx(2 / 3)


def test_niced_jobs_count_as_available():
    w = _warmup(4.0, host_ms=0.1)
    niced = needed_k(w, rate_qps=200, cluster_cores=1.0, machine=Machine(2, 0.0, 1.9))
    quiet = needed_k(w, rate_qps=200, cluster_cores=1.0, machine=QUIET)
    assert niced.k == quiet.k


def test_a_candidate_too_small_leads_to_a_warm_up_at_the_k_it_asks_for_then_stops():
    assert next_candidate([(1.0, 7.3)]) == 7.5
    assert next_candidate([(1.0, 7.3), (7.5, 6.0)]) is None  # carried, not enough room to go lower
    assert decision([(1.0, 7.3), (7.5, 6.0)]) == (7.5, True)
    assert next_candidate([(4.0, 4.02)]) == 4.5  # asks for barely more: the next step of the grid
    assert next_candidate([(60.0, 300.0)]) is None  # past the largest k: no warm-up there
    assert decision([(60.0, 300.0)]) == (300.0, False)


def test_a_generous_candidate_is_checked_lower_and_a_failed_k_is_not_retried():
    assert next_candidate([(8.0, 2.2)]) == 2.5  # carried with room: try the smaller k
    assert next_candidate([(8.0, 2.2), (2.5, 3.1)]) == 3.5  # 2.5 failed; between it and 8
    assert next_candidate([(8.0, 2.2), (2.5, 3.1), (3.5, 3.2)]) is None
    assert decision([(8.0, 2.2), (2.5, 3.1), (3.5, 3.2)]) == (3.5, True)
    assert decision([(8.0, 2.2), (2.5, 3.1)]) == (8.0, True)  # out of warm-ups: the smallest that carried
    assert next_candidate([(4.0, 1.2), (1.5, 1.4)]) is None
    assert decision([(4.0, 1.2), (1.5, 1.4)]) == (1.5, True)


def test_a_k_above_10_that_carried_is_checked_at_the_smaller_k_it_asks_for_up_to_10():
    """Above k = 10 the clusters' CFS period is shorter than the model's: a warm-up that carried
    k = 11 asking for 9.2 leads to one at 9.5 though 9.5 > 11 / 1.5; one asking for more than 10
    does not, nor one at 10 or below; when none at 10 or below carries, the smallest that did stays."""
    assert autodilate.FULL_PERIOD_K == 10.0
    assert next_candidate([(3.5, 17.4), (18.0, 10.6), (11.0, 9.2)]) == 9.5
    assert next_candidate([(11.0, 10.4)]) is None  # 10.4 is 11 on the grid
    assert next_candidate([(12.0, 9.8)]) == 10.0
    assert next_candidate([(10.0, 8.2)]) is None  # at 10 the period is the model's: room as before
    assert next_candidate([(11.0, 9.2), (9.5, 9.7)]) == 10.0  # 9.5 fell short: 10, the next step
    assert next_candidate([(11.0, 9.2), (9.5, 9.7), (10.0, 10.3)]) is None
    assert decision([(11.0, 9.2), (9.5, 9.7), (10.0, 10.3)]) == (11.0, True)  # none at 10 or below carried


def test_the_grid_is_finer_at_small_k():
    assert [k_grid(x) for x in (0.2, 1.01, 9.8, 10.2, 19.5, 21, 99)] == [1, 1.5, 10, 11, 20, 25, 100]


def test_choose_warms_up_until_a_k_carries_the_load_and_says_why(monkeypatch, tmp_path):
    plan = build_plan(load_experiment(TRIANGLE), base_dir=TRIANGLE.parent)
    seen = []

    def warm(p, k, folder):  # the host's share falls as 1 / k from 8 ms at k = 1
        seen.append(k)
        return _warmup(k, host_ms=8.0 / k, planned_ms=5.0)

    lines = []
    console = type("C", (), {"print": lambda self, line, **kw: lines.append(line)})()
    got = choose(plan, console, tmp_path, warm=warm, machine=QUIET)
    assert seen == [1.0, 8.0] and got.k == 8.0 and got.verified
    assert any("too small (needs 8.0, set by network)" in ln for ln in lines)
    assert lines[-1].startswith("time dilation auto: k = 8: a warm-up at it carried the load")
    assert got.to_dict()["warmups"][1]["need"]["k"] == pytest.approx(8.0)  # the 1 / k law holds: exactly carried


def test_a_warm_up_the_speed_check_refused_raises_k_to_its_floor_and_nothing_below_it_is_tried(tmp_path):
    plan = build_plan(load_experiment(TRIANGLE), base_dir=TRIANGLE.parent)
    seen = []

    def warm(p, k, folder):  # a host 35x slower than the profiles: 0.5 cores need k >= 17.6 on one thread
        seen.append(k)
        if k < 17.6:
            raise autodilate.SpeedFloor("refused", k, 17.6, "edgeb")
        return _warmup(k, host_ms=0.1)  # carried with room to spare: the rule alone would try lower
    lines = []
    console = type("C", (), {"print": lambda self, line, **kw: lines.append(line)})()
    got = choose(plan, console, tmp_path, warm=warm, machine=QUIET)
    assert seen == [1.0, 18.0] and got.k == 18.0 and got.verified
    assert any("cluster edgeb's quota at its profile's speed needs k >= 17.6" in ln for ln in lines)


def test_the_speed_floor_is_read_from_the_clusters_ready_files(tmp_path):
    from testbed.plan.speeds import ClusterSpeed, ModelSpeed
    ms = ModelSpeed(bare_ms=0.259, profile_ms=0.0074, factor=35.0, weight=1.0, calls=20, scale=35.0, residual=1.0)
    cs = ClusterSpeed(mode="profile", time_dilation=4.0, cores=0.5, usable_cores=1.0, factor=35.0, scale=35.0,
                      call_scale=35.0, residual=1.0, quota_cores=17.5, applied_by="pad", models={"digits_small": ms})
    assert not cs.fits(2) and cs.least_dilation(2) == 17.5
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "edgeb.ready.json").write_text(json.dumps({"speed": cs.model_dump(mode="json")}))
    (tmp_path / "clusters" / "edgec.ready.json").write_text(json.dumps({"pid": 1}))  # not ready with a speed
    assert autodilate.speed_floor(tmp_path, 2) == (17.5, "edgeb")
    assert autodilate.speed_floor(tmp_path / "nothing", 2) is None


def test_choose_refuses_a_load_past_the_largest_k(tmp_path):
    plan = build_plan(load_experiment(TRIANGLE), base_dir=TRIANGLE.parent)
    with pytest.raises(InputError, match="above the largest, 100"):
        choose(plan, None, tmp_path, warm=lambda p, k, f: _warmup(k, host_ms=500.0 / k * 300), machine=QUIET)


def test_kept_warm_ups_are_reused_only_for_the_same_plan_recently_and_under_a_similar_load(tmp_path):
    w = _warmup(2.0)
    keep_warmups(tmp_path, "abc", QUIET, [w])
    got, why = kept_warmups(tmp_path, "abc", Machine(2, 0.2, 0.0))
    assert got == [w] and "min ago" in why
    assert kept_warmups(tmp_path, "other", QUIET) == ([], "")
    assert kept_warmups(tmp_path, "abc", Machine(2, 0.5, 0.0)) == ([], "")  # other jobs changed
    assert kept_warmups(tmp_path, "abc", QUIET, now=os.path.getmtime(tmp_path / "warmups.json") + 7200) == ([], "")


def test_the_warm_up_is_short_and_stated():
    assert autodilate.warmup_seconds(20.0, 1.0) == pytest.approx(10.0)  # 200 queries at 20 q/s
    assert autodilate.warmup_seconds(4.0, 1.0) == pytest.approx(15.0)  # capped at 15 s of wall clock (60 queries)
    assert autodilate.warmup_seconds(1000.0, 10.0) == pytest.approx(0.5)  # at least 5 s of wall clock
    assert autodilate.warmup_seconds(20.0, 15.0) == pytest.approx(2.5)  # at least 50 queries


def test_a_warm_up_runs_the_probes_of_the_scenarios_events_but_none_of_its_events():
    """The warm-up's events are moved after its load (they do not happen), so its probes run as the
    run's do (netplan: probe hosts and path probes come from the plan's changes); warm-ups are
    reused only for a plan whose events need the same probes."""
    from testbed.emu.netplan import has_path_probes, probed_links
    from testbed.plan.event_resolution import events_after_end

    plan = plan_experiment(REPO / "experiments" / "scenario-linkfail.yaml")
    assert plan.changes and has_path_probes(plan)
    seconds = 4.0
    warm = autodilate.warmup_plan(plan, 3.0, seconds)
    assert warm.time_dilation == 3.0 and warm.experiment.capture is None and not warm.experiment.emulation.rtt_check
    assert [c.t_s for c in warm.changes] == [c.t_s + seconds + autodilate.EVENTS_AFTER_S for c in plan.changes]
    assert events_after_end(warm.changes, seconds) and all(c.t_s >= seconds for c in warm.changes)
    assert has_path_probes(warm) and probed_links(warm) == probed_links(plan)
    later = plan.model_copy(update={"changes": [c.model_copy(update={"t_s": c.t_s + 1}) for c in plan.changes]})
    assert autodilate.plan_key(later) == autodilate.plan_key(plan)  # the times do not change the probes
    assert autodilate.plan_key(plan.model_copy(update={"changes": []})) != autodilate.plan_key(plan)


# ----------------------------------------------------------------------------- niced CPU, a fake /proc

def _proc(root: Path, procs: dict[int, tuple]) -> Path:
    """A fake /proc: per pid, (utime + stime in clock ticks, nice[, runnable s]) in a stat line of
    proc(5)'s shape (and a schedstat line: run ns, wait ns, slices)."""
    for pid, (ticks, nice, *runnable) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 3 + [str(nice)] + ["0"] * 20
        (d / "stat").write_text(f"{pid} (a (b) c) " + " ".join(fields) + "\n")
        if runnable:
            (d / "schedstat").write_text(f"{int(runnable[0] * 0.4e9)} {int(runnable[0] * 0.6e9)} 7\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return root


def test_niced_processes_cpu_is_counted_as_yielding_from_their_stat_lines(tmp_path):
    t = int(CLK_TCK)
    before = cpu_by_process(_proc(tmp_path / "a", {10: (0, 0), 11: (0, 19), 12: (0, -5), 13: (0, 0)}))
    assert before[11] == (0.0, 19, 0.0)
    after = cpu_by_process(_proc(tmp_path / "b", {10: (2 * t, 0), 11: (4 * t, 19), 12: (t, -5), 13: (9 * t, 0),
                                                   14: (2 * t, 5)}))
    compete, niced = competing_cores(before, after, 2.0, 0, exclude=frozenset({13}))
    assert compete == pytest.approx((2 + 1) / 2)  # pids 10 and 12 (nice 0, -5); 13 is this run's own
    assert niced == pytest.approx((4 + 2) / 2)  # pid 11 (19) and 14 (5, seen only after)
    # under `nice -n 5` the run yields to nobody at 5: a job at nice 5 competes with it
    compete5, niced5 = competing_cores(before, after, 2.0, 5, exclude=frozenset({13}))
    assert compete5 == pytest.approx((2 + 1 + 2) / 2) and niced5 == pytest.approx(4 / 2)


def test_a_job_that_waits_for_the_cpu_counts_for_what_it_asks_not_only_what_it_got(tmp_path):
    t = int(CLK_TCK)
    # a hog on a saturated machine: 0.5 s of CPU in 2 s, but runnable all 2 s (on a CPU or waiting)
    before = cpu_by_process(_proc(tmp_path / "a", {20: (0, 0, 10.0), 21: (0, 10, 10.0)}))
    after = cpu_by_process(_proc(tmp_path / "b", {20: (t // 2, 0, 12.0), 21: (t // 2, 10, 12.0)}))
    compete, niced = competing_cores(before, after, 2.0, 0)
    assert compete == pytest.approx(1.0) and niced == pytest.approx(0.25)  # niced: what it used


def test_the_cpu_sampler_names_niced_jobs_apart():
    assert role_of("python3 -c while True: pass", nice=10, own_nice=0) == NICED_OTHER
    assert role_of("python3 -c while True: pass", nice=0, own_nice=0) == "other"
    assert role_of("python -m testbed.emu.source x.json", nice=10, own_nice=0) == "sources"


# ----------------------------------------------------------------------------- the spec and the plan

def _triangle_with(tmp_path: Path, value) -> Path:
    data = yaml.safe_load(TRIANGLE.read_text())
    data["emulation"]["time_dilation"] = value
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("value", ["auto", "Auto", " AUTO "])
def test_time_dilation_auto_is_accepted_in_the_experiment_file(value, tmp_path):
    plan = plan_experiment(_triangle_with(tmp_path, value))
    assert plan.dilation_auto and plan.time_dilation == 1.0
    with pytest.raises(PlanError, match="chosen before the emulation"):
        dilate(plan)
    chosen = with_time_dilation(plan, 12)
    assert not chosen.dilation_auto and dilate(chosen).time_dilation == 12.0


def test_a_dilation_that_is_neither_a_number_nor_auto_is_refused_naming_both(tmp_path):
    with pytest.raises(ConfigError, match="give a number .* or 'auto'"):
        load_experiment(_triangle_with(tmp_path, "fast"))


def test_k_goes_up_to_100():
    assert MAX_TIME_DILATION == 100.0 and check_dilation(100) == 100.0
    with pytest.raises(PlanError, match="outside 1 .. 100"):
        check_dilation(100.5)


def test_a_share_that_does_not_fall_with_k_is_fitted_as_a_floor_and_does_not_drive_k(tmp_path):
    from testbed.emu.autodilate import network_floor

    assert network_floor([(2.0, 6.0)]) == 0.0  # one k: all of it is taken to fall as 1 / k
    assert network_floor([(1.0, 9.0), (4.0, 3.0)]) == pytest.approx(1.0)  # 1 + 8 / k
    assert network_floor([(1.5, 10.2), (15.5, 10.4)]) == pytest.approx(10.3)  # none of it falls
    plan = build_plan(load_experiment(TRIANGLE), base_dir=TRIANGLE.parent)
    seen = []

    def warm(p, k, folder):  # 10 ms that no k removes, and 3 ms that falls as 1 / k
        seen.append(k)
        return _warmup(k, host_ms=10.0 + 3.0 / k, planned_ms=5.0)

    got = choose(plan, None, tmp_path, warm=warm, machine=QUIET)
    assert seen[:2] == [1.0, 13.0] and got.verified and got.k <= 3.0
    assert "does not fall with k" in " ".join(got.why)


def test_the_testbeds_cpu_that_does_not_fall_with_the_rate_is_taken_from_the_budget(tmp_path):
    """0.12 cores of the testbed's CPU whatever the rate, 27 ms per query on top, beside two CPU hogs
    (2/3 of a core available): counted per query it made each warm-up at a larger k ask for a larger
    k still; fitted as fixed, the warm-ups agree."""
    from testbed.emu.autodilate import cpu_floor

    def warmup(k: float) -> Warmup:
        qps = 123.0 / k
        return Warmup(k=k, queries=round(qps * 40), answered=round(qps * 40), window_s=40.0,
                      role_cores={"ovs-vswitchd": 0.06 + 0.013 * qps, "link emulators": 0.06 + 0.014 * qps,
                                  "inference servers": 0.0025 * qps}, host_ms=0.2, planned_network_ms=20.0,
                      hops=3.0, success=1.0)

    hogs = Machine(2, 2.0, 0.0)
    ws = [warmup(9.5), warmup(30.0)]
    fixed, ovs_fixed = cpu_floor(ws)
    assert fixed == pytest.approx(0.12, abs=0.01) and ovs_fixed == pytest.approx(0.06, abs=0.01)
    assert cpu_floor(ws[:1]) == (0.0, 0.0)  # one rate: all of it counted per query
    per_query = [needed_k(w, 123.0, 2.0, hogs).k for w in ws]
    assert per_query[1] > per_query[0] * 1.5  # the fixed part, per query, grows as the rate falls
    fitted = [needed_k(w, 123.0, 2.0, hogs, fixed_cores=(fixed, ovs_fixed)).k for w in ws]
    assert fitted[0] == pytest.approx(fitted[1], rel=0.05)
    # 123 q/s x (27 + 2.5) ms = 3.6 cores at k = 1 over (1/3 - 0.12) cores of budget
    assert fitted[0] == pytest.approx(123 * 0.0295 / (hogs.available / 2 - 0.12), rel=0.05)
    assert fitted[0] < per_query[1]
