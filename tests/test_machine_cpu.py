"""The machine's CPU over an emulation's load (testbed/emu/machine.py) and the summary lines
it gives. The sampler is exercised on real processes; the headline on given figures."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from testbed.emu import machine
from testbed.emu.machine import CLK_TCK, CpuSampler, MachineCpu, Sample, cores_between, machine_ticks, role_of
from testbed.emu.machine import NICED_OTHER as NICED
from testbed.results.summary import _headline, latency_figures

#: A child that burns ``s`` seconds of CPU in its one thread and prints the share of one CPU it got
#: (CPU over wall time of the burn). Started in a session of its own, it first asks for the highest
#: priority (nice -20, and -20 for its session's autogroup, which the kernel weighs against the other
#: sessions'; as root), so that other jobs' CPU-bound processes on a shared machine do not take part
#: of its CPU.
BURN = ("import os, time\ntry:\n    os.setpriority(os.PRIO_PROCESS, 0, -20)\n"
        "    with open('/proc/self/autogroup', 'w') as f:\n        f.write('-20')\nexcept OSError:\n    pass\n"
        "w, t = time.perf_counter(), time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
        "print((time.process_time() - t) / (time.perf_counter() - w))\n")
#: The role the burning child takes (by a marker in its command line, matched first): only it has it,
#: whatever else runs on the machine (another run's sources would count under "sources").
BURNER = "test burner"


def test_roles_follow_the_command_line():
    assert role_of("/x/python -m testbed.emu.linkemu --links l.json") == "link emulators"
    assert role_of("python -m testbed.serve.server clusters/a.server.json") == "inference servers"
    assert role_of("python -m testbed.emu.source sources/sea.json") == "sources"
    assert role_of("python -m testbed.sdn.launcher --observe-links") == "controller"
    assert role_of("ovs-vswitchd unix:/run/x/db.sock") == "ovs-vswitchd"
    assert role_of("python -m testbed.emu.probe --control c.sock") == "link probes"  # a scenario's probes
    assert role_of("stress-ng --cpu 2") == "other"


def test_machine_ticks_read_proc_stat(tmp_path):
    busy, steal = machine_ticks()
    assert busy > 0 and steal >= 0
    f = tmp_path / "stat"
    f.write_text("cpu  100 20 30 900 5 1 2 7 0 0\ncpu0 1 2 3 4\n")
    from testbed.emu.machine import CLK_TCK

    assert machine_ticks(f) == pytest.approx(((100 + 20 + 30 + 1 + 2) / CLK_TCK, 7 / CLK_TCK))
    f.write_text("intr 1 2\n")
    with pytest.raises(ValueError, match="no 'cpu' line"):
        machine_ticks(f)


def _sampled_around_a_burning_child(burn_s: float, interval_s: float,
                                    monkeypatch) -> tuple[MachineCpu, float, float]:
    """(the sampler's result, the share of one CPU the child's burn got, the longest gap between two
    samples in s) over a child that burns ``burn_s`` of CPU in one thread, with 0.3 s of sampling
    before and after it. The child has a role of its own (:data:`BURNER`, among the testbed's)."""
    marker = f"testbed-{BURNER.replace(' ', '-')}-{os.getpid()}"
    monkeypatch.setattr(machine, "CPU_ROLES", ((BURNER, marker), *machine.CPU_ROLES))
    monkeypatch.setattr(machine, "TESTBED_ROLES", (*machine.TESTBED_ROLES, BURNER))
    s = CpuSampler(interval_s=interval_s)
    s.start()
    time.sleep(0.3)
    proc = subprocess.run([sys.executable, "-c", BURN.format(s=burn_s), marker], check=True, timeout=60,
                          capture_output=True, text=True, start_new_session=True)
    time.sleep(0.3)
    s.stop()
    gap = max(b.t - a.t for a, b in zip(s.samples[:-1], s.samples[1:], strict=True))
    return s.result(), float(proc.stdout), gap


def test_a_process_that_exits_inside_the_window_keeps_its_cpu(monkeypatch):
    """A child that burns 0.6 s of CPU and exits mid-window: its role keeps what it used until the
    last sample before its exit, so at most one step between two samples is lost (0.1 s when the
    sampler keeps its interval; on a busy machine its thread waits for a CPU, and the step is the
    longest gap it left). Machine ticks are read to within a tick per CPU at either end."""
    m, _, gap = _sampled_around_a_burning_child(burn_s=0.6, interval_s=0.1, monkeypatch=monkeypatch)
    used = m.by_role[BURNER] * m.window_s
    assert 0.6 - max(0.15, gap) <= used <= 0.75, (gap, m)  # 0.6 s and the interpreter's start, less its last step
    assert m.testbed_cores >= m.by_role[BURNER] and 0 < m.busy_cores <= m.cpus * (1 + 2 / (CLK_TCK * m.window_s))


def _samples(busy: list[float], t0: float = 100.0) -> list[Sample]:
    """Cumulative samples 1 s apart whose machine busy seconds grow by ``busy[i]`` in step i."""
    out, acc = [Sample(t=t0, busy_s=0.0, steal_s=0.0, by_role={"sources": 0.0})], 0.0
    for i, b in enumerate(busy, 1):
        acc += b
        out.append(Sample(t=t0 + i, busy_s=acc, steal_s=0.0, by_role={"sources": 0.5 * i}))
    return out


def test_the_window_is_the_loads_and_a_saturated_stretch_is_counted():
    """The window is widened to the samples around [t_from, t_to], the start-up before it is not
    counted, and seconds at >= 90 % are counted even when the mean is below."""
    samples = _samples([2.0, 2.0, 0.4, 0.4, 0.4, 0.4])  # a 2 s start-up burst, then 20 %
    m = cores_between(samples, 102.0, 106.0, cpus=2)
    assert m.window_s == 4 and m.busy_cores == pytest.approx(0.4) and m.saturated_s == 0
    m = cores_between(samples, None, None, cpus=2)
    assert m.window_s == 6 and m.saturated_s == 2 and m.peak_share == 1.0
    assert m.busy_cores == pytest.approx(5.6 / 6, abs=0.001) and m.by_role == {"sources": 0.5}
    assert cores_between(samples, 102.2, 102.8, cpus=2).window_s == 1  # inside one interval: its two samples
    assert cores_between(samples[:1], None, None) is None


def _role_samples(steps: list[dict[str, float]]) -> list[Sample]:
    """Cumulative samples 1 s apart whose roles' CPU seconds grow by ``steps[i]`` in step i."""
    out, acc = [Sample(t=0.0, busy_s=0.0, steal_s=0.0, by_role={})], {}
    for i, step in enumerate(steps, 1):
        acc = {r: acc.get(r, 0.0) + step.get(r, 0.0) for r in {*acc, *step}}
        out.append(Sample(t=float(i), busy_s=sum(acc.values()), steal_s=0.0, by_role=dict(acc)))
    return out


def test_seconds_short_of_cpu_count_the_emulations_own_cpu_against_what_other_jobs_left():
    """A step counts in ``short_s`` when the testbed's roles and the servers used >= 90 % of the
    cores available beside the step's other jobs (niced ones yield); the mean hides such peaks."""
    calm, peak = {"sources": 0.2, "inference servers": 0.2}, {"ovs-vswitchd": 1.0, "inference servers": 0.9}
    m = cores_between(_role_samples([calm] * 8 + [peak] * 2), cpus=2)
    assert m.short_s == 2 and m.testbed_cores + m.by_role["inference servers"] < 0.9 * 2
    beside = {"sources": 0.5, "inference servers": 0.5, "other": 1.0}  # 1 of the 1 core left
    assert cores_between(_role_samples([beside] * 3), cpus=2).short_s == 3
    niced = {"sources": 0.5, "inference servers": 0.5, NICED: 1.0}  # 1 of 2: niced jobs yield
    assert cores_between(_role_samples([niced] * 3), cpus=2).short_s == 0


def test_the_run_reads_its_samples_or_says_why_not(tmp_path):
    from testbed.emu.machine import SAMPLES_FILE, CpuSamples, machine_cpu_of_run

    assert machine_cpu_of_run(tmp_path, 0, 1) == (None, "")  # a simulation: nothing to say
    whole = CpuSamples(cpus=2, interval_s=1.0, samples=_samples([1.0] * 4)).model_dump_json()
    (tmp_path / SAMPLES_FILE).write_text(whole[:40])
    got, why = machine_cpu_of_run(tmp_path, 100, 104)
    assert got is None and why.startswith(f"{SAMPLES_FILE} cannot be read (ValidationError)")
    (tmp_path / SAMPLES_FILE).write_text(whole)
    got, why = machine_cpu_of_run(tmp_path, 100, 104)
    assert why == "" and got.busy_cores == pytest.approx(1.0) and got.cpus == 2  # 1 s busy per second
    (tmp_path / SAMPLES_FILE).write_text(CpuSamples(cpus=2, interval_s=1.0, samples=_samples([])).model_dump_json())
    got, why = machine_cpu_of_run(tmp_path, 100, 100.5)
    assert got is None and "fewer than two samples cover the load" in why
    assert f"Machine CPU during the load: not known: {why}." in _headline(
        {"queries": 1, "duration_s": 1.0, "machine_cpu": {}, "machine_cpu_note": why})


def _summary(busy: float, other: float = 0.0, steal: float = 0.0, saturated: float = 0.0) -> dict:
    roles = {"inference servers": 0.5, "link emulators": 0.4, "sources": 0.3, "other": other}
    return {"queries": 10, "duration_s": 10.0, "machine_cpu": {
        "window_s": 10.0, "cpus": 2, "busy_cores": busy, "steal_cores": steal, "by_role": roles,
        "testbed_cores": 0.7, "saturated_s": saturated, "peak_share": 1.0 if saturated else 0.7}}


def test_the_summary_warns_when_the_machine_was_saturated():
    lines = _headline(_summary(1.95, other=0.6, saturated=9.0))
    assert any(x.startswith("Machine CPU during the load (10 s, first to last query): 1.95 of 2 CPUs busy, 0.00 "
                            "stolen by the hypervisor (98 % in all; at least 90 % for 9 s of it") for x in lines)
    warn = [x for x in lines if x.startswith("WARNING: the machine's CPUs were 98 % busy or stolen")]
    assert len(warn) == 1 and "nor the 0.60 cores of other processes" in warn[0] and "hypervisor" not in warn[0]
    lines = _headline(_summary(1.2))
    assert any(x.startswith("Machine CPU during the load (10 s, first to last query): 1.20 of 2") for x in lines)
    assert not any(x.startswith("WARNING: the machine") for x in lines)
    stretch = [x for x in _headline(_summary(1.2, saturated=3.0)) if x.startswith("WARNING: the machine")]
    assert stretch == ["WARNING: the machine's CPUs were at least 90 % busy or stolen for 3 s of the 10 s load: "
                       "queries of those seconds waited for a CPU in the testbed's own processes, which the "
                       "simulator does not model."]
    assert not any(x.startswith("Machine CPU") for x in _headline({"queries": 1, "duration_s": 1.0}))
    bad = _headline({"queries": 1, "duration_s": 1.0, "machine_cpu": {"cpus": 0}})
    assert any(x.startswith("Machine CPU during the load: not known: summary.json's machine_cpu is malformed")
               for x in bad)


def test_the_hypervisors_steal_counts_toward_saturation():
    """A VM whose host gives its vCPUs to others: 1.6 busy + 0.3 stolen of 2 CPUs is 95 %."""
    warn = [x for x in _headline(_summary(1.6, steal=0.3)) if x.startswith("WARNING: the machine's CPUs were 95 %")]
    assert len(warn) == 1 and "nor the 0.30 cores the hypervisor gave to other machines" in warn[0]


def test_network_excess_is_network_time_above_the_planned_rtt():
    df = pd.DataFrame({"http_status": [200, 200, 200, 503], "e2e_ms": [10.0, 12.0, 30.0, 5.0],
                       "network_ms": [6.0, 7.0, 20.0, None], "expected_rtt_ms": [4.0, 4.0, 4.0, 4.0]})
    got = latency_figures(df)["network_excess_ms"]
    assert got["p50"] == 3.0 and got["p95"] == pytest.approx(14.7)  # excesses 2, 3, 16: linear quantile
    assert latency_figures(df.drop(columns="expected_rtt_ms"))["network_excess_ms"] == {"p50": None, "p95": None}


def test_a_busy_thread_of_the_testbeds_own_processes_is_kept_and_warned(monkeypatch):
    """A child whose one thread burns a CPU for 1.5 s is kept as a hot thread (its own, sampled from
    /proc/<pid>/task), and the summary warns of it; a quiet thread is not kept.

    A thread counts for the steps in which it used at least 90 % of one CPU (the sampler's rule), so
    never for more than the burn over 0.9 (1.67 s, 1.7 after rounding, at most 1.75). It counts for at
    least one whole 0.25 s step when its burn got at least 95 % of a CPU: then the whole steps inside
    the burn average at least 94 %. The child asks for the highest priority, which two CPU-bound jobs
    beside it on two CPUs do not take from it; when it still got less (not root, or more jobs than
    that), that last check is skipped, saying the share it got."""
    summ = _summary(1.2)
    summ["machine_cpu"]["hot_threads"] = {"ovs-vswitchd: 'ovs-vswitchd' (pid 7, thread 7)": 3.0,
                                          "sources: 'python' (pid 9, thread 9)": 0.5}
    warn = [x for x in _headline(summ) if x.startswith("WARNING: a single thread")]
    assert warn == ["WARNING: a single thread of the testbed's own processes was at least 90 % of one CPU busy for a "
                    "tenth or more of the 10 s load: ovs-vswitchd: 'ovs-vswitchd' (pid 7, thread 7) for 3 s. What it "
                    "forwards or sends waited behind it even where the machine had idle CPUs, which shows up as "
                    "network time that the simulator does not have."]
    assert not any(x.startswith("WARNING: a single thread") for x in _headline(_summary(1.2)))

    m, share, _ = _sampled_around_a_burning_child(burn_s=1.5, interval_s=0.25, monkeypatch=monkeypatch)
    hot = {k: v for k, v in m.hot_threads.items() if k.startswith(f"{BURNER}: ")}
    assert len(hot) <= 1 and all(secs <= 1.75 for secs in hot.values()), (share, m.hot_threads)
    # the sampler's own process sleeps
    assert not any(k.startswith("run process: ") for k in m.hot_threads), m.hot_threads
    if share < 0.95:
        pytest.skip(f"the burning thread got {share:.0%} of one CPU (other jobs' CPU-bound processes took the rest), "
                    f"not the 95 % that makes a whole step at >= 90 % certain")
    assert len(hot) == 1, (share, m.hot_threads)
    (label, secs), = hot.items()
    assert "(pid " in label and ", thread " in label and 0.25 <= secs <= 1.75, (share, m.hot_threads)


def test_a_step_too_short_to_measure_a_threads_share_does_not_count_it_hot():
    """Between samples 10 ms apart one clock tick of a thread reads as a whole CPU: such a step
    (under :data:`machine.HOT_STEP_TICKS` ticks) counts no hot thread; a 0.25 s step does."""
    t = "sources: 'python' (pid 9, thread 9)"
    short = 0.5 * machine.HOT_STEP_TICKS / CLK_TCK
    samples = [Sample(t=0.0, busy_s=0.0, steal_s=0.0, by_role={}),
               Sample(t=0.25, busy_s=0.25, steal_s=0.0, by_role={}, hot_threads={t: 1.0}),
               Sample(t=0.25 + short, busy_s=0.25 + short, steal_s=0.0, by_role={},
                      hot_threads={t: 1.0, "run process: x": 1.0})]
    got = cores_between(samples, cpus=2)
    assert got is not None and got.hot_threads == {t: 0.2}  # 0.25 s, rounded to 0.1 s
