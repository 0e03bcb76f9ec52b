"""The load ceiling's results file (``python -m benchmarks.dilation ceiling --result NAME``): its
summary judges issue 38's target (>= 1,000 emulated q/s carried, network excess p50 < 2 ms) from the
rows, met or missed with the highest rate carried. No emulation: the rows are given."""

import json

from bench_modules import load_benchmark

dilation = load_benchmark("dilation")


def _row(k, rate, excess, carried):
    return {"k_asked": "auto", "k": k, "auto_s": 100.0, "rate_qps": rate, "load_before": 0.5, "exit": 0,
            "queries": int(rate * 10), "answered_qps": rate, "success": 0.99, "excess_p50_ms": excess,
            "dropped": 0, "carried": carried, "wall_s": 250.0}


def test_the_ceiling_summary_says_met_or_missed_with_the_highest_rate_carried(tmp_path):
    path = dilation._ceiling_result("ceil-a", [_row(19, 400.0, 1.2, True), _row(19, 1000.0, 2.14, False)], 0,
                                    ["ceiling", "--ks", "auto"], tmp_path)
    doc = json.loads(path.read_text())
    assert doc["summary"].startswith("Target >= 1,000 emulated q/s") and "MISSED" in doc["summary"]
    assert "400 q/s at k = 19" in doc["summary"]
    assert doc["tables"][0]["columns"] == dilation.CEILING_COLUMNS and len(doc["tables"][0]["rows"]) == 2
    path = dilation._ceiling_result("ceil-b", [_row(19, 1000.0, 1.8, True)], 2, ["ceiling"], tmp_path)
    doc = json.loads(path.read_text())
    assert ": met;" in doc["summary"] and "1,000 q/s at k = 19" in doc["summary"]
    assert "CPU hogs beside the runs: 2" in doc["notes"][0]
