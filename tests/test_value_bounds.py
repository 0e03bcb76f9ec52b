"""Values past their stated bounds (bandwidths, memory, tolerances, a cluster's CPU cores) are clear
errors of ``testbed plan``, exit code 2, naming the item and the bound. Fast: no emulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triangle_inputs import run_cli, topology, triangle

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
TRIANGLE_TOPO = REPO / "topologies" / "triangle.yaml"


@pytest.mark.parametrize(("where", "old", "new", "said"), [
    ("topology", "{id: A,", "{id: A, dpid: true,", "dpid: got the boolean true"),
    ("topology", "delay: 2ms, bandwidth: 100Mbit/s", "delay: 2ms, bandwidth: 1e12Gbit/s",
     "over the bound of 1e+06 Mbit/s"),
    ("experiment", "host_bandwidth: 1Gbit/s", "host_bandwidth: 1e12Gbit/s", "over the bound of 1e+06 Mbit/s"),
    ("experiment", "host_bandwidth: 1Gbit/s", "bandwidth_mbps: 1e15", "less than or equal to 1000000"),
    ("experiment", "queue_limit: 16, models: [digits_small]}",
     "queue_limit: 16, memory_mib: 10000000, models: [digits_small]}", "less than or equal to 1048576"),
    ("experiment", "rest_port: 8088", "rest_port: 8088\n  rtt_tolerance_pct: 1e9", "less than or equal to 100"),
    ("experiment", "cpu_cores: 0.5, workers: 1, queue_limit: 16, models: [digits_small]}",
     "cpu_cores: 1e6, workers: 1, queue_limit: 16, models: [digits_small]}",
     "clusters.0.cpu_cores: 1e+06 cores is over the bound of 512 per cluster"),
])
def test_values_past_their_bounds_are_clear_errors(tmp_path, capsys, where, old, new, said):
    if where == "topology":
        path = triangle(tmp_path, topology=topology(tmp_path, **{old: new}))
    else:
        path = triangle(tmp_path, **{old: new})
    code, out = run_cli(capsys, "plan", str(path))
    assert code == 2 and said in out, out
