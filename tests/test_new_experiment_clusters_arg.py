"""``testbed new-experiment --clusters NODE[:TIER][:CORES]``: a wrong part after a node that exists
is named as the wrong part (a tier, a CPU share), never as a node the topology lacks; a CPU share
past what a cluster can be is refused with the bound; a node named twice with one tier, and an
``auto:N`` that is not a whole number >= 1, are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.spec.experiment import MAX_CPU_CORES

REPO = Path(__file__).resolve().parent.parent
TRIANGLE_TOPO = REPO / "topologies" / "triangle.yaml"


@pytest.mark.parametrize("clusters, said", [
    ("B:far_edge:-1", "node 'B' is in the topology; '-1' is not a CPU share: cores are a number from 0.01 to 512"),
    ("B:-1", "node 'B' is in the topology; '-1' is not a CPU share"),
    ("B:far_edge:1e6", "'1e6' is not a CPU share"),
    ("B:far_edge:lots", "'lots' is neither a tier (far_edge or near_edge) nor a CPU share"),
    ("B:far_edge:100000", f"100000 cores is over {MAX_CPU_CORES:g}, the most a cluster (one host) has"),
    ("Q:far_edge:1", "the topology has no node 'Q'"),
    ("B,B", "node(s) 'B' named twice with one tier"),
    ("auto:-1", "auto:N needs a whole number N >= 1"),
    ("auto:two", "auto:N needs a whole number N >= 1"),
])
def test_the_wrong_part_of_a_cluster_item_is_named(clusters, said, tmp_path, capsys):
    code = main(["new-experiment", "--topology", str(TRIANGLE_TOPO), "--clusters", clusters, "--sources", "auto:1",
                 "--out", str(tmp_path / "e.yaml")])
    out = capsys.readouterr().out
    assert code == 2 and said in out, out
    assert "no node 'B:" not in out
    assert not (tmp_path / "e.yaml").exists()


def test_two_clusters_at_one_node_are_taken_when_their_tiers_differ(tmp_path, capsys):
    code = main(["new-experiment", "--topology", str(TRIANGLE_TOPO), "--clusters", "B:far_edge,B:near_edge",
                 "--sources", "auto:1", "--out", str(tmp_path / "e.yaml")])
    assert code == 0, capsys.readouterr().out
    assert (tmp_path / "e.yaml").read_text().count('site: "B"') == 2


@pytest.mark.parametrize("deadline", ["0ms", "0.5ms", "700s"])
def test_a_deadline_out_of_the_experiments_bounds_is_named_as_the_option(deadline, tmp_path, capsys):
    code = main(["new-experiment", "--topology", str(TRIANGLE_TOPO), "--clusters", "auto:1", "--sources", "auto:1",
                 "--deadline", deadline, "--out", str(tmp_path / "e.yaml")])
    out = capsys.readouterr().out
    assert code == 2 and f"--deadline {deadline}: a deadline is from 1 ms to 600 s" in out, out
    assert not (tmp_path / "e.yaml").exists()
