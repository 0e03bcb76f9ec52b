"""Bad input to the ASET configuration, the Gymnasium entry point and the run's checkpoint check:
each refused with a message naming the item, before anything is built (no numpy, TensorFlow or
zipfile traceback from deep inside)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.spec.aset import load_aset_config
from testbed.spec.experiment import MAX_SEED, AsetSpec, ConfigError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "experiments" / "aset-tiny.yaml"
TRIANGLE = REPO / "experiments" / "triangle.yaml"
LIVE = REPO / "experiments" / "aset-live.yaml"


def _tiny(tmp_path: Path, **changes) -> Path:
    """experiments/aset-tiny.yaml with top-level ``changes`` (``training`` merged key by key), in
    ``tmp_path/experiments`` (so that its relative paths stay inside tmp_path)."""
    data = yaml.safe_load(TINY.read_text())
    training = changes.pop("training", None)
    data.update(changes)
    if training is not None:
        data["training"] = {**data["training"], **training}
    out = tmp_path / "experiments" / "aset-bad.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data))
    return out


# ------------------------------------------------------------------------------ 1. seeds

@pytest.mark.parametrize(("changes", "item"), [
    ({"seed": -1}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"seed": MAX_SEED + 1}, "seed"),
    ({"training": {"seeds": [-3]}}, "training.seeds.0"),
    ({"training": {"seeds": [1, 2**40]}}, "training.seeds.1"),
    ({"training": {"seeds": []}}, "training.seeds"),
    ({"training": {"seeds": [2**33], "export_seed": 2**33}}, "training.export_seed"),
])
def test_a_seed_out_of_range_or_no_seed_is_refused_naming_it(tmp_path, changes, item):
    path = _tiny(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_aset_config(path)
    text = str(err.value)
    assert str(path) in text and f"  {item}: " in text
    assert f"{MAX_SEED}" in text or "at least 1 item" in text or "greater than or equal to 0" in text


def test_the_seed_range_is_the_command_line_s(tmp_path):
    cfg = load_aset_config(_tiny(tmp_path, seed=MAX_SEED, training={"seeds": [0, MAX_SEED],
                                                                    "export_seed": MAX_SEED}))[0]
    assert cfg.seed == MAX_SEED and cfg.training.seeds == [0, MAX_SEED] and cfg.training.export_seed == MAX_SEED
    assert load_aset_config(_tiny(tmp_path, seed=0))[0].seed == 0


# ------------------------------------------------------------------------------ 2. make_sim_env

@pytest.mark.parametrize(("kwargs", "item"), [
    ({"bogus": 1}, "bogus: unknown key"),
    ({"history_windows": 0}, "history_windows: Input should be greater than or equal to 1"),
    ({"window_ms": "abc"}, "window_ms: 'abc'"),
    ({"rate_scale_qps": 0}, "rate_scale_qps: Input should be greater than 0"),
    ({"clip": -1}, "clip: Input should be greater than 0"),
    ({"window": "fast"}, "window"),
    ({"window": "1s", "window_ms": 500}, "give either 'window' or 'window_ms'"),
    ({"immediate_reward": "no"}, "immediate_reward: expected true or false, got 'no'"),
    ({"episode_s": "10s"}, "episode_s"),
    ({"episode_s": 0}, "episode_s: Input should be greater than 0"),
    ({"load_scale": (2.0, 1.0)}, "load_scale: need 0 < low <= high"),
    ({"experiment": []}, "experiment: List should have at least 1 item"),
    ({"experiment": 5}, "experiment"),
])
def test_make_sim_env_refuses_a_bad_keyword_naming_it(kwargs, item):
    from testbed.aset.envs import make_sim_env

    args = {"experiment": str(TRIANGLE), **kwargs}
    with pytest.raises(ConfigError, match="make_sim_env") as err:
        make_sim_env(**args)
    assert item in str(err.value)


def test_an_unknown_keyword_names_the_known_ones():
    from testbed.aset.envs import make_sim_env

    with pytest.raises(ConfigError, match=r"bogus: unknown key") as err:
        make_sim_env(str(TRIANGLE), bogus=1)
    assert "window, " in str(err.value) and "immediate_reward" in str(err.value)


def test_gymnasium_make_validates_its_keywords():
    import gymnasium

    import testbed.aset  # noqa: F401  (registers testbed/AsetSim-v0)

    with pytest.raises(ConfigError, match=r"history_windows"):
        gymnasium.make("testbed/AsetSim-v0", experiment=str(TRIANGLE), history_windows=0)


def test_an_observation_override_takes_the_unit_forms_and_keeps_the_rest():
    from testbed.aset.envs import make_sim_env

    env = make_sim_env(str(TRIANGLE), window="1s", rtt_scale="50ms", immediate_reward=True)
    assert env.spec_obs.window_ms == 1000.0 and env.dt == 1.0 and env.spec_obs.rtt_scale_ms == 50.0
    assert env.spec_obs.history_windows == 4 and env.immediate is True
    assert make_sim_env(Path(TRIANGLE), window_ms=1500, config=Path(TINY)).spec_obs.window_ms == 1500.0


@pytest.mark.parametrize("window", [{"window": "300ms"}, {"window_ms": 750}])
def test_a_window_off_the_report_interval_fails_in_make_sim_env_not_at_reset(window):
    from testbed.aset.envs import make_sim_env

    with pytest.raises(ConfigError, match=rf"{TRIANGLE}: triangle: the decision window .* whole multiple .* report "
                                          r"interval 500 ms"):
        make_sim_env(str(TRIANGLE), **window)


# ------------------------------------------------------------------------------ 3. the run's checkpoint check

@pytest.fixture(scope="module")
def live_plan():
    from testbed.plan.build import plan_experiment

    return plan_experiment(LIVE)


def _with_aset(plan, **aset):
    exp = plan.experiment.model_copy(update={"aset": AsetSpec.model_validate(aset)})
    return plan.model_copy(update={"experiment": exp})


def _check_aset(plan) -> str:
    """The message of the ASET pre-check of ``testbed plan`` and of ``testbed run`` before
    bring-up (an InputError, exit code 2)."""
    from testbed.agent.live import check_agents
    from testbed.core.errors import EXIT_INPUT, InputError

    with pytest.raises(InputError) as err:
        check_agents(plan)
    assert err.value.exit_code == EXIT_INPUT
    return str(err.value)


def test_the_shipped_live_experiment_passes_the_check(live_plan):
    from testbed.agent.live import check_agents

    assert check_agents(live_plan)["checkpoint"] == "models/aset/aset"


@pytest.mark.parametrize(("aset", "given"), [({"window": "300ms"}, 300), ({"window": "1s"}, 1000)])
def test_a_window_other_than_the_checkpoint_s_fails_before_bring_up(live_plan, aset, given):
    msg = _check_aset(_with_aset(live_plan, checkpoint="models/aset/aset", **aset))
    assert f"aset.window {given} ms differs from the checkpoint's window 500 ms" in msg
    assert "set aset.window to 500ms" in msg


def test_no_window_takes_the_checkpoints(live_plan):
    """aset.window defaulted to 100 ms, a window no shipped checkpoint has, so leaving it out
    failed the check; it now means the checkpoint's own."""
    from testbed.agent.live import check_agents

    plan = _with_aset(live_plan, checkpoint="models/aset/aset")
    assert plan.experiment.aset.window_s is None
    assert check_agents(plan)["window_s"] == 0.5


def test_testbed_plan_refuses_a_checkpoint_that_testbed_run_would(tmp_path, capsys):
    """A reviewer's find (Dec 4): `testbed plan` passed an experiment whose ASET checkpoint did not
    exist; only `testbed run` refused it."""
    import yaml

    from testbed.cli.main import main

    data = yaml.safe_load((REPO / "experiments" / "aset-live.yaml").read_text())
    data["aset"] = {**data.get("aset", {}), "checkpoint": str(tmp_path / "nope")}
    data["topology"]["source"] = str((REPO / "experiments" / data["topology"]["source"]).resolve()) \
        if not str(data["topology"]["source"]).startswith("topohub:") else data["topology"]["source"]
    f = tmp_path / "ck.yaml"
    f.write_text(yaml.safe_dump(data))
    assert main(["plan", str(f)]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'nope'}.npz" in said and "missing" in said
    import os

    os.mkfifo(tmp_path / "fifo.npz")
    (tmp_path / "fifo.json").write_text("{}")
    data["aset"]["checkpoint"] = str(tmp_path / "fifo")
    f.write_text(yaml.safe_dump(data))
    assert main(["plan", str(f)]) == 2
    assert f"ASET checkpoint file {tmp_path / 'fifo.npz'} is not a regular file" in " ".join(
        capsys.readouterr().out.split())
    assert main(["plan", str(REPO / "experiments" / "aset-live.yaml")]) == 0


def test_a_truncated_checkpoint_fails_before_bring_up_naming_it(live_plan, tmp_path):
    shutil.copy(REPO / "models" / "aset" / "aset.json", tmp_path / "cut.json")
    (tmp_path / "cut.npz").write_bytes((REPO / "models" / "aset" / "aset.npz").read_bytes()[:500])
    msg = _check_aset(_with_aset(live_plan, checkpoint=str(tmp_path / "cut"), window="500ms"))
    assert "cut" in msg and "Traceback" not in msg


def test_a_checkpoint_with_a_bad_observation_spec_is_named(live_plan, tmp_path):
    import json

    meta = json.loads((REPO / "models" / "aset" / "aset.json").read_text())
    meta["observation"]["clip"] = -1
    shutil.copy(REPO / "models" / "aset" / "aset.npz", tmp_path / "bad.npz")
    (tmp_path / "bad.json").write_text(json.dumps(meta))
    msg = _check_aset(_with_aset(live_plan, checkpoint=str(tmp_path / "bad"), window="500ms"))
    assert str(tmp_path / "bad") in msg


def _triangle_checkpoint(path: Path) -> Path:
    """A checkpoint of the triangle's sources, applications and clusters (random weights)."""
    from testbed.agent.npolicy import export_policy
    from testbed.agent.observation import context_size
    from testbed.aset.envs import plan_contexts
    from testbed.model.policies import CATALOGUE
    from testbed.plan.build import plan_experiment
    from testbed.spec.aset import ObservationSpec

    spec = ObservationSpec()
    ctx = plan_contexts(plan_experiment(TRIANGLE), CATALOGUE, spec)[0]
    rng = np.random.default_rng(0)
    n = context_size(ctx, spec)
    ws = [rng.normal(size=(n, 8)).astype(np.float32), np.zeros(8, np.float32),
          rng.normal(size=(8, len(CATALOGUE))).astype(np.float32), np.zeros(len(CATALOGUE), np.float32)]
    return export_policy(ws, path, obs_spec=spec, applications=list(ctx.applications), clusters=list(ctx.clusters),
                         policies=list(CATALOGUE), sources=list(ctx.sources))


def test_a_checkpoint_of_another_topology_fails_before_bring_up_as_in_the_source(live_plan, tmp_path):
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.plan.boundaries import SourceConfig

    _triangle_checkpoint(tmp_path / "tri")
    plan = _with_aset(live_plan, checkpoint=str(tmp_path / "tri"), window="500ms")
    msg = _check_aset(plan)
    assert "(source " in msg and "differ from the checkpoint's ['edgeb', 'edgec'" in msg
    cfg = SourceConfig.from_plan(plan, "atl", 0, 1.0, tmp_path)  # the first source the pre-check checks
    with pytest.raises(ValueError) as err:
        LivePolicySelector(cfg)  # the same check in the source process, the same words
    assert str(err.value) in msg


def test_the_selector_and_the_pre_check_share_the_window_rule(live_plan, tmp_path):
    from testbed.agent.live import SourceSelector as LivePolicySelector
    from testbed.plan.boundaries import SourceConfig

    plan = _with_aset(live_plan, checkpoint="models/aset/aset", window="1s")
    cfg = SourceConfig.from_plan(plan, "atl", 0, 1.0, tmp_path)
    with pytest.raises(ValueError) as err:
        LivePolicySelector(cfg)
    assert str(err.value) in _check_aset(plan)


# ------------------------------------------------------------------------------ 4. per-scenario tables

def test_a_mix_for_no_training_scenario_is_refused_by_the_one_rule():
    from testbed.spec.aset import check_scenario_keys

    table = {"triangle": ["closest", "cloud"], "nosuch": ["cloud", "cloud"]}
    known = {"triangle": f"triangle ({TRIANGLE})"}
    with pytest.raises(ConfigError, match=rf"reward.baseline_mix.nosuch: no training scenario has that name "
                                          rf"\(known: triangle \({TRIANGLE}\)\)"):
        check_scenario_keys("reward.baseline_mix", table, known)
    check_scenario_keys("reward.baseline_mix", {"triangle": ["closest", "cloud"]}, known)
    check_scenario_keys("reward.baseline_mix", None, known)  # no table: nothing to check


def test_the_shipped_plan_config_names_only_its_training_scenarios():
    from testbed.spec.experiment import load_experiment

    cfg, base = load_aset_config(REPO / "experiments" / "aset-plan.yaml")
    from testbed.spec.aset import check_scenario_keys

    names = {load_experiment(base / s).name: s for s in cfg.training.scenarios}
    check_scenario_keys("reward.baseline_mix", cfg.reward.baseline_mix, names)
    check_scenario_keys("observation.plans", cfg.observation.plans, names)


def test_evaluation_duration_has_the_bound_of_the_command_line():
    """evaluation.duration: 10 h got past the 1 h bound that --duration enforces."""
    from testbed.spec.aset import MAX_EPISODE_S, AsetConfig

    with pytest.raises(ValueError, match=r"evaluation.duration_s\n  Input should be less than or equal to 3600"):
        AsetConfig.model_validate({"name": "t", "evaluation": {"scenarios": ["x"], "duration": "36000s"}})
    assert AsetConfig.model_validate({"name": "t", "evaluation": {"scenarios": ["x"], "duration": f"{MAX_EPISODE_S}s"}})


def test_testbed_plan_checks_every_file_of_experiments_aset_configs_included(tmp_path, capsys):
    """A docs reviewer's find (Dec 4): `testbed plan` "validates everything" but refused the four
    ASET configs in experiments/ with six 'Field required' errors. It now validates them as
    `testbed train` does before training, and still names a bad item."""
    from testbed.cli.main import main

    for f in sorted((REPO / "experiments").glob("*.yaml")):
        assert main(["plan", str(f)]) == 0, f
    said = " ".join(capsys.readouterr().out.split())
    assert ("aset-tiny.yaml: an ASET config (aset-tiny), valid: 1 training scenario(s) planned and checked together, "
            "1 evaluation scenario(s) planned") in said
    bad = tmp_path / "aset-bad.yaml"
    bad.write_text((REPO / "experiments" / "aset-tiny.yaml").read_text() + "\nbogus_key: 1\n")
    assert main(["plan", str(bad)]) == 2
    assert "bogus_key" in capsys.readouterr().out
