"""The console names the ASET checkpoint a run loads (its ``aset.checkpoint``, the weights file and
its SHA-256), for the sources it drives; nothing is said when no source applies a checkpoint."""

from __future__ import annotations

from pathlib import Path

from testbed.cli.main import main
from testbed.core.hashing import file_sha256
from testbed.plan.build import plan_experiment
from testbed.results.runs import checkpoint_line

REPO = Path(__file__).resolve().parent.parent


def test_simulate_names_the_checkpoint_it_loads(tmp_path, capsys):
    assert main(["simulate", str(REPO / "experiments" / "aset-live.yaml"), "--duration", "2s",
                 "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    weights = REPO / "models" / "aset" / "aset.npz"
    assert (f"ASET: source(s) atl, lax, nyc, sea choose their policy each window with the checkpoint "
            f"models/aset/aset ({weights}, SHA-256 {file_sha256(weights)[:16]}...)") in out


def test_no_checkpoint_line_without_aset_or_with_a_policy_override():
    assert checkpoint_line(plan_experiment(REPO / "experiments" / "triangle.yaml")) is None
    assert checkpoint_line(plan_experiment(REPO / "experiments" / "aset-live.yaml"), policy="closest") is None
