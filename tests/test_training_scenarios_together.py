"""The training scenarios of an ASET config are checked together before anything is trained or written:
one shape for all, one name per scenario, a baseline mix that fits each scenario file and is not empty;
each refusal names the file. Fast: no training step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from triangle_inputs import scenario

from testbed.spec.experiment import ConfigError

REPO = Path(__file__).resolve().parent.parent
TRIANGLE = REPO / "experiments" / "triangle.yaml"


def _aset_cfg(tmp_path: Path, scenarios: list[Path], **reward):
    from testbed.spec.aset import AsetConfig

    return AsetConfig.model_validate({"name": "t", "reward": reward, "training": {
        "scenarios": [str(s) for s in scenarios], "steps": 1, "episode": "2s", "out_dir": str(tmp_path / "out")}})


def test_training_scenarios_of_another_shape_are_refused_before_anything_is_written(tmp_path):
    from testbed.aset.dqn import train_seeds

    a = scenario(tmp_path / "exp", "a")
    b = scenario(tmp_path / "exp", "b", name="tri3", extra_source=True)
    cfg = _aset_cfg(tmp_path, [a, b])
    with pytest.raises(ConfigError) as err:
        train_seeds(cfg, tmp_path, steps=1)
    msg = str(err.value)
    assert str(a) in msg and str(b) in msg
    assert "sources srca, srcb, srcc (the first: srca, srcc)" in msg and "applications" in msg
    assert not (tmp_path / "out").exists()  # no checkpoints, no TensorBoard folder


def test_two_training_scenarios_of_one_name_are_refused_naming_both_files(tmp_path):
    from testbed.aset.dqn import train_seeds

    a = scenario(tmp_path / "exp", "a")
    a2 = scenario(tmp_path / "exp", "a2", **{"rate_qps: 4": "rate_qps: 6"})
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


def test_an_empty_baseline_mix_is_refused_naming_the_config_file(tmp_path):
    from testbed.spec.aset import load_aset_config

    cfg = tmp_path / "experiments" / "aset.yaml"
    cfg.parent.mkdir()
    cfg.write_text("name: t\nreward: {baseline: closest, baseline_mix: {}}\n")
    with pytest.raises(ConfigError, match=rf"{cfg}: invalid ASET config\n  reward.baseline_mix: \{{\}} names no "
                                          r"scenario, so it would change nothing"):
        load_aset_config(cfg)
