"""Bad input, sixth round: the training scenarios checked together before training (F3, F4, F10),
the ASET emulation benchmark's tables and record reuse (F7, F8), messages (F11/F13) and the
simulator's runs dir (F12). Fast: no emulation, no training step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testbed.spec.experiment import ConfigError

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _scenario(folder: Path, stem: str, name: str = "triangle", extra_source: bool = False, **replace: str) -> Path:
    """A copy of the triangle experiment in ``folder`` (topology by absolute path), renamed, with
    a third source if asked and any text replaced."""
    text = TRIANGLE.read_text().replace("../topologies/triangle.yaml", str(REPO / "topologies" / "triangle.yaml"))
    text = text.replace("name: triangle", f"name: {name}", 1)
    if extra_source:
        text = text.replace("  - {name: srcc, site: C}\n", "  - {name: srcc, site: C}\n  - {name: srcb, site: B}\n")
    for old, new in replace.items():
        text = text.replace(old, new)
    path = folder / f"{stem}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _aset_cfg(tmp_path: Path, scenarios: list[Path], **reward):
    from testbed.spec.aset import AsetConfig

    return AsetConfig.model_validate({"name": "t", "reward": reward, "training": {
        "scenarios": [str(s) for s in scenarios], "steps": 1, "episode": "2s", "out_dir": str(tmp_path / "out")}})


# --------------------------------------------------------------------------------------- F3

def test_training_scenarios_of_another_shape_are_refused_before_anything_is_written(tmp_path):
    from testbed.aset.dqn import train_seeds

    a = _scenario(tmp_path / "exp", "a")
    b = _scenario(tmp_path / "exp", "b", name="tri3", extra_source=True)
    cfg = _aset_cfg(tmp_path, [a, b])
    with pytest.raises(ConfigError) as err:
        train_seeds(cfg, tmp_path, steps=1)
    msg = str(err.value)
    assert str(a) in msg and str(b) in msg
    assert "sources srca, srcb, srcc (the first: srca, srcc)" in msg and "applications" in msg
    assert not (tmp_path / "out").exists()  # no checkpoints, no TensorBoard folder


# --------------------------------------------------------------------------------------- F4

def test_two_training_scenarios_of_one_name_are_refused_naming_both_files(tmp_path):
    from testbed.aset.dqn import train_seeds

    a = _scenario(tmp_path / "exp", "a")
    a2 = _scenario(tmp_path / "exp", "a2", **{"rate_qps: 4": "rate_qps: 6"})
    cfg = _aset_cfg(tmp_path, [a, a2], baseline_mix={"triangle": ["cloud", "closest"]})
    with pytest.raises(ConfigError, match=rf"{a} and {a2} are both named 'triangle'"):
        train_seeds(cfg, tmp_path, steps=1)
    with pytest.raises(ConfigError, match=rf"{a} is listed twice"):
        train_seeds(_aset_cfg(tmp_path, [a, a]), tmp_path, steps=1)
    assert not (tmp_path / "out").exists()


def test_a_mix_that_does_not_fit_names_the_scenario_file_it_does_not_fit():
    from testbed.aset.scenarios import check_reward_baselines
    from testbed.plan.build import plan_experiment
    from testbed.spec.aset import RewardSpec

    plan = plan_experiment(TRIANGLE)
    other = plan.model_copy(update={"experiment": plan.experiment.model_copy(update={"name": "other"})})
    other = other.model_copy(update={"hosts": [h for h in plan.hosts if h.name != "srcc"]})
    assert len(other.sources) == 1
    reward = RewardSpec(baseline_mix={"triangle": ["cloud", "closest"], "other": ["cloud", "closest"]})
    with pytest.raises(ConfigError, match=r"reward.baseline_mix.other: 2 policies for 1 source of training scenario "
                                          r"'other' \(/x/other.yaml\): srca$"):
        check_reward_baselines(reward, [plan, other], [Path("/x/triangle.yaml"), Path("/x/other.yaml")])


# --------------------------------------------------------------------------------------- F10

def test_an_empty_baseline_mix_is_refused_naming_the_config_file(tmp_path):
    from testbed.spec.aset import load_aset_config

    cfg = tmp_path / "experiments" / "aset.yaml"
    cfg.parent.mkdir()
    cfg.write_text("name: t\nreward: {baseline: closest, baseline_mix: {}}\n")
    with pytest.raises(ConfigError, match=rf"{cfg}: invalid ASET config\n  reward.baseline_mix: \{{\}} names no "
                                          r"scenario, so it would change nothing"):
        load_aset_config(cfg)


# --------------------------------------------------------------------------------------- F7, F8

@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import aset_emulation

    yield aset_emulation
    sys.modules.pop("aset_emulation", None)


def test_the_gap_table_compares_the_engines_over_the_same_seeds_and_says_which_were_left_out(bench, tmp_path):
    raw = [{"scenario": "sc", "policy": p, "seed": k, "run": None,
            "success_ratio": None if (p, k) == ("aset", 2) else 0.5 + 0.1 * k, "simulated": 0.9 if k == 2 else 0.6,
            "machine_busy": 0.6 + 0.1 * k if p == "min_latency" else None}
           for p in ("aset", "min_latency") for k in (1, 2, 3)]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in bench.tables(raw, "min_latency", tmp_path).splitlines()[2:]}
    assert rows["aset"] == ["1, 3 (left out, a figure missing: 2)", "70.00 ± 127.06", "60.00 ± 0.00", "+10.00", "-"]
    assert rows["min_latency"][4] == "70-90"  # the machine's CPUs busy over the emulated loads, by seed
    assert rows["min_latency"][0] == "1, 2, 3"
    assert rows["aset - min_latency"][:3] == ["1, 3 (left out, a figure missing: 2)", "+0.00 ± 0.00", "+0.00 ± 0.00"]


def test_simulated_records_are_reused_only_when_made_from_the_same_inputs(bench, tmp_path, monkeypatch):
    import testbed.results.runs as runs

    calls = []

    def fake(plan, seed=None, policy=None, run_dir=None, quiet=False, **kw):
        calls.append(plan.experiment.workload[0].rate_qps)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text("{}")
        return run_dir, {}

    monkeypatch.setattr(runs, "run_simulation", fake)
    scen = _scenario(tmp_path / "exp", "sc")
    stale = tmp_path / "sim" / "sc-minlatency-s1-sim"  # a record of the old naming: another scenario's
    stale.mkdir(parents=True)
    for f in ("summary.json", "records.parquet"):
        (stale / f).write_text("{}")
    first = bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim")
    assert first != stale and calls == [4]
    assert bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim") == first and calls == [4]
    scen.write_text(scen.read_text().replace("rate_qps: 4", "rate_qps: 5"))  # same file name, other scenario
    second = bench.simulate_records(scen, 1, "min_latency", tmp_path / "sim")
    assert second != first and calls == [4, 5]


# --------------------------------------------------------------------------------------- F11/F13

def test_a_plan_error_names_the_experiment_file(tmp_path):
    from testbed.aset.scenarios import scenario_sampler
    from testbed.plan.build import PlanError, plan_experiment
    from testbed.spec.aset import RandomiseSpec

    bad = _scenario(tmp_path, "bad", **{"min_accuracy: 0.5}": "min_accuracy: 0.5, family: nosuch}"})
    with pytest.raises(PlanError, match=rf"^{bad}: application 'digits': family 'nosuch'"):
        plan_experiment(bad)
    with pytest.raises(PlanError, match=rf"^{bad}: application 'digits'"):
        scenario_sampler([TRIANGLE, bad], RandomiseSpec())


def test_the_train_command_names_the_config_its_scenarios_came_from(tmp_path, capsys):
    from testbed.cli.main import main

    a = _scenario(tmp_path / "exp", "a")
    b = _scenario(tmp_path / "exp", "b", name="tri3", extra_source=True)
    cfg = tmp_path / "experiments" / "aset.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"name: t\ntraining: {{scenarios: [{a}, {b}], out_dir: {tmp_path / 'out'}}}\n")
    assert main(["train", str(cfg)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"error: {cfg}: training.scenarios: every scenario must have") and "Traceback" not in out
    assert not (tmp_path / "out").exists()


def test_counts_in_messages_agree_in_number():
    from testbed.core.errors import counted
    from testbed.spec.aset import RewardSpec

    assert (counted(1, "policy", "policies"), counted(2, "source"), counted(0, "step")) == \
        ("1 policy", "2 sources", "0 steps")
    with pytest.raises(ValueError, match=r"baseline_mix.x: 1 policy for 2 sources$"):
        RewardSpec(baseline_mix={"x": ["cloud"]}).baseline_for("x", 2)


def test_an_error_of_the_whole_file_has_no_location_prefix(tmp_path):
    from testbed.spec.experiment import load_experiment

    f = _scenario(tmp_path, "twice", **{"  - {name: srcc, site: C}\n": "  - {name: srcc, site: C}\n"
                                                                       "  - {name: srcc, site: B}\n"})
    with pytest.raises(ConfigError) as err:
        load_experiment(f)
    assert str(err.value) == f"{f}: invalid experiment\n  source name 'srcc' is used twice"


def test_a_negative_duration_is_said_to_be_negative(tmp_path):
    from testbed.spec.experiment import load_experiment

    f = _scenario(tmp_path, "neg", **{"duration: 8s": "duration: -1s"})
    with pytest.raises(ConfigError, match=r"\n  duration: '-1s' is negative; a duration must be positive$"):
        load_experiment(f)


def test_a_negative_duration_on_the_command_line_reaches_its_check(capsys):
    from testbed.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(TRIANGLE), "--duration", "-1s"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "expected one argument" not in err
    assert "argument --duration: duration for --duration: '-1s' is negative; a duration must be positive" in err


def test_a_directory_given_as_the_topology_file_is_said_to_be_one(tmp_path):
    from testbed.plan.build import plan_experiment
    from testbed.spec.topology import TopologyError

    (tmp_path / "topo.yaml").mkdir()
    f = _scenario(tmp_path, "tdir", **{str(REPO / "topologies" / "triangle.yaml"): "topo.yaml"})
    with pytest.raises(TopologyError, match=rf"^{f}: topology file 'topo.yaml': {tmp_path / 'topo.yaml'} is a "
                                            r"directory, not a topology file$"):
        plan_experiment(f)


def _double(x: int) -> int:
    return 2 * x


def test_a_corrupt_evaluation_cache_file_is_a_miss_with_a_warning(tmp_path):
    from testbed.aset.jobs import run_jobs, task_key

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{task_key(_double, (2,))}.json").write_text('{"truncat')
    (cache / f"{task_key(_double, (3,))}.json").write_text("7")  # a good entry is still served
    warned: list[str] = []
    assert run_jobs(_double, [(2,), (3,)], cache=cache, workers=1, warn=warned.append) == [4, 7]
    assert len(warned) == 1 and f"evaluation cache file {cache / task_key(_double, (2,))}.json is unreadable " \
        f"(JSONDecodeError" in warned[0]
    assert (cache / f"{task_key(_double, (2,))}.json").read_text() == "4"  # recomputed and written again


# --------------------------------------------------------------------------------------- F12

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
