"""Small command-line rules: ``evaluate`` refuses too few reference seeds before any run,
``report`` refuses a run folder given twice, the host-speed warning says the profilers overwrite
the tracked profiles, and ``cleanup`` removes a killed run's control folder.
"""

from __future__ import annotations

from pathlib import Path

from testbed.cli.main import main

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
_COMMANDS = {"run": ["run", "e.yaml"], "simulate": ["simulate", "e.yaml"],
             "sweep": ["sweep", "e.yaml", "--out", "o"], "evaluate": ["evaluate", "aset.yaml"]}


def test_evaluate_refuses_too_few_reference_seeds_before_any_run(capsys):
    """The oracle and the causal planner run on at least 5 evaluation seeds (their CIs), or not at
    all: ``--oracle 3`` is refused by name before any scenario runs, for experiment files too."""
    code = main(["evaluate", str(REPO / "experiments" / "default.yaml"), "--headroom", "--oracle", "3"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 2 and "--oracle 3: the oracle and the causal planner run on at least 5" in out, out


def test_report_refuses_a_run_folder_given_twice(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    assert main(["report", str(d), str(tmp_path / "." / "run")]) == 2
    assert f"run folder(s) given more than once: {d}" in " ".join(capsys.readouterr().out.split())


def test_the_host_speed_warning_says_the_profilers_overwrite_the_tracked_profiles():
    """It told the reader to run testbed profile and the handling measurement, both of which write
    into the tracked models/profiles/ by default (every later simulation then differs from the
    published figures) without saying so."""
    from testbed.results.summary import _headline

    s = {"queries": 1, "duration_s": 1.0, "host_speed": {"model": "hand_lite", "ratio": 1.6, "now_ms": 8.0,
                                                         "profile_ms": 5.0, "slow": True}}
    (line,) = [x for x in _headline(s) if x.startswith("WARNING: this machine ran")]
    assert ("into a copy of your own: both commands overwrite --profiles, by default the tracked models/profiles/ "
            "that every later simulation reads (cp -r models/profiles runs/profiles-here; testbed profile --shares "
            "1,2 --profiles runs/profiles-here; python -m testbed.serve.handling --profiles runs/profiles-here; "
            "then profiles_dir: runs/profiles-here in the experiment)") in line


def test_cleanup_removes_a_killed_runs_control_folder(tmp_path):
    """A killed run leaves /run/aset-testbed/ctl-<id>/ (its link emulators' control sockets): the
    next run's bring-up removed it, testbed cleanup did not."""
    import os
    import subprocess
    import sys

    (tmp_path / "ctl-0123456789").mkdir()
    (tmp_path / "ctl-0123456789" / "E0.sock").write_text("")
    (tmp_path / "keep").mkdir()
    res = subprocess.run([sys.executable, "-m", "testbed.cli", "cleanup"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TESTBED_STATE_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"removed control folder {tmp_path / 'ctl-0123456789'}" in res.stdout
    assert "removed 1 leftover item(s)" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "lock"]
