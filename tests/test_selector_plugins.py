"""Selector plug-ins (``aset.selector``; :mod:`testbed.agent.selector`): a callable, a class with
``select`` and a Stable-Baselines3 model drive the sources window by window in the simulator and in
the emulation, through the one resolver and driver; a bad one is a plan error naming it; one that
raises mid-run stops the run (exit code 4) with its traceback."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from testbed.agent.live import SourceSelector, check_agents
from testbed.agent.selector import SelectorError, SelectorFailed, source_context
from testbed.cli.main import main as cli_main
from testbed.core.errors import EXIT_COMPONENT_DIED, EXIT_INPUT
from testbed.core.hashing import file_sha256
from testbed.model.policies import CATALOGUE
from testbed.plan.boundaries import SelectorContext, SourceConfig
from testbed.plan.build import build_plan
from testbed.results.runs import run_simulation
from testbed.sim.run import simulate
from testbed.spec.experiment import Experiment

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"
WINDOW_S = 0.5  # the triangle's report interval, the selector's default window


def _experiment(selector: dict, **changes) -> Experiment:
    data = copy.deepcopy(yaml.safe_load(TRIANGLE.read_text()))
    data.update({"policy": "aset", "aset": {"selector": selector}, "duration": "6s"}, **changes)
    return Experiment.model_validate(data)


def _plan(selector: dict, **changes):
    return build_plan(_experiment(selector, **changes), base_dir=TRIANGLE.parent)


def _policy_by_window(rows) -> dict[tuple[str, int], set[str]]:
    """(source, window index) -> the policies of the queries created in that window."""
    out: dict[tuple[str, int], set[str]] = {}
    for r in rows:
        w = int((int(r["t0_ns"]) / 1e9) // WINDOW_S)
        out.setdefault((r["source"], w), set()).add(r["policy"])
    return out


def _assert_follows(by_window: dict, expected) -> None:
    """Every window with queries ran exactly the policy ``expected(window)`` (window 0: the initial)."""
    assert len(by_window) >= 8, by_window
    for (src, w), pols in by_window.items():
        assert pols == {expected(w)}, (src, w, pols)


# -- the observation ------------------------------------------------------------------------------

def test_selector_observes_a_row_of_aset_sim_env():
    """The selector's observation context is the one of testbed/AsetSim-v0's rows (same names in the
    same order, same RTTs), so a model trained there reads the same features."""
    from testbed.aset.envs import plan_contexts

    plan = _plan({"use": "selector_fixtures:by_index"})
    env_rows = plan_contexts(plan, CATALOGUE)
    for row in env_rows:
        assert source_context(SelectorContext.from_plan(plan, row.source)) == row


# -- the simulator ----------------------------------------------------------------------------------

def test_callable_selector_drives_the_simulator_window_by_window():
    plan = _plan({"use": "selector_fixtures:by_index", "params": {"every": 1}})
    out = simulate(plan)
    # the k-th decision (at the end of window k, k from 0) applies to window k + 1
    _assert_follows(_policy_by_window(out.sim.records()),
                    lambda w: "closest" if w == 0 else CATALOGUE[(w - 1) % len(CATALOGUE)])
    assert out.selector["kind"] == "callable" and out.selector["sources"] == ["srca", "srcc"]
    assert sum(out.selector["choices"]["srca"].values()) == 12  # 6 s of 500 ms windows


def test_class_selector_drives_the_simulator_and_run_json_records_it(tmp_path):
    cycle = ["least_loaded", "cloud", "min_latency"]
    plan = _plan({"use": "selector_fixtures:Cycle", "params": {"policies": cycle}},
                 aset={"selector": {"use": "selector_fixtures:Cycle", "params": {"policies": cycle}},
                       "options": {"initial_policy": "round_robin"}})
    run_dir, summary = run_simulation(plan, runs_dir=tmp_path, quiet=True)
    rows = pd.concat([pd.read_csv(f) for f in sorted((run_dir / "sources").glob("*.records.csv"))]).to_dict("records")
    _assert_follows(_policy_by_window(rows), lambda w: "round_robin" if w == 0 else cycle[(w - 1) % 3])
    rec = json.loads((run_dir / "run.json").read_text())["selector"]
    assert rec["kind"] == "class" and rec["use"] == "selector_fixtures:Cycle"
    assert rec["sha256"] == file_sha256(REPO / "tests" / "selector_fixtures.py")
    assert rec["params"] == {"policies": cycle} and rec["policies"] == list(CATALOGUE)
    assert rec["choices"]["srcc"] == {"least_loaded": 4, "cloud": 4, "min_latency": 4}


def test_a_window_of_two_report_intervals_decides_every_second():
    plan = _plan({"use": "selector_fixtures:by_index"}, aset={
        "selector": {"use": "selector_fixtures:by_index", "policies": ["closest", "cloud"]}, "window": "1s"})
    by_window = _policy_by_window(simulate(plan).sim.records())
    # 1 s windows: report-interval windows 0, 1 on the initial closest; then cloud, closest, ...
    _assert_follows(by_window, lambda w: "closest" if w < 2 else ["closest", "cloud"][(w // 2 - 1) % 2])


# -- plan-time errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("selector, says", [
    ({"use": "no_such_pkg.sel:f"}, "module 'no_such_pkg' is not found"),
    ({"use": "selector_fixtures:missing"}, "has no attribute 'missing'"),
    ({"use": "selector_fixtures:NOT_CALLABLE"}, "a int, not a callable or a class with select"),
    ({"use": "selector_fixtures:NoSelect"}, "the class has no select(obs) method"),
    ({"use": "selector_fixtures:two_args"}, "its signature (obs, other)"),
    ({"use": "selector_fixtures:by_index", "params": {"nope": 1}}, "cannot be called so"),
    ({"use": "selector_fixtures:out_of_range"}, f"returned 99, neither an index in [0, {len(CATALOGUE)})"),
    ({"use": "selector_fixtures:Cycle", "params": {"policies": ["warp"]}}, "returned 'warp'"),
    ({"use": "selector_fixtures:FailsAt", "params": {"at": 0}}, "raised ZeroDivisionError"),
])
def test_a_bad_selector_is_a_plan_error_naming_it(selector, says, tmp_path, capsys):
    plan = _plan(selector)
    with pytest.raises(SelectorError) as err:
        check_agents(plan)  # the pre-check of testbed plan and testbed run
    assert selector["use"] in str(err.value) and says in str(err.value)
    with pytest.raises(SelectorError):
        simulate(plan)
    exp = tmp_path / "exp.yaml"
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(policy="aset", aset={"selector": selector})
    data["topology"]["source"] = str(TRIANGLE.parent / data["topology"]["source"])
    exp.write_text(yaml.safe_dump(data))
    assert cli_main(["plan", str(exp)]) == EXIT_INPUT
    assert selector["use"] in capsys.readouterr().out  # the CLI prints its errors on stdout


@pytest.mark.parametrize("aset, says", [
    ({"selector": {"use": "a.b:c", "sb3": "m.zip"}}, "exactly one of use"),
    ({"selector": {"sb3": "m.zip", "params": {"x": 1}}}, "params: only with use"),
    ({"selector": {"use": "not a path"}}, "selector.use"),
    ({"selector": {"use": "a.b:c"}, "checkpoint": "models/aset/general"}, "replaces the checkpoint"),
    ({"selector": {"use": "a.b:c", "policies": ["closest", "closest"]}}, "listed twice"),
])
def test_a_malformed_selector_entry_is_refused_on_load(aset, says):
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(policy="aset", aset=aset)
    with pytest.raises(ValueError) as err:
        Experiment.model_validate(data)
    assert says in str(err.value)


def test_a_selector_window_off_the_report_interval_is_refused():
    plan = _plan({"use": "selector_fixtures:by_index"},
                 aset={"selector": {"use": "selector_fixtures:by_index"}, "window": "750ms"})
    with pytest.raises(SelectorError, match=r"aset.window 750 ms: .* whole number .* \(500 ms\)"):
        check_agents(plan)


# -- run-time failure -------------------------------------------------------------------------------

def test_a_selector_raising_mid_run_stops_the_simulation_naming_it(tmp_path, capsys):
    plan = _plan({"use": "selector_fixtures:FailsAt", "params": {"at": 3}})
    check_agents(plan)  # its first call passes
    with pytest.raises(SelectorFailed) as err:
        simulate(plan)
    msg = str(err.value)
    assert err.value.exit_code == EXIT_COMPONENT_DIED
    assert "aset.selector selector_fixtures:FailsAt (source srca, window 3): raised ZeroDivisionError" in msg
    assert "Traceback" in msg and "selector_fixtures.py" in msg and "1 // 0" in msg
    exp = tmp_path / "exp.yaml"
    data = yaml.safe_load(TRIANGLE.read_text())
    data.update(policy="aset", aset={"selector": {"use": "selector_fixtures:FailsAt", "params": {"at": 3}}})
    data["topology"]["source"] = str(TRIANGLE.parent / data["topology"]["source"])
    exp.write_text(yaml.safe_dump(data))
    assert cli_main(["simulate", str(exp), "--runs-dir", str(tmp_path / "runs")]) == EXIT_COMPONENT_DIED
    assert "FailsAt" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_emulation_selector_uses_the_same_driver_and_raises_the_same(tmp_path):
    """The source process's selector (SourceSelector, built from the JSON config testbed.emu.lifecycle writes)
    decides as the simulator's and raises SelectorFailed the same way."""
    plan = _plan({"use": "selector_fixtures:FailsAt", "params": {"at": 2}})
    cfg = SourceConfig.model_validate_json(SourceConfig.from_plan(plan, "srca", 0, 6.0, tmp_path).model_dump_json())
    cfg = cfg.model_copy(update={"records": ""})
    sel = SourceSelector(cfg)
    state = {"arrivals": {}, "clusters": {}, "path_util": {}, "resolved": [], "policy": "closest"}
    assert sel.choose(state) == "closest" and sel.choose(state) == "closest"
    with pytest.raises(SelectorFailed, match="FailsAt .source srca, window 2.: raised ZeroDivisionError"):
        sel.choose(state)


# -- Stable-Baselines3 --------------------------------------------------------------------------------

def _sb3_model(tmp_path: Path, experiment: Path, policies: tuple[str, ...] = CATALOGUE) -> Path:
    """An (untrained) SB3 DQN on testbed/AsetSim-v0's spaces for one source row of ``experiment``."""
    import gymnasium
    from stable_baselines3 import DQN

    import testbed.aset  # noqa: F401 - registers the env

    env = gymnasium.make("testbed/AsetSim-v0", experiment=str(experiment), episode_s=1.0).unwrapped
    row = gymnasium.spaces.Box(0.0, float(env.spec_obs.clip), (env.obs_size,), np.float32)

    class OneRow(gymnasium.Env):
        observation_space, action_space = row, gymnasium.spaces.Discrete(len(policies))

    model = DQN("MlpPolicy", OneRow(), policy_kwargs={"net_arch": [16]}, seed=1, device="cpu")
    path = tmp_path / "dqn.zip"
    model.save(str(path))
    return path


def test_sb3_model_drives_the_simulator(tmp_path):
    pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is the optional extra 'peer' "
                                                    "(pip install -e '.[peer]')")
    model = _sb3_model(tmp_path, TRIANGLE)
    out = simulate(_plan({"sb3": str(model)}))
    assert out.selector["kind"] == "sb3" and out.selector["sha256"] == file_sha256(model)
    assert out.selector["algorithm"] == "DQN" and out.selector["version"]
    chosen = {p for c in out.selector["choices"].values() for p in c}
    assert chosen <= set(CATALOGUE) and sum(out.selector["choices"]["srca"].values()) == 12
    by_window = _policy_by_window(out.sim.records())
    assert all(len(p) == 1 for p in by_window.values())  # one policy per (source, window), as decided


def test_sb3_model_of_other_spaces_is_a_plan_error(tmp_path):
    pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is the optional extra 'peer' "
                                                    "(pip install -e '.[peer]')")
    model = _sb3_model(tmp_path, TRIANGLE)
    with pytest.raises(SelectorError, match=rf"its action space has {len(CATALOGUE)} actions, the policy list 2"):
        check_agents(_plan({"sb3": str(model), "policies": ["closest", "cloud"]}))
    other = REPO / "experiments" / "scenario-capacity.yaml"
    data = yaml.safe_load(other.read_text())
    data.update(policy="aset", aset={"selector": {"sb3": str(model)}})
    plan = build_plan(Experiment.model_validate(data), base_dir=other.parent)
    with pytest.raises(SelectorError, match=r"takes observations of shape \(\d+,\), this experiment's are"):
        check_agents(plan)
    with pytest.raises(SelectorError, match="no such file"):
        check_agents(_plan({"sb3": str(tmp_path / "missing.zip")}))
    (tmp_path / "cut.zip").write_bytes(model.read_bytes()[:200])
    with pytest.raises(SelectorError, match=r"DQN.load\(.*cut.zip\) failed"):
        check_agents(_plan({"sb3": str(tmp_path / "cut.zip")}))


# -- the emulation ----------------------------------------------------------------------------------

@pytest.mark.emulation
@pytest.mark.skipif(os.geteuid() != 0, reason="emulation needs root")
@pytest.mark.skipif(shutil.which("mn") is None, reason="needs Mininet")
def test_class_selector_drives_real_sources(tmp_path):
    """testbed run of the triangle with a class selector: every source's records follow its
    decisions window by window (the policy column), run.json records it, and a selector that
    raises stops the run with exit code 4 and its traceback in the source's log."""
    cycle = ["least_loaded", "cloud", "min_latency"]
    exp = tmp_path / "exp.yaml"
    data = yaml.safe_load(TRIANGLE.read_text())
    data["topology"]["source"] = str(TRIANGLE.parent / data["topology"]["source"])
    data.update(policy="aset", duration="8s",
                aset={"selector": {"use": "selector_fixtures:Cycle", "params": {"policies": cycle}}})
    exp.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(exp), "--runs-dir", str(tmp_path / "ok")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = next((tmp_path / "ok").iterdir())
    assert json.loads((run_dir / "run.json").read_text())["selector"]["use"] == "selector_fixtures:Cycle"
    for f in sorted((run_dir / "sources").glob("*.records.csv")):
        rec = pd.read_csv(f)
        assert set(rec["policy"]) <= {"closest", *cycle} and set(cycle) <= set(rec["policy"]), set(rec["policy"])
        rep = json.loads(f.with_suffix(".aset.json").read_text())
        assert set(rep["choices"]) == set(cycle) and max(rep["choices"].values()) - min(rep["choices"].values()) <= 1

    data["aset"] = {"selector": {"use": "selector_fixtures:FailsAt", "params": {"at": 3}}}
    exp.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(exp), "--runs-dir", str(tmp_path / "bad")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == EXIT_COMPONENT_DIED, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = "".join(f.read_text() for f in (tmp_path / "bad").glob("*/logs/source-*.log"))
    assert "FailsAt" in logs and "ZeroDivisionError" in logs and "Traceback" in logs, logs[-2000:]
