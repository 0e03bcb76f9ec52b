"""The topology's MTU (``topology.mtu``): the model's frames and transfer times, the simulator's
paths, bad values, and (marked ``emulation``) a real run whose veths carry jumbo frames."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from triangle_inputs import triangle_data, write_data

from testbed.model.network import FRAME_OVERHEAD_BYTES, LinkState, NetworkState, frames, mss_of, wire_bytes
from testbed.plan.build import build_plan
from testbed.plan.catalog import FixedCatalog
from testbed.sim import Simulator
from testbed.spec.experiment import ConfigError, Experiment, load_experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle-litert.yaml"


def test_mss_and_frames_follow_the_mtu():
    assert mss_of(1500) == 1448 and mss_of(9000) == 8948
    assert frames(19335) == 14 and frames(19335, mss_of(9000)) == 3
    assert wire_bytes(19335, mss_of(9000)) == 19335 + 3 * FRAME_OVERHEAD_BYTES
    a, b = LinkState("a", "b", 5.0, 100.0), LinkState("a", "b", 5.0, 100.0, mss=mss_of(9000))
    saved_ms = (14 - 3) * FRAME_OVERHEAD_BYTES * 8 / (100.0 * 1e3)
    assert a.one_way_ms(19335, True) - b.one_way_ms(19335, True) == pytest.approx(saved_ms)
    net = NetworkState([("a", "b", 5.0, 100.0, 0.0)], mtu=9000)
    assert (net.mtu, net.mss, net.links[0].mss) == (9000, 8948, 8948)


def _triangle(mtu: int | None) -> Experiment:
    topo = {"source": str(REPO / "topologies/triangle.yaml"), "bandwidth": "10Mbit/s", "host_bandwidth": "10Mbit/s"}
    if mtu is not None:
        topo["mtu"] = mtu
    return Experiment.model_validate({
        "name": "mtu", "duration": "5s", "policy": "closest", "topology": topo,
        "clusters": [{"name": "c", "site": "B", "tier": "far_edge", "cpu_cores": 1, "workers": 1, "models": ["m"]}],
        "sources": [{"name": "src", "site": "A"}],
        "applications": [{"name": "app", "deadline": "10s", "min_accuracy": 0.5}],
        "workload": [{"application": "app", "rate_qps": 5}]})


def test_the_simulators_transfer_times_use_the_plans_mtu():
    cat = FixedCatalog({"m": ("digits", 0.9, [1.0])}, body_bytes=20000)
    fwd = {}
    for mtu in (1500, 9000):
        plan = build_plan(_triangle(mtu), catalog=cat)
        sim = Simulator(plan, seed=1)
        assert sim.net.mss == mss_of(mtu)
        fwd[mtu] = sim.fwd_app[0][0][0]  # s, source -> cluster, request
    (path,) = plan.paths  # A -> B, one link
    assert len(path.switches) == 2
    ab_mbps = plan.network_state().link(*path.switches).capacity_mbps  # triangle.yaml's own capacity
    assert ab_mbps >= 10
    n = plan.request_bytes["app"]
    delay_s = plan.network_state().link(*path.switches).delay_ms / 1e3

    def pipelined_s(mss: int) -> float:  # first frame through the three links, the rest at 10 Mbit/s
        k = -(-n // mss)
        wire, first = n + k * FRAME_OVERHEAD_BYTES, mss + FRAME_OVERHEAD_BYTES
        return first * 8 * (2 / 10e6 + 1 / (ab_mbps * 1e6)) + (wire - first) * 8 / 10e6

    assert fwd[1500] == pytest.approx(delay_s + pipelined_s(mss_of(1500)), rel=1e-9)
    assert fwd[9000] == pytest.approx(delay_s + pipelined_s(mss_of(9000)), rel=1e-9)
    assert _triangle(None).topology.mtu == 1500


@pytest.mark.parametrize("mtu", [575, 9001, "jumbo"])
def test_an_mtu_out_of_range_is_refused_naming_it(tmp_path, mtu):
    exp = triangle_data()
    exp["topology"]["mtu"] = mtu
    with pytest.raises(ConfigError, match=r"topology(\.|: )mtu: "):
        load_experiment(write_data(tmp_path, "bad.yaml", exp))


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
def test_jumbo_frames_cross_the_emulated_links(tmp_path):
    """A real run at MTU 9000: the link emulator forwards fewer frames per query than a 1500-byte
    MTU allows for the request alone (a 19 kB digits request is 14 frames at 1500, 3 at 9000)."""
    exp = yaml.safe_load(TRIANGLE.read_text())
    exp["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    exp["topology"]["mtu"] = 9000
    exp["workload"] = [{"application": "digits", "sources": "all", "rate_qps": 30}]
    path = tmp_path / "triangle-9000.yaml"
    path.write_text(yaml.safe_dump(exp))
    runs = tmp_path / "runs"
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(path), "--runs-dir", str(runs),
                          "--duration", "5"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = next(runs.iterdir())
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["experiment"]["topology"]["mtu"] == 9000
    # the MTU is recorded where a reader of the run looks, and said at bring-up
    assert json.loads((run_dir / "run.json").read_text())["mtu_bytes"] == 9000
    network = json.loads((run_dir / "network.json").read_text())
    assert (network["mtu_bytes"], network["mss_bytes"]) == (9000, 8948)
    assert ("MTU: 9000 bytes on every interface (topology.mtu, read back at creation): 8948 bytes of TCP payload "
            "per frame") in " ".join(res.stdout.split())
    hops = {(p["source"], p["cluster"]): len(p["switches"]) - 1 for p in plan["paths"]}
    df = pd.read_csv(run_dir / "records.csv")
    traversals = sum(hops[(r.source, r.cluster)] for r in df.itertuples())
    assert traversals >= 100, f"only {traversals} link traversals: too few queries to tell"
    per = json.loads((run_dir / "summary.json").read_text())["link_emulators"]["per_emulator"]
    link_frames = sum(v["frames"] for v in per.values())
    request_frames_at_1500 = math.ceil(plan["request_bytes"]["digits"] / mss_of(1500))
    assert request_frames_at_1500 >= 13
    # request + answer + ACKs; LLDP, the self-check's pings and the warm-up add a little
    assert link_frames / traversals < request_frames_at_1500 - 3
