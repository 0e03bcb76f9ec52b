"""Pure logic: the closest policy, query outcome classification, and the run summary."""

import json

import pandas as pd
import pytest
from rich.console import Console

from testbed.policies import Option, closest
from testbed.summary import print_summary, summarize
from testbed.workload import RECORD_FIELDS, classify

OPTS = [
    Option("near", "small", rtt_ms=4.0, service_ms=1.0, accuracy=0.93),
    Option("mid", "small", rtt_ms=10.0, service_ms=1.0, accuracy=0.93),
    Option("mid", "large", rtt_ms=10.0, service_ms=6.0, accuracy=0.98),
    Option("cloud", "large", rtt_ms=40.0, service_ms=3.0, accuracy=0.98),
]


def test_closest_picks_nearest_feasible_cluster_then_fastest_model():
    d = closest(OPTS, deadline_ms=60, min_accuracy=0.9)
    assert (d.cluster, d.model, d.fallback) == ("near", "small", False)
    d = closest(OPTS, deadline_ms=60, min_accuracy=0.97)  # only the large models qualify
    assert (d.cluster, d.model, d.fallback) == ("mid", "large", False)
    d = closest(OPTS, deadline_ms=15, min_accuracy=0.97)  # mid large: 10 + 6 > 15; cloud: 43 > 15
    assert (d.cluster, d.model, d.fallback) == ("mid", "large", True)  # min_latency fallback (16 < 43)
    d = closest(OPTS, deadline_ms=60, min_accuracy=0.99)  # nothing accurate enough
    assert d.fallback and d.model == "large" and d.cluster == "mid"
    with pytest.raises(ValueError):
        closest([], 60, 0.9)


@pytest.mark.parametrize("status,e2e,acc,expected", [
    (200, 30.0, 0.95, ("success", "")),
    (200, 70.0, 0.95, ("failure", "deadline_miss")),
    (200, 30.0, 0.80, ("failure", "accuracy")),
    (503, 5.0, 0.95, ("failure", "dropped")),
    (500, 5.0, 0.95, ("failure", "error")),
    (0, None, 0.95, ("failure", "error")),
    (None, None, 0.95, ("failure", "deadline_miss")),
])
def test_classify(status, e2e, acc, expected):
    assert classify(status, e2e, deadline_ms=60.0, accuracy=acc, min_accuracy=0.9) == expected


def test_summary_from_known_records(tmp_path):
    (tmp_path / "sources").mkdir()
    (tmp_path / "clusters").mkdir()
    rows = []
    for i in range(10):
        ok = i < 8
        rows.append({"query_id": f"a-{i}", "source": "a", "application": "app", "cluster": "c1",
                     "model": "small", "t0_ns": i, "e2e_ms": 10.0 * (i + 1), "network_ms": 5.0,
                     "queueing_ms": 2.0, "inference_ms": 1.0, "http_status": 200 if i != 9 else 503,
                     "outcome": "success" if ok else "failure",
                     "failure_cause": "" if ok else ("deadline_miss" if i == 8 else "dropped")})
    pd.DataFrame(rows, columns=RECORD_FIELDS).to_csv(tmp_path / "sources" / "a.records.csv", index=False)
    (tmp_path / "clusters" / "c1.stats.json").write_text(json.dumps({"utilization": 0.25, "served": 9, "dropped": 1}))
    pd.DataFrame([{"t": 1, "a": 1, "b": 2, "kind": "switch", "capacity_mbps": 100, "util_ab": 0.1, "util_ba": 0.0,
                   "drops_total": 0}, {"t": 2, "a": 1, "b": 2, "kind": "switch", "capacity_mbps": 100,
                                       "util_ab": 0.3, "util_ba": 0.0, "drops_total": 2}]).to_csv(
        tmp_path / "link_stats.csv", index=False)
    s = summarize(tmp_path, duration_s=5.0)
    assert s["queries"] == 10 and s["success_ratio"] == 0.8
    assert s["failures"] == {"deadline_miss": 1, "dropped": 1}
    assert s["throughput_qps"] == pytest.approx(9 / 5.0)
    assert s["e2e_ms"]["p50"] == pytest.approx(50.0)  # median of 10..90 over the 9 answered
    assert s["breakdown_ms"] == {"network": 5.0, "queueing": 2.0, "inference": 1.0}
    assert s["per_cluster"]["c1"]["utilization"] == 0.25
    assert s["links"]["1-2"]["util_ab_mean"] == pytest.approx(0.2) and s["links"]["1-2"]["drops"] == 2
    assert (tmp_path / "records.parquet").exists() and len(pd.read_csv(tmp_path / "records.csv")) == 10
    print_summary(s, Console(file=open(tmp_path / "out.txt", "w")), tmp_path)
    assert "success ratio 0.800" in (tmp_path / "summary.md").read_text()
