"""``testbed sweep --out`` and ``testbed report`` on folders that are not theirs to write.

A sweep writes only into a new or empty folder, or resumes one it made with the same inputs
(``sweep.json``); it refuses another tool's folder (an evaluation's ``runs.csv`` and
``results.md``), a sweep of other inputs, and a path under a file, before anything runs. A cell
file cut short is run again, not a traceback at the end. A sweep whose backend never came up
leaves no folder behind. ``testbed report`` only reads the runs it reports on: an unfinished
run's sources are merged in memory, never into the run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from testbed.cli.main import main
from testbed.core.errors import InputError
from testbed.results.sweep_runner import sweep

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = str(REPO / "experiments/triangle.yaml")


def _said(capsys) -> str:
    got = capsys.readouterr()
    return " ".join((got.out + got.err).split())  # the console wraps long lines


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _sweep_args(out: Path, *more: str) -> list[str]:
    return ["sweep", TRIANGLE, "--policies", "closest", "--seeds", "1", "--duration", "2s", "--jobs", "1",
            "--out", str(out), *more]


# ------------------------------------------------------------------------------------------- sweep


def test_sweep_refuses_a_folder_another_tool_made(tmp_path, capsys):
    """--out at a copy of an ASET evaluation folder replaced its runs.csv, so its
    results.md no longer matched it."""
    ev = tmp_path / "aset-tiny"
    ev.mkdir()
    (ev / "runs.csv").write_text("scenario,policy,seed,success_ratio\naset-tiny,aset,1,0.9\n")
    (ev / "results.md").write_text("| policy | success |\n| aset | 0.9 |\n")
    before = _files(ev)
    assert main(_sweep_args(ev)) == 2
    said = _said(capsys)
    assert f"--out {ev}: the folder holds results.md, runs.csv but no sweep.json" in said, said
    assert "Traceback" not in said and "nothing was run" in said
    assert _files(ev) == before and sorted(p.name for p in ev.iterdir()) == ["results.md", "runs.csv"]


def test_sweep_resumes_its_own_folder_and_extends_it_with_other_inputs(tmp_path, capsys):
    """A sweep's own folder is resumed as it is, and extended (more seeds, another policy or
    duration: cells keyed by their inputs) with a note naming what changed; its record follows."""
    out = tmp_path / "sw"
    assert main(_sweep_args(out)) == 0
    record = json.loads((out / "sweep.json").read_text())
    assert record["inputs"]["policies"] == ["closest"] and record["inputs"]["seeds"] == [1]
    assert record["inputs"]["duration_s"] == 2.0
    capsys.readouterr()
    assert main(_sweep_args(out)) == 0  # the same inputs: resumed, nothing runs again
    assert "1 of 1 cells already done" in _said(capsys)
    args = _sweep_args(out)
    args[args.index("--seeds") + 1] = "2"
    assert main(args) == 0
    said = _said(capsys)
    assert "was made by a sweep of other inputs (seeds: [1] there, [1, 2] here" in said, said
    assert "1 of 2 cells already done" in said
    assert json.loads((out / "sweep.json").read_text())["inputs"]["seeds"] == [1, 2]
    assert len(pd.read_csv(out / "runs.csv")) == 2


def test_a_cell_file_cut_short_runs_again(tmp_path, capsys):
    """A truncated cells/.../closest-s1.parquet counted as done, then the end of the
    sweep died in pyarrow (ArrowInvalid: magic bytes not found)."""
    out = tmp_path / "sw"
    assert main(_sweep_args(out)) == 0
    (cell,) = (out / "cells").rglob("closest-s1.parquet")
    whole = pd.read_parquet(cell)
    cell.write_bytes(cell.read_bytes()[:100])
    capsys.readouterr()
    assert main(_sweep_args(out)) == 0
    said = _said(capsys)
    assert f"cell file {cell} cannot be read back" in said and "running that cell again" in said, said
    assert "Traceback" not in said and "0 of 1" not in said
    pd.testing.assert_frame_equal(pd.read_parquet(cell).drop(columns="wall_s"), whole.drop(columns="wall_s"))
    assert len(pd.read_csv(out / "runs.csv")) == 1


def test_another_cells_row_in_a_cell_file_runs_again(tmp_path):
    out = tmp_path / "sw"
    sweep([TRIANGLE], ["closest"], [1, 2], out, jobs=1, duration_s=2.0)
    s1, s2 = sorted((out / "cells").rglob("*.parquet"))
    shutil.copyfile(s1, s2)  # seed 1's row under seed 2's name
    sweep([TRIANGLE], ["closest"], [1, 2], out, jobs=1, duration_s=2.0)
    assert pd.read_csv(out / "runs.csv")["seed"].tolist() == [1, 2]


def test_sweep_out_under_a_file_is_refused_by_name(tmp_path, capsys):
    """--out <file>/sub said 'nothing was run; the cells finished so far are kept: run
    again to resume'."""
    f = tmp_path / "afile"
    f.write_text("x")
    assert main(_sweep_args(f / "sub")) == 2
    said = _said(capsys)
    assert f"--out {f / 'sub'}: {f} is a file, not a folder; nothing was run" in said, said
    assert "resume" not in said and f.read_text() == "x"


def test_an_unreachable_ray_leaves_no_output_folder(tmp_path):
    """An unreachable --ray-address left an empty out folder behind."""
    new = tmp_path / "new" / "sw"
    with pytest.raises(InputError, match="127.0.0.1:1"):
        sweep([TRIANGLE], ["closest"], [1], new, duration_s=2.0, ray_address="127.0.0.1:1")
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        sweep([TRIANGLE], ["closest"], [1], empty, duration_s=2.0, ray_address="127.0.0.1:1")
    assert list(empty.iterdir()) == []  # as it was: empty


# ------------------------------------------------------------------------------------------- report


@pytest.fixture
def unfinished_run(tmp_path) -> Path:
    """A tiny simulated run made to look like an emulation killed before its teardown: only its
    sources' records, ``run.json`` saying running."""
    assert main(["simulate", TRIANGLE, "--duration", "2s", "--runs-dir", str(tmp_path / "runs")]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    for name in ("records.csv", "records.parquet", "summary.json"):
        (run / name).unlink()
    info = json.loads((run / "run.json").read_text())
    info.update(status="running", mode="emulation")
    (run / "run.json").write_text(json.dumps(info))
    return run


def _sources_rows(run: Path) -> int:
    return sum(len(pd.read_csv(p)) for p in (run / "sources").glob("*.records.csv"))


def test_report_does_not_write_into_the_run_it_reads(unfinished_run, tmp_path, capsys):
    """A report of a run with only sources/*.records.csv wrote records.csv and
    records.parquet into it (merge_records), which later reports then preferred."""
    from testbed.results.html_report import build_report

    before = _files(unfinished_run)
    assert main(["report", str(unfinished_run), "--out", str(tmp_path / "rep")]) == 0
    assert _files(unfinished_run) == before
    out = build_report([unfinished_run], tmp_path / "rep2")
    assert _files(unfinished_run) == before and out["html"].exists()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"{_sources_rows(unfinished_run)} queries" in md and "unfinished" in md


def test_report_of_an_unfinished_run_reads_its_sources_not_an_older_snapshot(unfinished_run):
    """A records.csv that an older ``testbed report`` left in an unfinished run is not the run's own
    merge: the sources (which went on growing) are read."""
    from testbed.results.html_report import load_run

    merged = pd.concat([pd.read_csv(p) for p in sorted((unfinished_run / "sources").glob("*.records.csv"))])
    merged = merged.sort_values("t0_ns")
    merged.head(2).to_csv(unfinished_run / "records.csv", index=False)
    merged.head(2).to_parquet(unfinished_run / "records.parquet", index=False)
    assert len(load_run(unfinished_run).records) == _sources_rows(unfinished_run) > 2


def test_the_runs_own_merge_still_writes_the_merged_records(unfinished_run):
    from testbed.results.summary import merge_records

    df = merge_records(unfinished_run)
    assert len(pd.read_csv(unfinished_run / "records.csv")) == len(df) == _sources_rows(unfinished_run)
    assert (unfinished_run / "records.parquet").exists()


def test_a_failed_extension_keeps_the_record_of_the_tables_there(tmp_path, capsys):
    """Sweep.json describes the tables in the folder: an extension that fails before its tables
    are written leaves the old record (it used to say the new seeds at once)."""
    out = tmp_path / "sw"
    assert main(_sweep_args(out)) == 0
    record = (out / "sweep.json").read_bytes()
    args = _sweep_args(out)
    args[args.index("--seeds") + 1] = "2"
    args += ["--backend", "ray", "--ray-address", "127.0.0.1:1"]  # nothing listens there: fails before a cell
    assert main(args) != 0
    assert (out / "sweep.json").read_bytes() == record


def test_an_empty_cells_folder_does_not_make_a_foreign_folder_a_sweeps(tmp_path, capsys):
    out = tmp_path / "sw"
    (out / "cells").mkdir(parents=True)
    (out / "runs.csv").write_text("theirs\n")
    (out / "results.md").write_text("theirs\n")
    assert main(_sweep_args(out)) == 2
    assert "but no sweep.json" in _said(capsys) and (out / "runs.csv").read_text() == "theirs\n"
