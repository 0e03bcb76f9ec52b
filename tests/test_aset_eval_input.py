"""``testbed evaluate`` refuses bad input before any run, naming it: two scenarios of one name or
one file listed twice, results folders that cannot be written, a duration that expects no query or
is not whole decision windows, a checkpoint cut short; and a seed on which no query was created
never divides by zero.

Every check here runs before the first job: :func:`testbed.aset.evaluate.run_jobs` is replaced by
a function that fails the test if a job is started.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.aset import evaluate as ev_mod
from testbed.cli.main import main
from testbed.core.errors import EXIT_BRINGUP, EXIT_INPUT, EXIT_NOTHING_MEASURED, InputError, RunFailure
from testbed.model.policies import CATALOGUE

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _scenario(tmp_path: Path, file: str = "triangle.yaml", **changes) -> Path:
    """A copy of the triangle (topology by absolute path) with ``changes`` to its top-level keys
    and ``rate_qps`` / ``deadline`` of its workload and application."""
    d = yaml.safe_load(TRIANGLE.read_text())
    d["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    if "rate_qps" in changes:
        d["workload"][0]["rate_qps"] = changes.pop("rate_qps")
    if "deadline" in changes:
        d["applications"][0]["deadline"] = changes.pop("deadline")
    d.update(changes)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(d))
    return path


def _config_file(tmp_path: Path, scenarios: list[str], **evaluation) -> Path:
    """The same as a YAML file (absolute paths), for the command line."""
    d = yaml.safe_load((REPO / "experiments" / "aset-tiny.yaml").read_text())
    d["evaluation"].update({"scenarios": scenarios, "out_dir": str(tmp_path / "ev"), "duration": "3s", **evaluation})
    path = tmp_path / "cfg" / "aset.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture
def no_jobs(monkeypatch):
    """Fail the test if evaluate starts a job (the checks must come first)."""
    def refuse(*_a, **_k):
        raise AssertionError("a job was started before the input was checked")
    monkeypatch.setattr(ev_mod, "run_jobs", refuse)


def _protocol(**kw) -> ev_mod.Protocol:
    return ev_mod.Protocol(**{"tuning": [1, 2], "seeds": [3, 4], "actions": list(CATALOGUE), "duration_s": 3.0,
                              **kw})


def _headroom(tmp_path: Path, scenarios: list, **kw):
    return ev_mod.evaluate([str(s) for s in scenarios], _protocol(**kw), tmp_path / "ev", workers=1, progress=False)


# ----------------------------------------------------------------------------- 1. one name, one file
def test_two_scenarios_of_one_name_are_refused_naming_both_files(tmp_path, no_jobs):
    a = _scenario(tmp_path)
    b = _scenario(tmp_path, "copy.yaml", rate_qps=6, deadline="80ms")  # also named 'triangle'
    with pytest.raises(InputError, match=rf"{a}.*{b}.*both named 'triangle'"):
        _headroom(tmp_path, [a, b])
    assert not (tmp_path / "ev").exists()


def test_one_file_listed_twice_is_refused_even_spelled_otherwise(tmp_path, no_jobs):
    a = _scenario(tmp_path)
    with pytest.raises(InputError, match=rf"{a} is listed twice"):
        _headroom(tmp_path, [a, tmp_path / "." / a.name])
    assert not (tmp_path / "ev").exists()


# ----------------------------------------------------------------------------- 2. results folders
@pytest.mark.parametrize("in_the_way", ["ev", "ev/cache"])
def test_a_file_in_the_way_of_the_results_is_refused_before_any_run(tmp_path, no_jobs, in_the_way):
    a = _scenario(tmp_path)
    blocker = tmp_path / in_the_way
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder")
    with pytest.raises(RunFailure, match=rf"results folder .*{blocker} exists and is not a directory") as exc:
        _headroom(tmp_path, [a])
    assert exc.value.exit_code == EXIT_BRINGUP
    assert blocker.read_text() == "not a folder"  # nothing else written
    if in_the_way != "ev":
        assert [p.name for p in (tmp_path / "ev").iterdir()] == [blocker.name]


def test_the_command_says_the_results_folder_is_a_file_without_a_traceback(tmp_path, capsys, no_jobs):
    (tmp_path / "ev").write_text("")
    path = _config_file(tmp_path, [str(_scenario(tmp_path))])
    assert main(["evaluate", str(path), "--headroom", "--out", str(tmp_path / "ev")]) == EXIT_BRINGUP
    out = capsys.readouterr().out
    assert "error: results folder" in out and "Traceback" not in out


# ----------------------------------------------------------------------------- 3. no query expected / met
def test_a_duration_the_workload_expects_no_query_in_is_refused_naming_file_and_duration(tmp_path, no_jobs):
    low = _scenario(tmp_path, rate_qps=0.07)
    with pytest.raises(InputError, match=rf"{low} with --duration 0.5 s: the workload expects 0.07 queries"):
        _headroom(tmp_path, [low], duration_s=0.5)


def test_best_mix_leaves_out_a_seed_without_query_and_says_when_every_seed_has_none(monkeypatch):
    from testbed.aset import headroom
    from testbed.plan.build import plan_experiment

    plan = plan_experiment(TRIANGLE)
    counts = {1: (3, 4), 2: (0, 0)}
    monkeypatch.setattr(headroom, "static_ratio", lambda _p, seed, *_a: counts[seed])
    mix, value, _ = headroom.best_mix(plan, [1, 2], ["closest", "cloud"], "closest")
    assert value == 0.75 and mix == ["closest", "closest"]
    counts[1] = (0, 0)
    with pytest.raises(ValueError, match=r"triangle, seeds \[1, 2\]: no query .* undefined"):
        headroom.best_mix(plan, [1, 2], ["closest", "cloud"], "closest")


def _fake_runs(monkeypatch, static):
    """evaluate's jobs replaced: ``static(seed) -> {policy: (ok, n)}``; the mix keeps 'cloud'."""
    def run_jobs(fn, tasks, **_kw):
        if fn is ev_mod.static_job:
            return [{a: static(t[1]) [a] for a in t[2]} for t in tasks]
        if fn is ev_mod.mix_job:
            return [[["cloud", "cloud"], 1.0] for _ in tasks]
        if fn is ev_mod.assignment_job:
            return [list(static(t[1])["cloud"]) for t in tasks]
        raise AssertionError(fn)
    monkeypatch.setattr(ev_mod, "run_jobs", run_jobs)


def test_a_scenario_without_any_query_on_the_tuning_seeds_stops_with_exit_5(tmp_path, monkeypatch):
    _fake_runs(monkeypatch, lambda k: {"closest": (0, 0), "cloud": (0, 0)})
    with pytest.raises(RunFailure, match=r"triangle.yaml: no query was created on any tuning seed \(1,2\)") as exc:
        ev_mod.evaluate([str(_scenario(tmp_path))], _protocol(actions=["closest", "cloud"], fresh=False),
                        tmp_path / "ev", progress=False)
    assert exc.value.exit_code == EXIT_NOTHING_MEASURED


def test_a_seed_without_query_counts_in_no_mean_and_no_seed_count(tmp_path, monkeypatch):
    """Seeds 2 and 4 created no query (success ratio NaN): the best static is chosen on seed 1, and
    the tables say 1 evaluation seed, not 2."""
    _fake_runs(monkeypatch, lambda k: {"closest": (1, 2), "cloud": (2, 2)} if k in (1, 3)
               else {"closest": (0, 0), "cloud": (0, 0)})
    res = ev_mod.evaluate([str(_scenario(tmp_path))], _protocol(actions=["closest", "cloud"], fresh=False),
                          tmp_path / "ev", progress=False)
    (row,) = res.rows
    assert row["best_static"] == "cloud" and row["tuning_means"] == {"closest": 50.0, "cloud": 100.0}
    assert row["rows"]["cloud"]["mean"] == 100.0 and row["rows"]["cloud"]["seeds"] == 1
    assert math.isnan(row["rows"]["cloud"]["ci"]) and row["gains"]["mix"]["n"] == 1


# ----------------------------------------------------------------------------- 4. a checkpoint cut short
def _export(path: Path) -> Path:
    from testbed.agent.npolicy import export_policy
    from testbed.agent.observation import observation_size
    from testbed.spec.aset import ObservationSpec

    size = observation_size(1, 2, 2, 4, 2)
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=(size, 8)), np.zeros(8), rng.normal(size=(8, 2)), np.zeros(2)]
    export_policy(ws, path, obs_spec=ObservationSpec(), applications=["digits"], clusters=["edgeb", "edgec"],
                  policies=["closest", "cloud"], sources=["srca", "srcc"])
    return path.with_name(path.name + ".npz")


def test_a_cut_npz_or_json_is_a_value_error_naming_the_file(tmp_path):
    from testbed.agent.npolicy import NumpyPolicy

    npz = _export(tmp_path / "policy")
    NumpyPolicy(tmp_path / "policy")  # whole: it opens
    npz.write_bytes(npz.read_bytes()[:300])
    with pytest.raises(ValueError, match=rf"{npz} is not a readable numpy archive"):
        NumpyPolicy(tmp_path / "policy")
    _export(tmp_path / "policy")
    meta = tmp_path / "policy.json"
    meta.write_text(meta.read_text()[:29])
    with pytest.raises(ValueError, match=rf"{meta} is unreadable or not JSON"):
        NumpyPolicy(tmp_path / "policy")
    meta.write_text('{"kind": "qnetwork", "version": 3}')
    with pytest.raises(ValueError, match=rf"{meta}: no list of at least 2 policies"):
        NumpyPolicy(tmp_path / "policy")


def test_evaluate_and_the_bench_name_a_cut_checkpoint_without_a_traceback(tmp_path, capsys, no_jobs):
    from testbed.aset import bench

    npz = _export(tmp_path / "policy")
    npz.write_bytes(npz.read_bytes()[:300])
    path = _config_file(tmp_path, [str(_scenario(tmp_path))], checkpoint=str(tmp_path / "policy"))
    assert main(["evaluate", str(path)]) == EXIT_INPUT
    out = capsys.readouterr().out
    assert f"ASET checkpoint file {npz} is not a readable numpy archive" in out and "Traceback" not in out
    live = _scenario(tmp_path, "live.yaml", aset={"checkpoint": str(tmp_path / "policy"), "window": "500ms"})
    assert bench.main([str(tmp_path / "policy"), str(live), "10"]) == EXIT_INPUT
    assert str(npz) in capsys.readouterr().err


# ----------------------------------------------------------------------------- 5. --duration
def test_duration_help_and_check_say_the_same_range(capsys):
    from testbed.cli.evaluate import DURATION_HELP, MAX_EPISODE_S

    assert f"({MAX_EPISODE_S:g} s)" in DURATION_HELP
    for bad in ("0", "0ms", "3601", "3600.5s"):
        with pytest.raises(SystemExit) as exc:
            main(["evaluate", str(REPO / "experiments" / "aset-tiny.yaml"), "--duration", bad])
        assert exc.value.code == EXIT_INPUT
        assert f"the duration must be in (0, {MAX_EPISODE_S:g}] s" in capsys.readouterr().err


@pytest.mark.parametrize(("duration", "says"), [(0.1, r"--duration 0.1 s is shorter than one decision window"),
                                                (0.7, r"--duration 0.7 s is not a whole number of decision windows")])
def test_a_duration_that_is_not_whole_decision_windows_is_refused_naming_both(tmp_path, no_jobs, duration, says):
    a = _scenario(tmp_path)
    with pytest.raises(InputError, match=rf"{says} \(the report interval of {a}: 500 ms\)"):
        _headroom(tmp_path, [a], duration_s=duration)
    assert not (tmp_path / "ev").exists()


def test_an_agent_s_decision_window_is_checked_too(tmp_path, no_jobs):
    from testbed.agent.general import export_general
    from testbed.aset.general import init_weights
    from testbed.spec.aset import ObservationSpec

    export_general(init_weights([4], 1), tmp_path / "g1s", policies=["closest", "cloud"],
                   obs_spec=ObservationSpec(window_ms=1000))
    with pytest.raises(InputError, match=r"--duration 2.5 s is not a whole number .*g1s's window: 1000 ms"):
        ev_mod.evaluate([str(_scenario(tmp_path))], _protocol(duration_s=2.5), tmp_path / "ev",
                        agents={"g1s": str(tmp_path / "g1s")}, progress=False)
