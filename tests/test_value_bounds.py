"""Values past their stated bounds (bandwidths, memory, tolerances, a cluster's CPU cores) are clear
errors of ``testbed plan``, exit code 2, naming the item and the bound. Fast: no emulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
TRIANGLE_TOPO = REPO / "topologies" / "triangle.yaml"


def _write(tmp_path: Path, name: str, text: str, **replace: str) -> Path:
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def _triangle(tmp_path: Path, name: str = "e.yaml", topology: Path = TRIANGLE_TOPO, **replace: str) -> Path:
    """experiments/triangle.yaml in ``tmp_path`` with ``topology`` (absolute path), ``old=new`` replaced."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(topology))
    return _write(tmp_path, name, text, **replace)


def _topology(tmp_path: Path, **replace: str) -> Path:
    return _write(tmp_path, "t.yaml", TRIANGLE_TOPO.read_text(), **replace)


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


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
        path = _triangle(tmp_path, topology=_topology(tmp_path, **{old: new}))
    else:
        path = _triangle(tmp_path, **{old: new})
    code, out = _run(capsys, "plan", str(path))
    assert code == 2 and said in out, out
