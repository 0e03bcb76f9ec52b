"""Sweeps: the CI formula, and a small real sweep in two processes."""

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.core.util import ci95
from testbed.results.sweep_runner import sweep

REPO = Path(__file__).resolve().parent.parent


def test_ci95_known_values():
    m, h = ci95([0.9, 0.8, 0.85, 0.95, 0.75])
    # mean 0.85, s = 0.0790569, t_{0.975,4} = 2.7764451 -> 2.7764451 x 0.0790569 / sqrt(5) = 0.0981622
    assert m == pytest.approx(0.85) and h == pytest.approx(0.0981622, rel=1e-5)
    m, h = ci95([0.5])
    assert m == 0.5 and h != h  # NaN with one seed


def test_small_sweep_writes_tables_and_plots(tmp_path):
    exps = [str(REPO / "experiments/scenario-low.yaml"), str(REPO / "experiments/scenario-failure.yaml")]
    table = sweep(exps, ["closest", "cloud"], [1, 2], tmp_path, jobs=2, duration_s=20.0)
    assert len(table) == 4 and set(table["seeds"]) == {2}
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 8 and set(runs["policy"]) == {"closest", "cloud"}
    for f in ("runs.parquet", "table.csv", "table.md", "success_ratio.png", "e2e_p95.png"):
        assert (tmp_path / f).stat().st_size > 0
    low = table.set_index(["scenario", "policy"])
    # the cloud is out of reach of the 50 ms application: far below closest
    cloud, closest = (low.loc[("scenario-low", p), "success_mean"] for p in ("cloud", "closest"))
    assert cloud < closest - 0.3
    r = runs[(runs["scenario"] == "scenario-low") & (runs["policy"] == "cloud")]
    assert low.loc[("scenario-low", "cloud"), "success_mean"] == pytest.approx(r["success_ratio"].mean(), abs=1e-4)
    assert re.search(r"^\| scenario-low +\| closest +\| 2 +\|", (tmp_path / "table.md").read_text(), re.M)


def test_sweep_resumes_finished_cells(tmp_path):
    exp = [str(REPO / "experiments/triangle.yaml")]
    sweep(exp, ["closest"], [1, 2], tmp_path, jobs=1, duration_s=3.0)
    s1, s2 = sorted((tmp_path / "cells").rglob("*.parquet"))
    assert (s1.name, s2.name) == ("closest-s1.parquet", "closest-s2.parquet")
    first = pd.read_csv(tmp_path / "runs.csv")
    # a resumed sweep takes a finished cell as it is (marked here) and runs only the missing one
    row = pd.read_parquet(s1)
    row["success_ratio"] = 0.123
    row.to_parquet(s1, index=False)
    s2.unlink()
    sweep(exp, ["closest"], [1, 2], tmp_path, jobs=1, duration_s=3.0)
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert runs["success_ratio"].tolist() == [0.123, first["success_ratio"][1]] and s2.exists()
    # another duration is another experiment: nothing is reused
    sweep(exp, ["closest"], [1, 2], tmp_path, jobs=1, duration_s=4.0)
    assert 0.123 not in pd.read_csv(tmp_path / "runs.csv")["success_ratio"].tolist()
    assert len(list((tmp_path / "cells").rglob("*.parquet"))) == 4


def test_sweep_refuses_experiments_it_would_pool(tmp_path):
    """Two files with one ``name`` (the tables key rows by it) or one file twice: an error naming
    them, exit code 2, before any cell runs."""
    import shutil
    import subprocess
    import sys

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for f in (a, b):
        shutil.copy(REPO / "experiments/scenario-low.yaml", f)
    for args, said in (([a, b], "are both named 'scenario-low'"), ([a, a], "is listed twice")):
        res = subprocess.run([sys.executable, "-m", "testbed.cli", "sweep", *map(str, args), "--seeds", "1",
                              "--duration", "2s", "--out", str(tmp_path / "out")], capture_output=True, text=True)
        out = " ".join((res.stdout + res.stderr).split())  # the console wraps long lines
        assert res.returncode == 2 and said in out, out
        assert not (tmp_path / "out").exists()


def test_sweep_counts_every_failure_cause_so_they_add_up_to_the_failures(tmp_path):
    """The sweep's causes are the model's (testbed.model.records.CAUSES): fedc is down 15-30 s in
    scenario-failure, and the queries sent to it meanwhile are ``server_down``, which a sweep of its
    own list of causes dropped (the causes then did not add up to the failures)."""
    from testbed.model.records import CAUSES

    sweep([str(REPO / "experiments/scenario-failure.yaml")], ["closest"], [1], tmp_path, jobs=1, duration_s=20.0)
    (row,) = pd.read_csv(tmp_path / "runs.csv").to_dict("records")
    assert [c for c in row if c.startswith("fail_")] == [f"fail_{c}" for c in CAUSES]
    assert row["fail_server_down"] > 0
    failures = round(row["queries"] * (1 - row["success_ratio"]))
    assert sum(row[f"fail_{c}"] for c in CAUSES) == failures
    table = pd.read_csv(tmp_path / "table.csv")
    assert table.loc[0, "fail_server_down"] == row["fail_server_down"]


def test_a_cells_own_os_error_is_not_blamed_on_the_output_folder(tmp_path, monkeypatch):
    """A cell that cannot make its temporary run folder fails naming that (exit 3), not with
    "cannot write the sweep's results in OUT", which is kept for the sweep's own writes."""
    import errno
    import os

    import testbed.results.sweep_runner as sw
    from testbed.core.errors import RunFailure

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/sweep-x")

    monkeypatch.setattr(sw.tempfile, "mkdtemp", no_space)
    with pytest.raises(RunFailure) as err:
        sweep([str(REPO / "experiments/triangle.yaml")], ["closest"], [1], tmp_path / "out", jobs=1, duration_s=2.0)
    msg = str(err.value)
    assert err.value.exit_code == 3 and "cannot make its temporary run folder" in msg and "No space left" in msg
    assert "cannot write the sweep's results" not in msg and "triangle / closest / seed 1" in msg


def test_a_sweep_whose_cells_measured_nothing_exits_5_naming_them(tmp_path, capsys):
    from testbed.cli.main import main

    code = main(["sweep", str(REPO / "experiments/triangle.yaml"), "--seeds", "1", "--duration", "500us",
                 "--policies", "closest", "--jobs", "1", "--out", str(tmp_path / "s")])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 5 and "1 of 1 cells measured no query (triangle / closest / seed 1)" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "closest,closest", "--out", "x"], "--policies: 'closest' is given twice"),
    (["--policies", "closest", "--out", ""], "--out: an empty path"),
])
def test_sweep_refuses_a_policy_twice_and_an_empty_out(tmp_path, capsys, args, message):
    from testbed.cli.main import main

    assert main(["sweep", str(REPO / "experiments/triangle.yaml"), *args]) == 2
    assert message in capsys.readouterr().out
    assert not (Path.cwd() / "x").exists()


def _sleep_then(i: int, s: float) -> int:
    import time as _t

    _t.sleep(s)
    return i


def test_an_abandoned_process_pool_stops_its_workers_at_once():
    """An interrupted sweep waited for its running cells (80 s), and a
    SIGTERM to the command left the pool's workers running as orphans. Closing the iterator (what
    an interrupt or a failed task does) now stops them."""
    import multiprocessing
    import time as _t

    from testbed.core.distributed import imap_unordered

    before = set(multiprocessing.active_children())
    it = imap_unordered(_sleep_then, [(0, 0.0), (1, 60.0), (2, 60.0), (3, 60.0)], jobs=2)
    assert next(it) == (0, 0)
    _t.sleep(0.5)  # the two workers are in their 60 s cells
    assert len(set(multiprocessing.active_children()) - before) == 2
    t = _t.monotonic()
    it.close()
    assert _t.monotonic() - t < 10 and set(multiprocessing.active_children()) - before == set()


def test_sigterm_to_a_sweep_exits_130_and_leaves_no_worker(tmp_path):
    """README: 130 for Ctrl-C or SIGTERM, every command; a sweep died with 143 and left its workers."""
    import signal
    import subprocess as sp
    import time as _t

    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "testbed.cli", "sweep", str(REPO / "experiments" / "default.yaml"), "--policies",
           "closest", "--seeds", "2", "--duration", "30000s", "--jobs", "2", "--out", str(out)]
    p = sp.Popen(cmd, stdout=sp.PIPE, stderr=sp.STDOUT, text=True, cwd=REPO, start_new_session=True)
    _t.sleep(8)
    kids = sp.run(["pgrep", "-s", str(p.pid)], capture_output=True, text=True).stdout.split()
    assert len(kids) >= 3, kids  # the command and its two workers, in its own session
    p.send_signal(signal.SIGTERM)
    said, _ = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted" in said, said
    _t.sleep(0.5)
    assert sp.run(["pgrep", "-s", str(p.pid)], capture_output=True, text=True).stdout.split() == []


def test_sigkill_to_a_sweep_ends_its_workers(tmp_path):
    """After ``kill -9`` of ``testbed sweep --jobs 2`` the two workers
    (170 MB each) kept running. They now get the lifeline's death signal."""
    import os
    import signal
    import subprocess as sp
    import time as _t

    cmd = [sys.executable, "-m", "testbed.cli", "sweep", str(REPO / "experiments" / "default.yaml"), "--policies",
           "closest", "--seeds", "2", "--duration", "30000s", "--jobs", "2", "--out", str(tmp_path / "sw")]
    p = sp.Popen(cmd, stdout=sp.DEVNULL, stderr=sp.DEVNULL, cwd=REPO, start_new_session=True)

    def workers() -> list[int]:
        return [int(k) for k in sp.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]

    try:
        for _ in range(120):  # the workers start once the cells are planned
            if len(workers()) == 2:
                break
            _t.sleep(0.5)
        kids = workers()
        assert len(kids) == 2, kids
        _t.sleep(1.0)  # into their cells
        p.kill()
        p.wait(timeout=30)
        left = kids
        for _ in range(60):
            left = [k for k in kids if Path(f"/proc/{k}").exists() and
                    Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
            if not left:
                break
            _t.sleep(0.5)
        assert left == [], f"workers {left} outlived the killed sweep"
    finally:
        for k in sp.run(["pgrep", "-s", str(p.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(k), signal.SIGKILL)  # what the test started: the sweep's session


def test_a_sweep_shorter_than_its_scenarios_events_says_they_do_not_happen(tmp_path):
    """As testbed simulate does (the sweep's scenario-failure rows
    came from runs in which nothing failed, without a word)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    sweep([str(REPO / "experiments" / "scenario-failure.yaml")], ["closest"], [1], tmp_path / "sw", jobs=1,
          duration_s=5.0, console=Console(file=buf, width=300))
    assert ("note: scenario-failure: 2 event step(s) at or after the end of the load (5 s) do not happen (first: "
            "events.0 cluster_down at 15 s)") in buf.getvalue()


def test_help_texts_carry_no_rest_markup(capsys):
    """`testbed --help` showed ``literals`` and :mod:`roles` from the docstrings."""
    from testbed.cli.common import plain_help
    from testbed.cli.main import main

    assert plain_help("The ``testbed`` command (:mod:`testbed.cli.common`, :func:`~x.y`)") == \
        "The testbed command (testbed.cli.common, x.y)"
    for cmd in ([], ["sweep"], ["simulate"], ["evaluate"], ["train"], ["profile"]):
        with pytest.raises(SystemExit):
            main([*cmd, "--help"])
        out = capsys.readouterr().out
        assert "usage: testbed" in out and "``" not in out and ":mod:" not in out and ":func:" not in out, cmd
