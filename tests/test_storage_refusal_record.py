"""A run refused before bring-up for too little space still writes its ``run.json`` (status, exit
code, message and the storage estimate).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


@pytest.mark.skipif(os.geteuid() != 0, reason="testbed run checks for root first")
def test_a_run_refused_for_too_little_space_writes_its_run_json(tmp_path, monkeypatch, capsys):
    """docs/trustworthy-runs.md: exit 3 leaves run.json with exit_code and message; a run refused
    for too little space wrote none."""
    from testbed.cli.main import main
    from testbed.emu.storage import Storage

    monkeypatch.setattr(Storage, "free_bytes", lambda self: 1024 * 1024)
    exp = tmp_path / "e.yaml"
    exp.write_text(TRIANGLE.read_text().replace("../topologies/triangle.yaml",
                                                str(REPO / "topologies" / "triangle.yaml")))
    code = main(["run", str(exp), "--runs-dir", str(tmp_path / "runs")])
    said = " ".join(capsys.readouterr().out.split())
    assert code == 3 and "1.0 MiB free, and this run writes" in said, said
    (run_dir,) = (tmp_path / "runs").iterdir()
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 3 and "1.0 MiB free" in rec["message"]
    assert rec["mode"] == "emulation" and rec["storage"]["free_bytes_at_start"] == 1024 * 1024
    assert rec["storage"]["estimate_bytes"] > 1024 * 1024
