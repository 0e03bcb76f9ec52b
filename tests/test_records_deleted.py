"""A run whose records are deleted while its load runs (``rm -rf RUN/sources/*``), on the real
emulation (root, Mininet): the health watch notices that a source's records file is no longer
there and stops the run as a storage fault (exit code 4, a HEALTH line), each source writes its
file back from the file it still holds open, and the merge keeps every record, its tally saying
``restored``. The emulation test takes about 40 s here, under the shared emulation lock; the parts
(the storage watch, the health incident, the tally check) are tested alone first.
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



def test_the_storage_watch_reports_a_records_file_that_is_gone_once(tmp_path):
    from rich.console import Console

    from testbed.emu.health import HealthWatch, RunRecord
    from testbed.emu.storage import Storage, StorageEstimate

    (tmp_path / "sources").mkdir()
    f = tmp_path / "sources" / "srca.records.csv"
    f.write_text("query_id\n")
    storage = Storage(tmp_path, StorageEstimate(0, 0, 0, 0, 1 << 20))
    assert storage.vanished() == []
    f.unlink()
    assert storage.vanished() == ["sources/srca.records.csv"] and storage.vanished() == []
    f.write_text("query_id\n")
    storage = Storage(tmp_path, StorageEstimate(0, 0, 0, 0, 1 << 20))
    watch = HealthWatch(RunRecord(tmp_path / "run.json", {}), Console(quiet=True), storage=storage)
    watch.check()
    f.unlink()
    watch.check()
    (inc,) = watch.incidents
    assert inc.kind == "storage" and inc.component == "sources/srca.records.csv" and "deleted during the run" in inc.how
    assert watch.failure is not None and watch.failure.exit_code == 4


def test_the_tally_check_names_lost_restored_and_vanished_records():
    from testbed.results.record_files import storage_faults

    rc = {"rows_per_source_file": {"a": 5, "b": 0, "c": 9, "d": 3}, "queries_written": {"a": 8, "b": 4, "c": 9},
          "records_file_missing": ["b"], "rows_lost": {"a": 3, "b": 4}, "records_restored": ["c"],
          "sources_without_tally": ["d"]}
    said = storage_faults(rc)
    assert said == [
        "storage: sources/b.records.csv is missing while source b's tally says it wrote 4 records; none of them is "
        "in this run",
        "storage: sources/a.records.csv holds 5 rows while source a's tally says it wrote 8: 3 lost",
        "storage: sources/c.records.csv was deleted during the run; source c wrote it back from its open file (9 "
        "rows), but the run was disturbed",
        "source d vanished: it left no tally (it exited without closing its records: os._exit in a plug-in, a kill, "
        "a crash), so the queries it made after its last record are not counted"]
    assert storage_faults({"rows_per_source_file": {"a": 8}, "queries_written": {"a": 8}}) == []


@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
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
