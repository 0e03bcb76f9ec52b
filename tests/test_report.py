"""The report on crafted run directories (pure logic: records written here, figures drawn for real)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from testbed.core.errors import InputError
from testbed.model.records import RECORD_FIELDS, SHARES
from testbed.results.html_report import ReportError, build_report, comparison_table, load_run
from testbed.results.plots import link_utilization
from testbed.results.summary import load_duration_s, summarize

S = 1_000_000_000
T0 = 1_800_000_000 * S
REPO = Path(__file__).resolve().parents[1]


def make_run(root: Path, name: str, policies: list[str], n: int = 40, mode: str | None = None,
             link_stats: bool = True, fail_every: int = 5) -> Path:
    """A run dir with ``n`` queries 0.25 s apart; every ``fail_every``-th fails (deadline miss, no answer)."""
    d = root / name
    (d / "sources").mkdir(parents=True)
    rows = []
    for i in range(n):
        fail = i % fail_every == fail_every - 1
        rows.append({"query_id": f"srca-{i + 1}", "source": "srca", "application": "digits", "cluster": "edgec",
                     "model": "digits_small", "policy": policies[i * len(policies) // n], "deadline_ms": 50.0,
                     "t0_ns": T0 + i * S // 4, "e2e_ms": None if fail else 10.0 + i,
                     "dispatch_ms": None if fail else 0.0, "network_ms": None if fail else 5.0,
                     "queueing_ms": None if fail else 3.0, "inference_ms": None if fail else 2.0,
                     "http_status": None if fail else 200, "outcome": "failure" if fail else "success",
                     "failure_cause": "deadline_miss" if fail else ""})
    pd.DataFrame(rows, columns=RECORD_FIELDS).to_csv(d / "sources" / "srca.records.csv", index=False)
    plan = {"switches": [{"name": "s1", "dpid": 1, "label": "A", "lat": 45.0, "lon": 7.7},
                         {"name": "s2", "dpid": 2, "label": "B", "lat": 45.5, "lon": 9.2},
                         {"name": "s3", "dpid": 3, "label": "cloud", "lat": None, "lon": None}],
            "links": [{"index": 1, "a": "s1", "b": "s2", "delay_ms": 2.0}, {"index": 2, "a": "s2", "b": "s3",
                                                                              "delay_ms": 20.0}],
            "hosts": [{"name": "srca", "switch": "s1"}, {"name": "edgec", "switch": "s2"}]}
    (d / "plan.json").write_text(json.dumps(plan))
    (d / "run.json").write_text(json.dumps({"mode": mode} if mode else {"link_emulator": "userspace", "status": "ok",
                                                                        "exit_code": 0, "message": "ok"}))
    if link_stats:
        ls = [{"t": 100.0 + k, "a": a, "b": b, "kind": kind, "capacity_mbps": 100.0, "util_ab": 0.01 * k,
               "util_ba": 0.02, "drops_total": 0}
              for k in range(10) for a, b, kind in ((1, 2, "switch"), (2, 3, "switch"), ("srca", 1, "host"))]
        pd.DataFrame(ls).to_csv(d / "link_stats.csv", index=False)
    summarize(d, 10.0)
    return d


def _check_png(p: Path) -> None:
    img = Image.open(p).convert("L")
    lo, hi = img.getextrema()
    assert img.width >= 600 and img.height >= 250 and hi - lo > 100, p.name


def test_comparison_table_exact(tmp_path):
    a = make_run(tmp_path, "run-a", ["closest"])
    b = make_run(tmp_path, "run-b", ["aset", "max_accuracy"], mode="simulation", link_stats=False)
    t = comparison_table([load_run(a), load_run(b)]).set_index("run / policy")
    assert list(t.index) == ["run-a / closest", "run-b / aset", "run-b / max_accuracy"]
    ra = t.loc["run-a / closest"]
    assert ra["queries"] == 40 and ra["success_ratio"] == 0.8 and ra["mode"] == "emulation"
    assert ra["failures"] == "deadline_miss 8" and ra["network_mean_ms"] == 5.0
    # span of t0 = 39 x 0.25 s = 9.75 s; x (n + 1) / (n - 1) = 41/39 -> 10.25 s, capped at the configured 10 s
    assert ra["load_s"] == 10.0 and ra["answered_qps"] == 3.2
    rb = t.loc["run-b / aset"]
    assert rb["mode"] == "simulation" and rb["queries"] == 20
    assert rb["load_s"] == pytest.approx(19 * 0.25 * 21 / 19, abs=0.01)  # policy's own span: 4.75 s x 21/19
    assert rb["e2e_p50_ms"] == pytest.approx(pd.Series([10.0 + i for i in range(20) if i % 5 != 4]).median())


def test_the_report_and_the_summary_give_one_set_of_latency_figures(tmp_path):
    """One rule (testbed.results.summary.latency_figures) for summary.md and the report: a run's row has
    the summary's percentiles and breakdown exactly, queries that opened a connection included
    (the summary left them out and the report did not: 93.3 against 94.66 ms p95), and the note
    under the table says so."""
    d = make_run(tmp_path, "run-a", ["closest"])
    f = d / "sources" / "srca.records.csv"
    df = pd.read_csv(f)
    df["cold"] = 0
    df.loc[[0, 38], "cold"] = 1  # the first query and the slowest answered one (48 ms) opened a connection
    df.loc[38, "network_ms"] = 9.0
    df.to_csv(f, index=False)
    s = summarize(d, 10.0)
    (row,) = comparison_table([load_run(d)]).to_dict("records")
    assert {q: row[f"e2e_{q}_ms"] for q in ("p50", "p95", "p99")} == s["e2e_ms"]
    assert {k: row[f"{k}_mean_ms"] for k in SHARES} == s["breakdown_ms"]
    assert s["e2e_ms"]["p99"] == pytest.approx(47.0 + 0.69 * 1.0) and s["cold_queries"] == row["cold"] == 2
    assert s["breakdown_ms"]["network"] == pytest.approx(round((31 * 5.0 + 9.0) / 32, 3))
    out = build_report([d], tmp_path / "rep")
    assert "cold ones (new connections) included" in out["markdown"].read_text()


def test_build_report_mixed_runs(tmp_path):
    a = make_run(tmp_path, "run-a", ["closest"])
    b = make_run(tmp_path, "run-b", ["aset", "closest"], mode="simulation", link_stats=False)
    out = build_report([a, b], tmp_path / "rep")
    assert set(out["figures"]) == {"latency_cdf", "breakdown", "success_over_time", "policy_over_time", "link_util_1"}
    assert out["skipped"] == {"hop_delays": "no data (no answered queries / no packet capture)",
                              "link_util_2": "run-b: no link_stats.csv (simulated run)"}
    for p in out["figures"].values():
        _check_png(p)
    html = out["html"].read_text()
    assert html.count("data:image/png;base64,") == 5 and "run-b / aset" in html
    md = out["markdown"].read_text()
    assert "![latency_cdf](figures/latency_cdf.png)" in md
    assert re.search(r"^\| run-a / closest +\| ok +\| emulation +\| 40 +\|", md, re.M)  # a Markdown table row
    assert "WARNING" not in md and "NOT OK" not in html


def _ended(d: Path, **run) -> Path:
    """Give run ``d`` the outcome ``run`` in its run.json, as testbed run (or the cleanup) writes it."""
    (d / "run.json").write_text(json.dumps({"mode": "emulation", "link_emulator": "userspace", **run}))
    return d


def test_the_report_flags_runs_that_did_not_end_ok(tmp_path):
    """Status from run.json in the table, the list of runs, the figures' labels and a warning: an
    exit-4 run (a link emulator died) sat beside the others as if it had succeeded."""
    died = "link emulator linkemu-l1 died: killed by SIGKILL (exit code -9) at 2.20 s into the load. The run stops"
    runs = [make_run(tmp_path, "ok-run", ["closest"]),
            _ended(make_run(tmp_path, "died", ["closest"]), status="failed", exit_code=4, message=died,
                   failure={"component": "linkemu-l1", "kind": "link emulator", "message": died}),
            _ended(make_run(tmp_path, "ctrl-c", ["closest"]), status="failed", exit_code=130, message="interrupted"),
            _ended(make_run(tmp_path, "k9", ["closest"]), status="killed",
                   ended={"found_by": "testbed cleanup", "found_at": "2026-12-03T13:05:53"}),
            _ended(make_run(tmp_path, "warm", ["closest"]), status="failed", exit_code=3,
                   message="warm-up from source srca failed (exit code 1): TimeoutError. More")]
    t = comparison_table([load_run(d) for d in runs]).set_index("run / policy")["status"]
    assert t.to_dict() == {"ok-run / closest": "ok",
                           "died / closest [failed]": "NOT OK: failed: link emulator linkemu-l1",
                           "ctrl-c / closest [interrupted]": "NOT OK: interrupted",
                           "k9 / closest [killed]": "NOT OK: killed",
                           "warm / closest [failed]": "NOT OK: failed (exit 3)"}
    out = build_report(runs, tmp_path / "rep")
    assert out["warning"].startswith("WARNING: 4 of 5 runs did not end ok (died: failed: link emulator linkemu-l1; "
                                     "ctrl-c: interrupted; k9: killed; warm: failed (exit 3))")
    md = out["markdown"].read_text()
    assert f"**{out['warning']}**" in md
    assert ("NOT OK: failed: link emulator linkemu-l1 (link emulator linkemu-l1 died: killed by SIGKILL (exit code "
            "-9) at 2.20 s into the load)") in md
    assert "NOT OK: killed (before it finished, found by testbed cleanup at 2026-12-03T13:05:53: its records" in md
    assert "NOT OK: interrupted (Ctrl-C or SIGTERM: its records stop there)" in md
    assert "NOT OK: failed (exit 3) (warm-up from source srca failed (exit code 1): TimeoutError)" in md
    assert "did not end ok" in out["html"].read_text()


def test_link_utilization_names_switches(tmp_path):
    r = load_run(make_run(tmp_path, "run-a", ["closest"]))
    u = link_utilization(r)
    assert sorted(u["link"].unique()) == ["A-B", "B-cloud", "srca-A"]
    assert u.loc[u["link"] == "A-B", "util"].max() == pytest.approx(0.09)  # max(0.01 x 9, 0.02)
    # the simulator writes switch names instead of DPIDs: same labels
    ls = pd.read_csv(r.path / "link_stats.csv")
    ls[["a", "b"]] = ls[["a", "b"]].astype(str).replace({"1": "s1", "2": "s2", "3": "s3"})
    ls.to_csv(r.path / "link_stats.csv", index=False)
    assert sorted(link_utilization(load_run(r.path))["link"].unique()) == ["A-B", "B-cloud", "srca-A"]


def test_link_stats_cut_short_keeps_its_complete_rows_or_is_named(tmp_path):
    """An interrupted run's last line may be cut: its complete rows are drawn; a file with only a
    partial row is said not drawn; a cut header is refused naming the file (was a numpy traceback)."""
    d = make_run(tmp_path, "run-a", ["closest"])
    text = (d / "link_stats.csv").read_text()
    whole = len(load_run(d).link_stats)
    (d / "link_stats.csv").write_text(text[:-20])
    assert len(load_run(d).link_stats) == whole - 1 and whole > 2
    lines = text.splitlines()
    (d / "link_stats.csv").write_text(lines[0] + "\n" + lines[1][:12] + "\n")
    out = build_report([d])
    assert out["skipped"]["link_util_1"] == "run-a: no complete row in link_stats.csv"
    (d / "link_stats.csv").write_text(text[:10])
    with pytest.raises(ReportError, match=r"link_stats.csv: no column .*util_ab.*cut short"):
        load_run(d)


def test_report_errors_name_the_directory(tmp_path):
    with pytest.raises(ReportError, match="nowhere: not a directory"):
        build_report([tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="empty: no records"):
        build_report([tmp_path / "empty"])


def test_report_cli(tmp_path):
    a = make_run(tmp_path, "run-a", ["closest"])
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(a)], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (a / "report" / "report.html").exists() and (a / "report" / "figures" / "link_util_1.png").exists()
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(tmp_path / "nope")], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 2 and "not a directory" in p.stdout


def test_load_duration_after_interruption():
    # 11 queries 0.5 s apart = span 5 s -> 5 x 12/10 = 6 s although 30 s were configured (Ctrl-C)
    t0 = pd.Series([T0 + i * S // 2 for i in range(11)])
    assert load_duration_s(t0, 30.0) == pytest.approx(6.0)
    assert load_duration_s(t0, 5.5) == 5.5  # never above the configured duration
    assert load_duration_s(t0.iloc[:1], 30.0) == 30.0


def test_summary_uses_measured_load(tmp_path):
    d = make_run(tmp_path, "run-a", ["closest"], n=21)  # span 5 s -> 5.5 s of load, configured 10 s
    s = json.loads((d / "summary.json").read_text())
    assert s["duration_s"] == 10.0 and s["load_s"] == 5.5
    assert s["throughput_qps"] == pytest.approx(round(17 / 5.5, 3))  # 21 queries, 4 unanswered


# ------------------------------------------------------------------ bad --out, corrupt records

def test_report_out_that_is_a_file_or_unwritable_is_an_input_error(tmp_path, monkeypatch):
    a = make_run(tmp_path, "run-a", ["closest"])
    f = tmp_path / "a-file"
    f.write_text("keep me")
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(a), "--out", str(f)], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert f"report folder {f}: it is a file" in p.stdout and f.read_text() == "keep me"
    with pytest.raises(ReportError, match=r"a-file/sub: cannot create or write it \(.*Not a directory\)"):
        build_report([a], f / "sub")
    real_write = Path.write_bytes

    def no_write(self, data):  # as root no folder is unwritable: the probe file's write is refused instead
        if self.name.startswith(".probe."):
            raise PermissionError(13, "Permission denied", str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", no_write)
    with pytest.raises(ReportError, match=r"new/rep: cannot create or write it \(.*Permission denied\)"):
        build_report([a], tmp_path / "new" / "rep")
    assert not (tmp_path / "new").exists()  # nothing half-built is left behind


def test_a_write_failing_midway_leaves_no_half_report(tmp_path, monkeypatch):
    a = make_run(tmp_path, "run-a", ["closest"])
    import testbed.results.html_report as report

    def full_disk(path, *args, **kwargs):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(report, "_write_md", full_disk)
    with pytest.raises(ReportError, match=r"rep \(.*report.md: No space left on device\); nothing was left there"):
        build_report([a], tmp_path / "rep")
    assert not (tmp_path / "rep").exists()


def _corrupt(root: Path, name: str, edit) -> Path:
    d = make_run(root, name, ["closest"])
    (d / "records.parquet").unlink()  # the report reads the Parquet file first; here the CSV is on trial
    f = d / "records.csv"
    f.write_text(edit(f.read_text()))
    return d


@pytest.mark.parametrize("edit,problem", [
    (lambda t: t[:-40], r"line 41 has \d+ fields, the header 37 \(the file is truncated"),
    (lambda t: t[:-1], "the last line does not end with a newline"),
    (lambda t: "\n".join(t.splitlines()[:21]) + "\n", "20 records, but summary.json counted 40 queries"),
    (lambda t: t.replace("query_id,", "qid,", 1), r"column\(s\) of the record schema missing \(query_id\)"),
    (lambda t: "a,b\n1,2\n", r"37 column\(s\) of the record schema missing"),
    (lambda t: t.replace(",10.0,0.0,5.0,", ",ten,0.0,5.0,", 1), "column 'e2e_ms', row 1: 'ten' is not a number"),
    (lambda t: t.replace(f",{T0 + S // 4},", ",soon,", 1), "column 't0_ns', row 2: 'soon' is not a number"),
    (lambda t: t.replace(",success,", ",succes,", 1), "column 'outcome', row 1: 'succes' is not one of"),
    (lambda t: t.replace("query_id,source,", "query_id,query_id,", 1), "column 'query_id' appears twice"),
])
def test_a_corrupt_records_csv_is_refused_naming_the_file(tmp_path, edit, problem):
    d = _corrupt(tmp_path, "run-a", edit)
    with pytest.raises(InputError, match=re.escape(str(d / "records.csv")) + ": .*" + problem):
        build_report([d], tmp_path / "rep")
    assert not (tmp_path / "rep").exists()  # refused before anything is written
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(d)], capture_output=True, text=True,
                       cwd=REPO, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2 and "Traceback" not in p.stderr and str(d / "records.csv") in p.stdout


def test_a_corrupt_parquet_file_is_refused(tmp_path):
    d = make_run(tmp_path, "run-a", ["closest"])
    (d / "records.parquet").write_bytes((d / "records.parquet").read_bytes()[:300])
    with pytest.raises(InputError, match=re.escape(str(d / "records.parquet")) + ": cannot read the records"):
        load_run(d)
    good = make_run(tmp_path, "run-b", ["closest"])
    assert len(load_run(good).records) == 40 and list(load_run(good).records.columns) == RECORD_FIELDS


@pytest.mark.parametrize(("name", "text", "message"), [
    ("run.json", '{"mode": "simul', "run.json: not valid JSON"),
    ("run.json", "[1, 2]", "run.json: expected a JSON object, found list"),
    ("summary.json", '{"queries": 4', "summary.json: not valid JSON"),
    ("plan.json", '{"switches": [', "plan.json: not valid JSON"),
])
def test_a_half_written_json_file_of_a_run_is_named_not_a_traceback(tmp_path, name, text, message):
    d = make_run(tmp_path, "r", ["closest"])
    (d / name).write_text(text)
    with pytest.raises(ReportError, match=re.escape(message)):
        load_run(d)


def test_the_report_carries_a_saturated_machines_warning_and_busy_cpus(tmp_path):
    """A run whose summary warned that the machine was saturated was compared in the report without
    a word: the warning is in its entry, and the table has the CPUs' busy %."""
    a = make_run(tmp_path, "hot", ["closest"])
    s = json.loads((a / "summary.json").read_text())
    s["machine_cpu"] = {"window_s": 40.0, "cpus": 2, "busy_cores": 1.9, "steal_cores": 0.06, "by_role": {},
                        "testbed_cores": 0.9, "saturated_s": 38.0, "peak_share": 1.0}
    (a / "summary.json").write_text(json.dumps(s))
    b = make_run(tmp_path, "sim", ["closest"], mode="simulation", link_stats=False)
    md = build_report([a, b], tmp_path / "rep")["markdown"].read_text()
    assert "WARNING: the machine's CPUs were 98 % busy or stolen during the load" in md
    assert re.search(r"^\| hot / closest .*\| 98.0 +\| 0 +\|", md, re.M) and md.count("busy or stolen during") == 1


def test_a_capture_file_the_analysis_could_not_read_is_said_in_the_summary_and_the_report(tmp_path):
    """A capture point whose file was unreadable was dropped in
    silence (its two hops merged into one, exit 0); analysis.json's errors are now warnings."""
    from testbed.results.summary import _headline

    a = make_run(tmp_path, "cap", ["closest"])
    (a / "capture").mkdir()
    err = f"{a}/pcap/l2-eth0.pcap: not a pcap or pcapng file (Not a supported capture file)"
    (a / "capture" / "analysis.json").write_text(json.dumps({"queries_matched": 3, "retransmissions": 0,
                                                            "hop_delays": [], "errors": [err]}))
    want = (f"WARNING: packet capture: {err}; the per-hop delays skip that capture point (the hops on either side "
            f"of it show as one)")
    s = summarize(a, 1.0)
    assert s["capture"]["errors"] == [err] and want in _headline(s)
    md = build_report([a], tmp_path / "rep")["markdown"].read_text()
    assert want in md


def test_an_aset_run_is_one_row_not_a_row_per_policy_it_chose(tmp_path):
    """The report of aset-live had a row per static policy ASET chose,
    each with a rate over its scattered windows (27.58 q/s over '1.05 s'), and none for the run."""
    a = make_run(tmp_path, "live", ["closest", "min_latency", "round_robin"])
    plan = json.loads((a / "plan.json").read_text())
    plan["experiment"] = {"policy": "aset", "sources": [{"name": "srca", "policy": None}]}
    (a / "plan.json").write_text(json.dumps(plan))
    md = build_report([a], tmp_path / "rep")["markdown"].read_text()
    rows = [x for x in md.splitlines() if x.startswith("| ") and " ok " in x]
    assert len(rows) == 1 and rows[0].startswith("| aset "), rows
    s = json.loads((a / "summary.json").read_text())
    assert f"| {s['queries']} " in rows[0]
    from testbed.results.summary import _headline

    s = summarize(a, 1.0)  # the summary says what ASET chose
    assert set(s["aset_choices"]) == {"closest", "min_latency", "round_robin"}
    assert sum(s["aset_choices"].values()) == pytest.approx(1.0, abs=1e-3)
    assert any(x.startswith("ASET chose, window by window (share of its sources' queries): ") for x in _headline(s))
