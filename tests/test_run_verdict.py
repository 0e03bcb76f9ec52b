"""An emulated run's verdict before its summary (testbed.results.runs.finish_emulation,
testbed.results.verdict), and the "too small a k" rule with ``--strict``.

The unit tests use a run directory whose records come from a short simulation of the triangle (real
records of the agreed schema) and replace only the summary step: by a function that raises, and by
a child process that dies of SIGSEGV. The emulation tests (marked ``emulation``, root, under
``flock /tmp/emu.lock``) run the triangle for real."""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from testbed.core.errors import EXIT_ALL_FAILED, EXIT_BRINGUP, EXIT_COMPONENT_DIED, EXIT_NOTHING_MEASURED, EXIT_OK
from testbed.emu.context import EmulationOutcome
from testbed.emu.health import RunRecord
from testbed.plan.build import plan_experiment
from testbed.plan.transfer import dilation_figures, host_share_ms
from testbed.results.html_report import build_report, run_status
from testbed.results.render import _headline
from testbed.results.runs import finish_emulation, run_simulation, summarise_run
from testbed.results.verdict import (
    SummaryFailed,
    dilation_check,
    dilation_warning,
    measured_verdict,
    summarise_in_child,
)

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    run_dir, _ = run_simulation(plan_experiment(TRIANGLE), runs_dir=out, duration_s=4.0, quiet=True)
    return run_dir


def _emulated_like(simulated: Path, tmp_path: Path) -> tuple[EmulationOutcome, Path]:
    """A run directory as an emulation leaves it before its summary: the records in ``sources/``
    (the simulated run's, split per source) with the sources' tallies, ``plan.json``, ``run.json``
    saying ``running``."""
    run_dir = tmp_path / "run"
    (run_dir / "sources").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    shutil.copy(simulated / "plan.json", run_dir / "plan.json")
    lines = (simulated / "records.csv").read_text().splitlines()
    head, rows = lines[0], lines[1:]
    source = head.split(",").index("source")
    for name in sorted({r.split(",")[source] for r in rows}):
        mine = [r for r in rows if r.split(",")[source] == name]
        (run_dir / "sources" / f"{name}.records.csv").write_text("\n".join([head, *mine]) + "\n")
    for tally in (simulated / "sources").glob("*.tally.json"):  # what each source says it wrote
        shutil.copy(tally, run_dir / "sources" / tally.name)
    record = RunRecord(run_dir / "run.json", {"mode": "emulation", "status": "running"})
    record.update()
    return EmulationOutcome(EXIT_OK, "ok", run_dir, 4.0, {"total_s": 1.0}, record=record), run_dir


def _run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_the_verdict_counts_what_the_sources_wrote(simulated, tmp_path):
    _, run_dir = _emulated_like(simulated, tmp_path)
    v = measured_verdict(run_dir)
    sim = json.loads((simulated / "summary.json").read_text())
    assert v["queries"] == sim["queries"] > 0 and sum(v["per_source"].values()) == v["queries"]
    assert v["success_ratio"] == pytest.approx(sim["success_ratio"], abs=1e-4)
    assert v["failures"] == {c: n for c, n in sim["failures"].items() if n}


def test_a_summary_that_raises_leaves_the_verdict_and_a_reportable_run(simulated, tmp_path):
    outcome, run_dir = _emulated_like(simulated, tmp_path)
    seen_before = {}

    def summary_that_fails(o, console):
        seen_before.update(_run_json(o.run_dir))  # what run.json said while the summary ran
        raise ValueError("a fault in the summary")

    out = io.StringIO()
    status, message = finish_emulation(outcome, Console(file=out, width=1000), summarise=summary_that_fails)
    assert seen_before["status"] == "ok" and seen_before["exit_code"] == EXIT_OK
    assert seen_before["summary"] == {"status": "running"} and seen_before["verdict"]["queries"] > 0
    assert status == EXIT_COMPONENT_DIED and message.startswith("summary failed: ValueError")
    rec = _run_json(run_dir)
    assert rec["status"] == "failed" and rec["exit_code"] == EXIT_COMPONENT_DIED
    assert rec["summary"]["status"] == "failed" and "a fault in the summary" in rec["summary"]["error"]
    assert rec["verdict"]["queries"] == seen_before["verdict"]["queries"]
    assert "the verdict is in run.json" in out.getvalue()
    assert run_status(rec).short == f"failed (exit {EXIT_COMPONENT_DIED})"
    report = build_report([run_dir], tmp_path / "report")  # testbed report still summarises the records
    assert Path(report["markdown"]).exists()


def test_a_summary_process_that_dies_of_sigsegv_is_reported_as_such(simulated, tmp_path, monkeypatch):
    outcome, run_dir = _emulated_like(simulated, tmp_path)
    (tmp_path / "crashing_summary.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def crashing(o, console):
        return summarise_in_child(o.run_dir, o.duration_s, o.timings, o.capture, module="crashing_summary")

    with pytest.raises(SummaryFailed, match="died of SIGSEGV"):
        crashing(outcome, Console(file=io.StringIO()))
    status, message = finish_emulation(outcome, Console(file=io.StringIO()), summarise=crashing)
    assert status == EXIT_COMPONENT_DIED and "SIGSEGV" in message
    rec = _run_json(run_dir)
    assert rec["status"] == "failed" and "SIGSEGV" in rec["summary"]["error"] and rec["verdict"]["queries"] > 0


def test_the_summary_runs_in_its_own_process_and_writes_summary_json(simulated, tmp_path):
    outcome, run_dir = _emulated_like(simulated, tmp_path)
    status, _ = finish_emulation(outcome, Console(file=io.StringIO()))
    assert status == EXIT_OK
    s = json.loads((run_dir / "summary.json").read_text())
    rec = _run_json(run_dir)
    assert rec["summary"] == {"status": "ok"} and s["queries"] == rec["verdict"]["queries"]
    assert "dilation_check" in s and s["clocks"]["timings_s"] == "wall"
    assert (run_dir / "summary.md").exists() and (run_dir / "logs" / "summary.log").exists()


def test_nothing_measured_and_all_failed_are_decided_before_the_summary(simulated, tmp_path):
    outcome, run_dir = _emulated_like(simulated, tmp_path)
    for f in (run_dir / "sources").glob("*.records.csv"):
        f.unlink()
    status, _ = finish_emulation(outcome, Console(file=io.StringIO()), summarise=lambda o, c: {})
    assert status == EXIT_NOTHING_MEASURED and _run_json(run_dir)["exit_code"] == EXIT_NOTHING_MEASURED
    outcome, run_dir = _emulated_like(simulated, tmp_path / "b")
    for f in (run_dir / "sources").glob("*.records.csv"):
        f.write_text(f.read_text().replace(",success,", ",failure,deadline_miss,").replace(",deadline_miss,,",
                                                                                           ",deadline_miss,"))
    status, message = finish_emulation(outcome, Console(file=io.StringIO()), summarise=lambda o, c: {})
    assert status == EXIT_ALL_FAILED and message.startswith("every one of the")


# ----------------------------------------------------------------------------- too small a k

CPU_OK = {"cpus": 2, "by_role": {"other": 0.1, "ovs-vswitchd": 0.2, "sources": 0.2, "inference servers": 0.3},
          "testbed_cores": 0.4, "steal_cores": 0.0}


def test_k_is_too_small_when_the_host_adds_more_than_twice_auto_s_target_to_the_network():
    assert not dilation_check(4, 1.9, 5.0, CPU_OK)["too_small"]
    got = dilation_check(4, 2.1, 5.0, CPU_OK)
    assert got["too_small"] and "2.10 ms" in got["reasons"][0]
    assert not dilation_check(4, 7.9, 40.0, CPU_OK)["too_small"]  # 20 % of a 40 ms planned network time


def test_the_hosts_share_leaves_out_queries_that_opened_a_connection(simulated):
    plan_doc = json.loads((simulated / "plan.json").read_text())
    rows = [r for r in pd.read_csv(simulated / "records.csv").to_dict("records") if r["http_status"] == 200]
    rows = rows[:len(rows) // 2 * 2]
    base, planned, n = dilation_figures(plan_doc, rows)
    assert n == len(rows) >= 10 and base is not None and planned is not None
    # a handshake's round trip more on half of them, marked cold as either engine writes it
    slow = [dict(r, network_ms=r["network_ms"] + 50.0, cold=(1 if i % 4 == 1 else True)) for i, r in enumerate(rows)]
    mixed = [s if i % 2 else r for i, (r, s) in enumerate(zip(rows, slow, strict=True))]
    share, planned_mixed, judged = dilation_figures(plan_doc, mixed)
    assert judged == len(rows) // 2 and planned_mixed == planned
    assert share == pytest.approx(statistics.median(host_share_ms(plan_doc, rows[::2])))
    unmarked = [dict(r, cold=0) for r in mixed]  # the same rows, not marked: the handshakes count
    assert dilation_figures(plan_doc, unmarked)[0] > share + 1.0


def test_k_is_too_small_when_the_emulation_was_short_of_cpu_or_open_vswitch_saturated():
    starved = {**CPU_OK, "by_role": {"other": 1.0, "inference servers": 0.4, "sources": 0.6}, "testbed_cores": 0.6}
    got = dilation_check(10, 0.5, 5.0, starved)  # 1.0 of the 1.0 core left by other jobs
    assert got["too_small"] and "short of CPU" in got["reasons"][0]
    niced = {**starved, "by_role": {"other (niced)": 1.0, "inference servers": 0.4, "sources": 0.6}}
    assert not dilation_check(10, 0.5, 5.0, niced)["too_small"]  # niced jobs yield
    ovs = {**CPU_OK, "by_role": {"ovs-vswitchd": 0.95}, "testbed_cores": 0.95}
    assert any("Open vSwitch" in r for r in dilation_check(10, 0.5, 5.0, ovs)["reasons"])
    # 228 shards' 1.21 cores are spread over 228 forwarding threads: none of them saturated
    shards = {**CPU_OK, "by_role": {"ovs-vswitchd": 1.21}, "testbed_cores": 1.21}
    assert not any("Open vSwitch" in r for r in dilation_check(13, 0.5, 5.0, shards, ovs_daemons=228)["reasons"])
    assert any("Open vSwitch" in r for r in dilation_check(13, 0.5, 5.0, shards)["reasons"])
    assert dilation_check(1, None, None, {})["unjudged"]


def test_k_is_too_small_when_the_emulation_was_short_of_cpu_in_a_tenth_of_the_load():
    """Criterion 4: the mean (CPU_OK) is well below criterion 2's, but the peaks were not carried."""
    assert not dilation_check(9, 1.5, 9.0, {**CPU_OK, "window_s": 180.0, "short_s": 17.0})["too_small"]
    got = dilation_check(9, 1.5, 9.0, {**CPU_OK, "window_s": 180.0, "short_s": 45.6})
    assert got["too_small"] and got["figures"]["short_s"] == 45.6
    assert got["reasons"] == [got["reasons"][0]] and got["reasons"][0].startswith("for 46 s of the load's 180 s")


def test_the_summary_says_so_in_its_first_line_and_strict_exits_3(simulated, tmp_path):
    check = dilation_check(10, 30.0, 5.0, CPU_OK)
    s = {"queries": 10, "duration_s": 4.0, "success_ratio": 0.1, "time_dilation": 10.0, "dilation_check": check}
    first = _headline(s)[0]
    assert first.startswith("TIME DILATION TOO SMALL: at k = 10") and first == dilation_warning(check)
    assert _headline({**s, "dilation_check": dilation_check(10, 0.1, 5.0, CPU_OK)})[0].startswith("Summary:")
    for strict, expected in ((False, EXIT_OK), (True, EXIT_BRINGUP)):
        outcome, run_dir = _emulated_like(simulated, tmp_path / str(strict))
        status, message = finish_emulation(outcome, Console(file=io.StringIO()), strict=strict,
                                           summarise=lambda o, c: {"dilation_check": check})
        assert status == expected
        assert _run_json(run_dir)["dilation_check"]["too_small"]
    assert message.startswith("time dilation too small (--strict)")


def test_past_k_10_the_summary_warns_that_the_quota_period_is_shorter_than_the_models():
    from testbed.results.render import period_warning

    s = {"queries": 10, "duration_s": 4.0, "success_ratio": 0.5}
    for k in (1.0, 4.0, 10.0):
        assert period_warning(k) is None
        assert not any("CFS period" in x for x in _headline({**s, "time_dilation": k}))
    warned = [x for x in _headline({**s, "time_dilation": 25.0}) if "CFS period" in x]
    assert warned == [period_warning(25.0) + "."]
    assert warned[0].startswith("WARNING: at k = 25 ")
    assert "1 s, which is 40.0 ms of emulated time, not the 100 ms" in warned[0]


# ----------------------------------------------------------------------------- real emulations


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_an_emulation_far_beyond_its_k_says_so_and_strict_exits_3(tmp_path):
    from emu_checks import host_too_slow

    from testbed.plan.build import build_plan
    from testbed.results.runs import run_emulation
    from testbed.spec.experiment import load_experiment

    exp = load_experiment(TRIANGLE)
    exp = type(exp).model_validate({**exp.model_dump(), "workload": [
        {"application": "digits", "sources": "all", "rate_qps": 1000.0}]})
    plan = build_plan(exp, base_dir=TRIANGLE.parent)
    out = io.StringIO()
    code = run_emulation(plan, Console(file=out, width=400), runs_dir=tmp_path, duration_s=4.0, strict=True)
    run_dir = next(p.parent for p in tmp_path.glob("*/run.json"))
    if code == EXIT_BRINGUP and host_too_slow(run_dir):
        pytest.skip(host_too_slow(run_dir))
    rec = _run_json(run_dir)
    assert code == EXIT_BRINGUP, (code, rec.get("message"))
    assert rec["dilation_check"]["too_small"] and rec["verdict"]["queries"] > 0
    assert rec["message"].startswith("time dilation too small (--strict)")
    summary = (run_dir / "summary.md").read_text()
    assert summary.startswith("TIME DILATION TOO SMALL: at k = 1")


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_an_emulation_whose_summary_process_crashes_keeps_its_verdict(tmp_path, monkeypatch):
    from emu_checks import host_too_slow

    from testbed.results.runs import run_emulation

    (tmp_path / "crashing_summary.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def crashing(o, console):
        return summarise_in_child(o.run_dir, o.duration_s, o.timings, o.capture, module="crashing_summary")

    runs = tmp_path / "runs"
    code = run_emulation(plan_experiment(TRIANGLE), Console(file=io.StringIO()), runs_dir=runs, duration_s=4.0,
                         summarise=crashing)
    run_dir = next(p.parent for p in runs.glob("*/run.json"))
    if code == EXIT_BRINGUP and host_too_slow(run_dir):
        pytest.skip(host_too_slow(run_dir))
    rec = _run_json(run_dir)
    assert code == EXIT_COMPONENT_DIED and rec["status"] == "failed" and rec["exit_code"] == code
    assert "SIGSEGV" in rec["summary"]["error"] and rec["verdict"]["queries"] > 0
    assert json.loads((run_dir / "exit.json").read_text())["exit_code"] == code
    report = build_report([run_dir], tmp_path / "report")
    assert Path(report["markdown"]).exists()
    # the same run summarised afterwards by the real summary agrees with its verdict
    s = summarise_run(EmulationOutcome(EXIT_OK, "ok", run_dir, 4.0), Console(file=io.StringIO()))
    assert s["queries"] == rec["verdict"]["queries"]


def test_the_ovs_daemons_are_read_from_network_json(tmp_path):
    from testbed.results.summary_process import ovs_daemons

    assert ovs_daemons(tmp_path) == 1  # no network.json
    (tmp_path / "network.json").write_text(json.dumps({"ovs": "the system's Open vSwitch"}))
    assert ovs_daemons(tmp_path) == 1
    (tmp_path / "network.json").write_text(json.dumps({"ovs": [{"shard": "O0"}, {"shard": "O1"}, {"shard": "O2"}]}))
    assert ovs_daemons(tmp_path) == 3
