"""The scale table (benchmarks/results/scale.json, docs/results.md "The largest networks on one
machine") is merged row by row: a network measured again at the same time dilation k replaces its
row, the other rows stay, and every row says when and by which command it was measured. No emulation:
``scale_bench.big``'s figures are given."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_modules import load_benchmark

resultfile = load_benchmark("resultfile")
scale_bench = load_benchmark("scale_bench")
results = load_benchmark("results")

OLD_AT = "2026-12-06T04:15:12+00:00"


def _old_file(out: Path) -> None:
    """scale.json as the benchmark wrote it before rows were merged: one provenance for the file, a
    k = 6.5 row (with plain Mininet's figure) and a k = 1 row."""
    cols = scale_bench.SCALE_COLUMNS
    row = dict.fromkeys(cols, "x")
    k65 = {**row, "experiment": "experiments/isp-att.yaml", "k": 6.5, "missed": "exit code 4 (...)",
           "plain Mininet net.start()": "stopped after 99 s with 23 of 594 bridges made"}
    k1 = {**row, "experiment": "experiments/isp-att.yaml", "k": 1.0, "missed": "exit code 4 (late)",
          "plain Mininet net.start()": "stopped after 161 s with 51 of 594 bridges made"}
    doc = {"name": "scale", "title": "The largest networks on one machine", "command": "sudo ... big --k auto",
           "commit": "97612b6-dirty", "measured_at": OLD_AT, "machine": "2 CPUs, 24 GiB, load average 19.46",
           "summary": "old", "tables": [{"caption": "c", "columns": cols,
                                         "rows": [[k65[c] for c in cols], [k1[c] for c in cols]]}], "notes": []}
    out.mkdir(parents=True)
    (out / "scale.json").write_text(json.dumps(doc))


#: cmd_big's figures of one network (the AS7018 run at k 6.5 that passed every check), plain Mininet skipped.
NEW = {"experiment": "experiments/isp-att.yaml", "source": "experiments/isp-att.yaml", "switches": 594, "links": 1674,
       "k": 6.5, "estimate_mib": 4176, "load_before": 0.48, "load_after": 9.92, "exit_code": 0, "wall_s": 353.1,
       "peak_mib": 5907, "message": "ok", "network_up_s": 29.14, "bringup_s": 67.72, "rtt_paths_ok": "16/16",
       "rtt_error_median_ms": 0.28, "rtt_error_max_ms": 0.53, "success_ratio": 1.0, "sim_success_ratio": 1.0,
       "success_gap_points": 0.0,
       "events": [{"kind": "link_delay", "asked": "10", "measured": "10.006", "unit": "ms", "tolerance": "2",
                   "ok": "1"},
                  {"kind": "cluster_down", "asked": "", "measured": "", "unit": "", "tolerance": "", "ok": "1"},
                  {"kind": "link_down", "asked": "", "measured": "276.889", "unit": "ms", "tolerance": "", "ok": "1"}]}


def test_a_new_run_replaces_its_row_and_keeps_the_others_with_their_dates(tmp_path, monkeypatch):
    out = tmp_path / "results"
    _old_file(out)
    monkeypatch.setattr(sys, "argv", ["scale_bench.py", "big", "experiments/isp-att.yaml", "--k", "6.5",
                                      "--plain-timeout-s", "0", "--result"])
    path = scale_bench._write_scale([NEW], SimpleNamespace(experiments=["experiments/isp-att.yaml"]), out)
    doc = json.loads(path.read_text())
    (t,) = doc["tables"]
    cols = t["columns"]
    assert cols == [*scale_bench.SCALE_COLUMNS, resultfile.MEASURED_COLUMN]
    rows = [dict(zip(cols, r, strict=True)) for r in t["rows"]]
    assert [(r["k"], r["missed"]) for r in rows] == [(6.5, "none"), (1.0, "exit code 4 (late)")]  # replaced in place
    new, k1 = rows
    # plain Mininet was not measured this time: the network's earlier figure, with its date
    assert new["plain Mininet net.start()"] == f"stopped after 99 s with 23 of 594 bridges made (measured {OLD_AT})"
    assert new["testbed network up s"] == 29.14 and new["wall s"] == 353.1
    assert new[resultfile.MEASURED_COLUMN].startswith(doc["measured_at"])
    assert k1[resultfile.MEASURED_COLUMN] == f"{OLD_AT} (97612b6-dirty)"  # the old file's, kept
    assert t["row_measured"][0]["command"] == doc["command"] == (
        "sudo .venv/bin/python benchmarks/scale_bench.py big experiments/isp-att.yaml --k 6.5 --plain-timeout-s 0 "
        "--result")
    assert t["row_measured"][1]["command"] == "sudo ... big --k auto"
    assert doc["summary"] == ("Every check passed on experiments/isp-att.yaml at k = 6.5; MISSED on "
                              "experiments/isp-att.yaml at k = 1 (column 'missed').")
    assert (f"experiments/isp-att.yaml at k = 1: measured {OLD_AT} on commit 97612b6-dirty (2 CPUs, 24 GiB, load "
            f"average 19.46) by `sudo ... big --k auto`.") in doc["notes"]
    assert "## The largest networks on one machine" in results.render(out)

    # the same network at k = 1 again: that row is replaced, the k = 6.5 one stays
    again = scale_bench._write_scale([{**NEW, "k": 1.0, "plain_up_s": 140.2}],
                                     SimpleNamespace(experiments=["experiments/isp-att.yaml"]), out)
    t2 = json.loads(again.read_text())["tables"][0]
    assert [(r[cols.index("k")], r[cols.index("plain Mininet net.start()")]) for r in t2["rows"]] == [
        (6.5, new["plain Mininet net.start()"]), (1.0, "140.2 s")]
    assert t2["row_measured"][0] == t["row_measured"][0]


def test_merge_rows_keys_by_value_moves_old_rows_by_column_name_and_appends_new_keys():
    old = {"caption": "c", "columns": ["experiment", "k", "wall s"], "rows": [["a", 6.5, 1], ["a", 1.0, 2]],
           "row_measured": [{"measured_at": "T1", "commit": "c1"}, {"measured_at": "T2", "commit": "c2"}]}
    new = {"caption": "c2", "columns": ["experiment", "k", "peak MiB", "wall s"],
           "rows": [["a", "6.50", 9, 3], ["b", 1, 8, 4]],
           "row_measured": [{"measured_at": "T3", "commit": "c3"}, {"measured_at": "T4", "commit": "c4"}]}
    got = resultfile.merge_rows(old, new, ("experiment", "k"))
    assert got["columns"] == ["experiment", "k", "peak MiB", "wall s", resultfile.MEASURED_COLUMN]
    assert got["rows"] == [["a", "6.50", 9, 3, "T3 (c3)"], ["a", 1.0, None, 2, "T2 (c2)"], ["b", 1, 8, 4, "T4 (c4)"]]
    assert [m["commit"] for m in got["row_measured"]] == ["c3", "c2", "c4"]
    # an old table without row_measured: its rows take the provenance given for the old file
    bare = {k: v for k, v in old.items() if k != "row_measured"}
    got = resultfile.merge_rows(bare, {**new, "rows": [], "row_measured": []}, ("experiment", "k"),
                                old_measured={"measured_at": "T0", "commit": "c0"})
    assert [r[-1] for r in got["rows"]] == ["T0 (c0)", "T0 (c0)"]
    with pytest.raises(ValueError, match="key column"):
        resultfile.merge_rows(old, {**new, "columns": ["experiment", "x", "y", "z"]}, ("experiment", "k"))
    with pytest.raises(ValueError, match="row_measured: 1 for 2 rows"):
        resultfile.merge_rows(old, {**new, "row_measured": new["row_measured"][:1]}, ("experiment", "k"))
