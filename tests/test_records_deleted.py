"""A run whose records are deleted while its load runs (``rm -rf RUN/sources/*``), on the real
emulation (root, Mininet): the health watch notices that a source's records file is no longer
there and stops the run as a storage fault (exit code 4, a HEALTH line), each source writes its
file back from the file it still holds open, and the merge keeps every record, its tally saying
``restored``. About 40 s here; under the shared emulation lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"

pytestmark = [pytest.mark.emulation, pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")]


def test_records_deleted_during_the_load_are_a_storage_fault_and_written_back(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(TRIANGLE), "--runs-dir", str(runs),
                             "--duration", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, COLUMNS="200"))
    deleted = 0
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not deleted:
        recs = list(runs.glob("*/sources/*.records.csv"))
        if len(recs) == 2 and all(r.read_bytes().count(b"\n") >= 6 for r in recs):
            for f in recs[0].parent.iterdir():  # rm -rf RUN/sources/*
                f.unlink()
                deleted += 1
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=240)
    assert deleted, f"the records were never deleted:\n{out}"
    run_dir = next(runs.iterdir())
    assert proc.returncode == 4, out
    assert "HEALTH: storage sources/src" in out and "was deleted during the run" in out
    run = json.loads((run_dir / "run.json").read_text())
    assert run["exit_code"] == 4 and any(i["kind"] == "storage" for i in run["health"]["incidents"])
    for s in ("srca", "srcc"):  # written back whole from the open files
        tally = json.loads((run_dir / "sources" / f"{s}.tally.json").read_text())
        assert tally["restored"] and tally["written"] == len(pd.read_csv(run_dir / "sources" / f"{s}.records.csv"))
    df = pd.read_csv(run_dir / "records.csv")
    for src, g in df.groupby("source"):
        n = sorted(int(q.rsplit("-", 1)[1]) for q in g["query_id"])
        assert n == list(range(1, len(n) + 1)), f"query ids of {src} have gaps"
    assert "RECORDS: storage: sources/srca.records.csv was deleted during the run" in out
