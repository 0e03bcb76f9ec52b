"""ASET on counterfactual rollout targets (testbed/aset/rollout.py, ``training.method: rollout``).

The scenario (as in tests/test_aset_oracle.py, with a second source): the triangle, sources at A
and C, a fast edge at B and a small cloud behind C; at 1.5 s the link A-B gets 40 ms of delay, so
``closest`` is best before and ``cloud`` after for the source at A. 3 s, 6 decision windows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from testbed.aset.episode import Episode
from testbed.spec.aset import load_aset_config
from testbed.spec.experiment import ConfigError

REPO = Path(__file__).resolve().parent.parent
ACTIONS = ["closest", "cloud", "least_loaded"]
PLAN = ["closest", "least_loaded"]  # srca, srcc


def _scenario(folder: Path) -> Path:
    """experiments/triangle.yaml with the cloud cluster, load and link event of the module docstring."""
    d = yaml.safe_load((REPO / "experiments" / "triangle.yaml").read_text())
    d.pop("emulation")
    d.update(name="switch2", duration="3s", report_interval="500ms",
             cloud={"attach_to": "C", "delay": "1ms", "bandwidth": "1Gbit/s"},
             events=[{"at": "1500ms", "kind": "link_delay", "link": ["A", "B"], "delay": "40ms"}])
    d["topology"]["source"] = str(REPO / "topologies" / "triangle.yaml")
    d["clusters"][1] = {"name": "cloudc", "site": "cloud", "tier": "cloud", "cpu_cores": 0.15, "workers": 1,
                        "queue_limit": 64, "models": ["digits_large"]}
    d["applications"][0]["deadline"] = "28ms"
    d["workload"][0]["rate_qps"] = 30
    path = folder / "switch2.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def _config(root: Path, **rollout) -> Path:
    """An ASET config of method rollout under ``root/experiments`` (its base folder is ``root``)."""
    (root / "experiments").mkdir(parents=True, exist_ok=True)
    scenario = _scenario(root / "experiments")
    d = {"name": "ro", "seed": 1, "actions": ACTIONS,
         "observation": {"window": "500ms", "plans": {"switch2": PLAN}},
         "agent": {"hidden": [16, 16], "learning_rate": 0.003, "plan_margin": 0.02},
         "training": {"method": "rollout", "scenarios": [str(scenario)], "seeds": [1, 2], "episode": "3s",
                      "out_dir": str(root / "runs"), "export_to": str(root / "models" / "ro"),
                      "randomise": {"load_scale": [0.9, 1.1]},
                      "rollout": {"horizon_windows": 2, "episodes_per_scenario": 3, "epochs": 30, "batch_size": 16,
                                  "validation_fraction": 0.34, "workers": 1, **rollout}}}
    path = root / "experiments" / "ro.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(config, base, one episode's data, its task)."""
    from testbed.aset.rollout import data_tasks, episode_data

    cfg, base = load_aset_config(_config(tmp_path_factory.mktemp("rollout")))
    task = data_tasks(cfg, base, 1)[0]
    return cfg, base, episode_data(*task), task


def test_the_base_action_has_target_zero_and_deviations_have_real_targets(setup):
    _, _, d, _ = setup
    rows = np.arange(len(d["targets"]))
    assert len(rows) == 6 * 2  # 6 windows x 2 sources, every window has queries
    assert (d["targets"][rows, d["plan"]] == 0).all()
    assert list(d["plan"][:2]) == [ACTIONS.index(p) for p in PLAN]
    assert np.abs(d["targets"]).max() > 0.05  # the deviations change things, in both directions
    assert (d["targets"] > 0).any() and (d["targets"] < 0).any()
    assert d["obs"].shape == (12, 4 + 2 * 8 + 1 + 3 + 2 + 3) and d["queries"].min() > 10


def test_a_target_is_what_two_whole_runs_from_scratch_give(setup):
    """target(w, i, a) = (successes of the queries created in [w, w + H) in a run whose source i is on a
    in window w and on its plan otherwise - the same in the plan's run) / those queries: recomputed
    from two episodes run from the start, without any clone."""
    from testbed.aset.envs import AsetSimEnv
    from testbed.aset.rollout import _sampler

    cfg, _, d, task = setup
    env = AsetSimEnv(_sampler(task[1], (0.9, 1.1)), cfg.observation, 3.0, policies=tuple(ACTIONS))
    env.reset(seed=task[2])
    assert int(d["sim_seed"]) == env.ep.seed
    h = cfg.training.rollout.horizon_windows

    def run(schedule: list[list[str]]) -> Episode:
        ep = Episode(env.plan, env.ep.seed, dict(zip(["srca", "srcc"], PLAN, strict=True)), 0.5, 3.0)
        for policies in schedule:
            ep.set_policies(policies)
            ep.step()
        ep.finish()
        return ep

    base = run([PLAN] * 6)
    checked = 0
    for row in np.flatnonzero(np.abs(d["targets"]).max(1) > 0)[:3]:
        w, i = int(d["window"][row]), int(d["source"][row])
        a = int(np.argmax(np.abs(d["targets"][row])))
        dev = [list(PLAN) for _ in range(6)]
        dev[w][i] = ACTIONS[a]
        other = run(dev)
        n = int(base.n[w:w + h].sum())
        assert int(other.n[w:w + h].sum()) == n == int(d["queries"][row])
        want = (int(other.ok[w:w + h].sum()) - int(base.ok[w:w + h].sum())) / n
        assert d["targets"][row, a] == pytest.approx(want, abs=1e-7) and want != 0
        checked += 1
    assert checked == 3


def test_the_data_is_deterministic_per_seed(setup):
    from testbed.aset.rollout import data_tasks, episode_data

    cfg, base, d, task = setup
    again = episode_data(*task)
    for k in ("obs", "targets", "queries", "window", "source", "plan", "sim_seed"):
        assert np.array_equal(again[k], d[k]), k
    other = data_tasks(cfg, base, 2)[0]
    assert other[2] != task[2] and not np.array_equal(episode_data(*other)["targets"], d["targets"])


def test_with_a_behaviour_epsilon_the_episode_leaves_the_plan_and_targets_stay_paired(setup):
    from testbed.aset.rollout import data_spec, episode_data

    cfg, _, _, task = setup
    ro = cfg.training.rollout.model_copy(update={"behaviour_epsilon": 0.9})
    spec = data_spec(cfg.model_copy(update={"training": cfg.training.model_copy(update={"rollout": ro})}))
    d = episode_data(spec, task[1], task[2])
    rows = np.arange(len(d["targets"]))
    assert (d["targets"][rows, d["plan"]] == 0).all()
    current = d["obs"][:, -(2 * 3 + 2):-(3 + 2)].argmax(1)  # the current-policy one-hot (window 0: closest)
    assert (current[2:] != d["plan"][2:]).any()


def test_the_determinism_check_covers_the_windows_the_episode_followed_its_plan_through():
    """With a behaviour epsilon the check still runs, at each window from which the episode kept
    its plan until the window's queries were resolved (horizon 2, settle 1 window here)."""
    from testbed.aset.rollout import _checkable

    left = np.array([False, False, True, False, False, False])
    ends = [min(6, w + 2) for w in range(6)]
    assert _checkable(left, ends, 1).tolist() == [3, 4, 5]
    assert _checkable(np.zeros(6, bool), ends, 1).tolist() == list(range(6))  # epsilon 0: every window


def test_a_clone_that_does_not_continue_as_the_episode_is_caught_with_a_behaviour_epsilon(setup, monkeypatch):
    import testbed.aset.rollout as ro_mod
    from testbed.aset.rollout import data_spec, episode_data

    cfg, _, _, task = setup
    ro = cfg.training.rollout.model_copy(update={"behaviour_epsilon": 0.1})
    spec = data_spec(cfg.model_copy(update={"training": cfg.training.model_copy(update={"rollout": ro})}))
    episode_data(spec, task[1], task[2])  # the real clones pass
    real = ro_mod.continuation_ok

    def off_by_one(ep, w, horizon, base, first):  # a base clone that scores one success too many
        return real(ep, w, horizon, base, first) + (list(first) == list(base))

    monkeypatch.setattr(ro_mod, "continuation_ok", off_by_one)
    with pytest.raises(AssertionError, match="the base's clone from window"):
        episode_data(spec, task[1], task[2])


def test_a_damaged_cache_file_is_a_miss_and_one_episode_per_scenario_cannot_be_fitted(setup, tmp_path):
    from testbed.aset.rollout import RolloutData, _load, _save, fit

    cfg, _, d, _ = setup
    good = tmp_path / "good.npz"
    _save(good, d)
    assert _load(good) is not None and not list(tmp_path.glob(".*.tmp"))
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:200])
    _save(tmp_path / "old.npz", {k: v for k, v in d.items() if k != "targets"})
    for name in ("empty", "cut", "old"):
        assert _load(tmp_path / f"{name}.npz") is None, name
    with pytest.raises(ValueError, match="nothing can be held out"):
        fit(RolloutData.join([d]), cfg, 1)


def test_fitting_lowers_the_loss_and_holds_out_whole_episodes(setup):
    from testbed.aset.rollout import RolloutData, collect, fit

    cfg, base, _, _ = setup
    data = collect(cfg, base, [1], progress=False)[1]
    assert isinstance(data, RolloutData) and len(data) == 3 * 12
    train, val = data.split(0.34, 1)
    assert len(set(data.episode[val])) == 1 and not set(data.episode[val]) & set(data.episode[train])
    res = fit(data, cfg, 1)
    first, best = res.epochs[0], res.epochs[res.best_epoch - 1]
    assert len(res.epochs) == 30 and res.epochs[-1]["train_loss"] < 0.5 * first["train_loss"]
    assert best["val_loss"] <= first["val_loss"] and res.validation["all"]["samples"] == 12
    assert set(res.validation) == {"all", "switch2"}


def test_train_command_exports_a_policy_that_acts_by_the_plan_rule_and_reuses_its_data(tmp_path, capsys):
    from testbed.agent.npolicy import NumpyPolicy
    from testbed.aset.rollout import decide
    from testbed.cli.main import main

    path = _config(tmp_path)
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    assert "seed 1: 36 samples of 3 episodes" in out and "seed 2: " in out
    pol = NumpyPolicy(tmp_path / "models" / "ro")
    assert pol.plan_margin == 0.02 and pol.meta["provenance"]["method"] == "rollout" and pol.obs_size == 29
    cache = sorted((tmp_path / "runs" / "rollout-cache").glob("*.npz"))
    assert len(cache) == 6  # 3 episodes x 2 seeds
    z = np.load(cache[0])
    q = pol.q_values(z["obs"])
    assert (pol.act(z["obs"]) == decide(q, z["obs"], 0.02)).all()
    assert (decide(q, z["obs"], 100.0) == z["plan"]).all()  # a huge margin: always the plan
    for f in ("curves.png", "seed-1/curve.png", "seed-2/epochs.csv", "seed-2/rollout.json", "seed-1/policy.npz",
              "seed-2/data.npz"):
        assert (tmp_path / "runs" / "ro" / f).is_file(), f
    from testbed.aset.rollout import RolloutData

    kept = RolloutData.load(tmp_path / "runs" / "ro" / "seed-1" / "data.npz")
    assert len(kept) == 36 and kept.targets.shape == (36, 3) and kept.wall_s > 0
    mtimes = [f.stat().st_mtime_ns for f in cache]
    assert main(["train", str(path)]) == 0  # the same data, from the cache
    assert [f.stat().st_mtime_ns for f in cache] == mtimes
    assert main(["train", str(path), "--steps", "5"]) == 2
    assert "--steps: the DQN's" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("change", "message"), [
    ({"horizon_windows": 0}, "training.rollout.horizon_windows: Input should be greater than or equal to 1"),
    ({"episodes_per_scenario": 1}, "training.rollout.episodes_per_scenario: Input should be greater than or equal"),
    ({"validation_fraction": 1.0}, "training.rollout.validation_fraction: Input should be less than 1"),
    ({"behaviour_epsilon": -0.1}, "training.rollout.behaviour_epsilon: Input should be greater than or equal to 0"),
    ({"epochs": "many"}, "training.rollout: epochs: expected an integer, got the string 'many'"),
    ({"horizon": 2}, "training.rollout.horizon: unknown key"),
])
def test_bad_rollout_settings_are_refused_naming_the_key(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_aset_config(_config(tmp_path, **change))


def test_a_rollout_config_needs_plans_and_is_not_trained_by_the_dqn(tmp_path):
    from testbed.aset.dqn import train_seeds

    path = _config(tmp_path)
    d = yaml.safe_load(path.read_text())
    cfg, base = load_aset_config(path)
    with pytest.raises(ValueError, match="training.method is rollout, not dqn"):
        train_seeds(cfg, base)
    d["training"]["method"] = "sarsa"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=r"training.method: Input should be 'dqn' or 'rollout'"):
        load_aset_config(path)
    d["training"]["method"] = "rollout"
    del d["observation"]["plans"]
    del d["agent"]["plan_margin"]
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match="training.method: rollout needs observation.plans"):
        load_aset_config(path)


@pytest.mark.parametrize(("method", "key", "value"), [
    ("rollout", "steps", 32000), ("rollout", "checkpoint_every", 8000), ("rollout", "rollout_workers", 2),
    ("dqn", "rollout", {"horizon_windows": 3}),
])
def test_a_training_key_of_the_other_method_is_refused_naming_it(tmp_path, method, key, value):
    path = _config(tmp_path)
    d = yaml.safe_load(path.read_text())
    d["training"].update({"method": method, key: value})
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=f"{key}: not used by training.method {method}"):
        load_aset_config(path)


@pytest.mark.parametrize(("key", "value"), [("gamma", 0.5), ("replay_size", 100_000), ("epsilon_decay_steps", 72_000),
                                          ("target_update_steps", 500)])
def test_a_dqn_only_agent_key_is_refused_by_the_rollout_method(tmp_path, key, value):
    """The rollout fit reads agent.hidden, learning_rate, huber_delta and plan_margin only: a DQN key
    set away from its default would be ignored (aset-rollout.yaml used to carry eight of them)."""
    path = _config(tmp_path)
    d = yaml.safe_load(path.read_text())
    d["agent"][key] = value
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=f"agent.{key}: not used by training.method rollout"):
        load_aset_config(path)
    d["training"] = {k: v for k, v in d["training"].items() if k not in ("method", "rollout")}
    d["agent"].pop("plan_margin")
    path.write_text(yaml.safe_dump(d))
    assert getattr(load_aset_config(path)[0].agent, key) == value  # the DQN's own key


def test_the_shipped_rollout_config_loads():
    cfg, _ = load_aset_config(Path(__file__).resolve().parent.parent / "experiments" / "aset-rollout.yaml")
    assert cfg.training.method == "rollout" and cfg.agent.plan_margin == 0.02


@pytest.mark.parametrize(("change", "message"), [
    ({"export_seed": 5}, "training.export_seed: 5 is not among the training seeds [1, 2]"),
    ({"seeds": [1, 1]}, "training.seeds: seed 1 given twice"),
    ({"episode": "1ms"}, "training.episode: 0.001 s is shorter than one decision window"),
])
def test_an_unrunnable_training_section_is_refused_on_load(tmp_path, change, message):
    path = _config(tmp_path)
    d = yaml.safe_load(path.read_text())
    d["training"].update(change)
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_aset_config(path)


def test_train_options_are_checked_before_anything_runs(tmp_path, capsys):
    from testbed.cli.main import main

    path = _config(tmp_path)
    assert main(["train", str(path), "--rollout-workers", "2"]) == 2
    assert main(["train", str(path), "--seeds", "3,3"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "--rollout-workers: the DQN's" in out and "training.seeds: seed 3 given twice" in out
    assert "pydantic" not in out and not (tmp_path / "runs").exists()
