"""``testbed simulate``'s run directory: an unwritable runs folder is refused before anything is
simulated, and the check leaves nothing behind.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def test_simulate_refuses_an_unwritable_runs_dir_before_simulating(tmp_path, monkeypatch, capsys):
    import testbed.results.runs as runs
    from testbed.cli.main import main

    def never(*a, **kw):
        raise AssertionError("simulated before the runs dir was checked")

    monkeypatch.setattr(runs, "run_simulation", never)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["simulate", str(TRIANGLE), "--runs-dir", str(blocker / "runs")]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"error: --runs-dir: cannot create {blocker / 'runs'}: Not a directory" in out and "Traceback" not in out


def test_the_runs_dir_check_leaves_nothing_behind(tmp_path):
    from testbed.plan.build import runs_dir_problem

    assert runs_dir_problem(tmp_path / "a" / "b") is None
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("")
    assert runs_dir_problem(tmp_path / "f") == f"{tmp_path / 'f'} exists and is not a directory"
