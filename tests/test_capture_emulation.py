"""Packet capture and the report on a real run (Mininet + OVS + ryu-manager + TensorFlow).

One short run of experiments/capture.yaml (srca at A -> edgec at C over A -B 2 ms - C 3 ms, capture on
every host interface and both ends of every emulated link), shared by the tests of this module.
Root-only, marked ``emulation``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from emu_checks import expect_run_ok

from testbed.plan.build import plan_experiment
from testbed.results.html_report import build_report
from testbed.results.runs import run_emulation

REPO = Path(__file__).resolve().parents[1]
# The user-space link emulator adds ~0.2 ms per traversal at idle (benchmarks/linkemu_bench.py);
# the hop lK-eth0 > lK-eth1 is one traversal. Median one-way delay must be within
# [emulated, emulated + TOLERANCE_MS], emulated = configured - the run's datapath compensation.
TOLERANCE_MS = 0.6

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root"),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    plan = plan_experiment(REPO / "experiments" / "capture.yaml")
    runs = tmp_path_factory.mktemp("runs")
    expect_run_ok(run_emulation(plan, runs_dir=runs, duration_s=5), runs)
    (d,) = list(runs.iterdir())
    return d


def test_capture_files_bounded_and_complete(run_dir):
    meta = json.loads((run_dir / "pcap" / "capture.json").read_text())
    names = ["srca-eth0", "edgec-eth0", "l1-eth0", "l1-eth1", "l2-eth0", "l2-eth1", "l3-eth0", "l3-eth1"]
    assert list(meta["points"]) == names
    for n in names:
        p = meta["points"][n]
        assert (run_dir / "pcap" / f"{n}.pcap").stat().st_size == p["bytes"] <= 20 * 2**20
        assert p.get("dropped_by_kernel", 0) == 0 and not p["bound_reached"]
        assert p["captured"] == p["received_by_filter"]  # nothing left in the ring at stop
    # the A - C link (l3) is off the least-delay path: no query packet on it
    assert meta["points"]["l3-eth0"]["captured"] == 0 and meta["points"]["l1-eth0"]["captured"] > 0


def test_per_hop_delay_equals_configured_link_delay(run_dir):
    h = pd.read_csv(run_dir / "capture" / "hop_delays.csv").set_index(["from", "to"])
    for a, b, delay in (("l1-eth0", "l1-eth1", 2.0), ("l2-eth0", "l2-eth1", 3.0),
                        ("l2-eth1", "l2-eth0", 3.0), ("l1-eth1", "l1-eth0", 2.0)):
        row = h.loc[(a, b)]
        assert row["configured_ms"] == delay and row["packets"] >= 20
        # the emulator holds frames for the configured delay minus the run's datapath compensation
        offset = json.loads((run_dir / "datapath_calibration.json").read_text())["link_offset_one_way_ms"]
        assert 0 < offset < 1.0 and row["emulated_ms"] == pytest.approx(delay - offset, abs=1e-4)
        assert delay - offset <= row["median_ms"] <= delay - offset + TOLERANCE_MS, (a, b, row["median_ms"])
    # path order of the hops: source -> l1 -> l2 -> cluster
    assert ("srca-eth0", "l1-eth0") in h.index and ("l2-eth1", "edgec-eth0") in h.index
    # source -> cluster, switches included: the configured 2 + 3 ms, the compensation taken off
    # the links given back by the three switches' hops (within their spread)
    path = [("srca-eth0", "l1-eth0"), ("l1-eth0", "l1-eth1"), ("l1-eth1", "l2-eth0"), ("l2-eth0", "l2-eth1"),
            ("l2-eth1", "edgec-eth0")]
    one_way = sum(h.loc[hop]["median_ms"] for hop in path)
    assert 5.0 - 0.3 <= one_way <= 5.0 + 3 * TOLERANCE_MS, one_way


def test_packet_columns_joined_into_records(run_dir):
    df = pd.read_parquet(run_dir / "records.parquet")
    assert len(df) >= 5 and df["pkt_req_segments"].notna().all()
    ok = df[df["http_status"] == 200]
    # request first byte: sent after t0, received at the cluster before the server's t1
    assert (ok["pkt_req_first_tx_ns"] >= ok["t0_ns"]).all() and (ok["pkt_req_last_rx_ns"] <= ok["t1_ns"]).all()
    assert (ok["pkt_resp_last_rx_ns"] <= ok["t4_ns"]).all() and (ok["pkt_resp_first_tx_ns"] >= ok["t3_ns"]).all()
    # first byte crosses two emulated links: at least their 2 + 3 ms less the run's datapath compensation
    # on each (the switches' own hops give it back), and the request is ~20 kB = several segments
    offset = json.loads((run_dir / "datapath_calibration.json").read_text())["link_offset_one_way_ms"]
    assert (ok["pkt_req_owd_ms"] >= 5.0 - 2 * offset).all(), (offset, ok["pkt_req_owd_ms"].min())
    assert (ok["pkt_req_segments"] > 5).all()
    assert (ok["pkt_req_payload_bytes"] > ok["request_bytes"]).all()  # body + HTTP header
    assert set(ok["pkt_req_tx_point"]) == {"srca-eth0"} and set(ok["pkt_req_rx_point"]) == {"edgec-eth0"}
    path = pd.read_csv(run_dir / "records.csv")["pkt_req_hops"].str.replace(r":[0-9.]+", "", regex=True)
    assert set(path) == {"srca-eth0>l1-eth0 l1-eth0>l1-eth1 l1-eth1>l2-eth0 l2-eth0>l2-eth1 l2-eth1>edgec-eth0"}


def test_report_from_real_run(run_dir, tmp_path):
    from PIL import Image

    out = build_report([run_dir], tmp_path / "rep")
    assert set(out["figures"]) == {"latency_cdf", "breakdown", "success_over_time", "policy_over_time",
                                   "hop_delays", "link_util_1"}
    html = out["html"].read_text()
    assert html.count("data:image/png;base64,") == 6 and "<table" in html
    for name, p in out["figures"].items():
        img = Image.open(p).convert("L")
        assert img.width >= 600 and img.height >= 250, name
        lo, hi = img.getextrema()
        assert hi - lo > 100, f"{name} looks blank"
        assert len(img.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20, f"{name} has almost no content"
